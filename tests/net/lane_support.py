"""Raw loopback clients and guests for the native lane's tests (`test_native_lane`)."""

from __future__ import annotations

import re
import socket
import struct
import time
from pathlib import Path

from tests.support import function_dir


def frame_wat(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> tuple[str, int]:
    """A guest response frame as a WAT data string, and its length."""
    raw = struct.pack("<II", status, len(headers))
    for k, v in headers:
        raw += struct.pack("<I", len(k)) + k + struct.pack("<I", len(v)) + v
    raw += struct.pack("<I", len(body)) + body
    return "".join(f"\\{b:02x}" for b in raw), len(raw)


def static_reactor(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> str:
    """A reactor that answers the same frame to every request."""
    data, n = frame_wat(status, headers, body)
    return f"""(module
  (memory (export "memory") 1)
  (data (i32.const 16) "{data}")
  (func (export "edgefn_alloc") (param i32) (result i32) (i32.const 8192))
  (func (export "edgefn_handle") (param $p i32) (param $n i32) (result i64)
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const {n}))))
"""


# answers 200 with the encoded request it was given as its body: what the guest saw
MIRROR = """(module
  (memory (export "memory") 4)
  (data (i32.const 0) "\\c8\\00\\00\\00\\01\\00\\00\\00\\0c\\00\\00\\00content-type\\18\\00\\00\\00application/octet-stream")
  (func (export "edgefn_alloc") (param $n i32) (result i32) (i32.const 1024))
  (func (export "edgefn_handle") (param $p i32) (param $n i32) (result i64)
    (local $o i32)
    (local.set $o (i32.add (i32.const 1024) (local.get $n)))
    (memory.copy (local.get $o) (i32.const 0) (i32.const 52))
    (i32.store align=1 (i32.add (local.get $o) (i32.const 52)) (local.get $n))
    (memory.copy (i32.add (local.get $o) (i32.const 56)) (local.get $p) (local.get $n))
    (i64.or (i64.shl (i64.extend_i32_u (local.get $o)) (i64.const 32))
            (i64.extend_i32_u (i32.add (local.get $n) (i32.const 56))))))
"""

TRAP = """(module
  (memory (export "memory") 1)
  (func (export "edgefn_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "edgefn_handle") (param i32 i32) (result i64) unreachable))
"""


def guests(root: Path) -> list[Path]:
    """The function folders the differential tests deploy on both PoPs."""
    odd = static_reactor(299, [(b"Date", b"Mon, 01 Jan 2001 00:00:00 GMT"),
                               (b"X-Edgefn-Error", b"trap"), (b"Cache-Tag", b"t1"),
                               (b"x-request-id", b"mine"), (b"Content-Length", b"999"),
                               (b"Connection", b"close"), (b"X-Custom", b"A b"),
                               (b"keep-alive", b"x")], b"odd body")
    return [
        function_dir(root, "mirror", MIRROR),
        function_dir(root, "odd", odd),
        function_dir(root, "nobody", static_reactor(204, [(b"x-a", b"1")], b"zz")),
        function_dir(root, "reset", static_reactor(205, [], b"abc")),
        function_dir(root, "teapot", static_reactor(418, [(b"content-type", b"text/plain")],
                                                     b"short and stout")),
        function_dir(root, "cached", static_reactor(200, [(b"Cache-Control", b"max-age=60")],
                                                     b"keep me")),
        function_dir(root, "badframe", static_reactor(200, [(b"bad name", b"v")], b"x")),
        function_dir(root, "trap", TRAP),
    ]


def responses(data: bytes, methods: list[bytes], closed: bool = False
              ) -> tuple[list[bytes], bool]:
    """The whole responses in `data` (interim 1xx dropped), for requests of
    `methods` in order; and whether `data` ends with a whole one. A body framed by
    neither Content-Length nor chunked runs to the close (a stream to HTTP/1.0):
    whole once the server `closed` the connection."""
    out: list[bytes] = []
    pos = 0
    while pos < len(data):
        end = data.find(b"\r\n\r\n", pos)
        if end < 0:
            return out, False
        head = data[pos:end + 4]
        status = int(head.split(b" ", 2)[1])
        if 100 <= status < 200:
            pos = end + 4
            continue
        m = re.search(rb"\r\ncontent-length: (\d+)\r\n", head)
        method = methods[len(out)] if len(out) < len(methods) else b"GET"
        if b"\r\ntransfer-encoding: chunked\r\n" in head and method != b"HEAD":
            last = data.find(b"\r\n0\r\n\r\n", end + 2)  # a streamed body's last chunk
            if last < 0:
                return out, False
            out.append(data[pos:last + 7])
            pos = last + 7
            continue
        bodiless = method == b"HEAD" or status in (204, 304)
        if m is None and not bodiless:  # to the close
            if not closed:
                return out, False
            out.append(data[pos:])
            return out, True
        size = int(m.group(1)) if m and not bodiless else 0
        if len(data) < end + 4 + size:
            return out, False
        out.append(data[pos:end + 4 + size])
        pos = end + 4 + size
    return out, True


def exchange(port: int, raw: bytes, methods: list[bytes], timeout: float = 10.0,
             cuts: tuple[int, ...] = (), gap: float = 0.03) -> list[bytes]:
    """Send `raw` on a new connection (in pieces cut at the offsets `cuts`, `gap`
    seconds apart, each its own segment: so many reads for the PoP); the responses,
    once one per method came or the server closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        at = 0
        try:
            for cut in sorted(set(cuts)):
                if at < cut < len(raw):
                    s.sendall(raw[at:cut])
                    at = cut
                    time.sleep(gap)
            s.sendall(raw[at:])
        except (BrokenPipeError, ConnectionResetError):  # it answered (a 400) and closed
            pass
        data = b""
        closed = False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got, whole = responses(data, methods)
            if whole and len(got) >= len(methods):
                break
            try:
                chunk = s.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                closed = True
                break
            data += chunk
    return responses(data, methods, closed)[0]


def to_the_close(port: int, raw: bytes, timeout: float = 5.0) -> bytes:
    """Send `raw` on a new connection; all the server writes until it closes it.
    Raises TimeoutError if it keeps the connection open past `timeout`."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(raw)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


def normal(response: bytes, prefix: bytes) -> bytes:
    """`response` without what differs between two PoPs: its date, the request id's
    per-process prefix, and a stored answer's age (whole seconds since each PoP
    stored it, milliseconds apart: read later, one had crossed a second the other
    had not, ``age: 26`` against ``age: 25``)."""
    response = re.sub(rb"\r\ndate: [^\r]*", b"\r\ndate: D", response, count=1)
    response = re.sub(rb"\r\nage: [0-9]+\r\n", b"\r\nage: A\r\n", response, count=1)
    return response.replace(prefix + b"-", b"RID-")
