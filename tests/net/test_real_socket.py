"""The HTTP front's limits over a real loopback socket, with `[http]` limits taken
from the PoP config (not the defaults): 414, 431 and the idle keep-alive close."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.net.server import ServerConfig
from tests.support import EXAMPLES, Running, pop_thread

MAX_URL = 300
MAX_HEADERS = 600
KEEPALIVE = 1.0
SWEEP = ServerConfig().sweep_interval  # how often the server looks at idle connections


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[Running]:
    """A PoP whose [http] limits are far below the defaults, serving `echo`."""
    with pop_thread(tmp_path / "data", **{
            "http.max_url_bytes": MAX_URL, "http.max_header_bytes": MAX_HEADERS,
            "http.keepalive_timeout": KEEPALIVE}) as pop:
        pop.deploy(EXAMPLES / "echo")
        yield pop


def read_response(sock: socket.socket, buf: bytearray) -> tuple[int, bytes, bytes]:
    """One response with a content-length body: (status, head, body). Bytes after it
    stay in `buf`."""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        assert data, f"connection closed mid-response: {bytes(buf)!r}"
        buf += data
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(rest) < length:
        data = sock.recv(65536)
        assert data, "connection closed mid-body"
        rest += data
    buf[:] = rest[length:]
    return int(head.split(b" ", 2)[1]), head, rest[:length]


def exchange(pop: Running, raw: bytes) -> tuple[int, bytes, bytes, bool]:
    """Send `raw` on a fresh connection: (status, head, body, closed right after)."""
    with socket.create_connection((pop.host, pop.port), timeout=5) as s:
        s.sendall(raw)
        buf = bytearray()
        status, head, body = read_response(s, buf)
        s.settimeout(KEEPALIVE / 2)  # well before the idle close
        try:
            closed = not buf and s.recv(1) == b""
        except TimeoutError:
            closed = False
    return status, head, body, closed


def get_with_target(target: bytes) -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: t\r\n\r\n"


def test_a_request_target_over_max_url_bytes_is_414_and_the_connection_closes(
        limited: Running) -> None:
    at_limit = b"/echo?" + b"q" * (MAX_URL - len(b"/echo?"))
    assert len(at_limit) == MAX_URL
    status, head, _, closed = exchange(limited, get_with_target(at_limit))
    assert status == 200 and b"x-echo-query: " + b"q" * 20 in head and not closed
    status, _, body, closed = exchange(limited, get_with_target(at_limit + b"q"))
    assert (status, body) == (414, b"request target longer than %d bytes\n" % MAX_URL)
    assert closed


def headers_of_size(size: int) -> bytes:
    """Header lines whose sizes (name + value + 4, as the limit counts them) sum to `size`."""
    host = b"Host: t\r\n"
    filler = size - len(host) - len(b"X-Fill: \r\n")
    return host + b"X-Fill: " + b"f" * filler + b"\r\n"


def test_headers_over_max_header_bytes_are_431_and_the_connection_closes(
        limited: Running) -> None:
    at_limit = b"GET /echo HTTP/1.1\r\n" + headers_of_size(MAX_HEADERS) + b"\r\n"
    status, _, _, closed = exchange(limited, at_limit)
    assert status == 200 and not closed
    over = b"GET /echo HTTP/1.1\r\n" + headers_of_size(MAX_HEADERS + 1) + b"\r\n"
    status, _, body, closed = exchange(limited, over)
    assert (status, body) == (431, b"request headers larger than %d bytes\n" % MAX_HEADERS)
    assert closed


def test_many_small_headers_add_up_to_431(limited: Running) -> None:
    each = len(b"X-H000") + len(b"v") + 4  # far below the limit each, over it together
    lines = b"".join(b"X-H%03d: v\r\n" % i for i in range(MAX_HEADERS // each + 1))
    status, _, _, closed = exchange(limited, b"GET /echo HTTP/1.1\r\nHost: t\r\n" + lines + b"\r\n")
    assert status == 431 and closed


def test_an_idle_keep_alive_connection_is_closed_after_keepalive_timeout(
        limited: Running) -> None:
    with socket.create_connection((limited.host, limited.port), timeout=KEEPALIVE * 4) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi")
        buf = bytearray()
        assert read_response(s, buf)[::2] == (200, b"hi")
        idle_since = time.monotonic()
        assert s.recv(1) == b"", "the server sent something instead of closing"
        closed_after = time.monotonic() - idle_since
    # closed by the sweeper at its first look past the deadline
    assert KEEPALIVE * 0.9 <= closed_after <= KEEPALIVE * 1.25 + SWEEP, closed_after


def test_a_connection_used_more_often_than_keepalive_timeout_stays_open(
        limited: Running) -> None:
    with socket.create_connection((limited.host, limited.port), timeout=5) as s:
        buf = bytearray()
        opened = time.monotonic()
        for i in range(4):  # 4 requests 0.6 x keepalive apart: 1.8 x keepalive in all
            if i:
                time.sleep(KEEPALIVE * 0.6)
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\n%d" % i)
            assert read_response(s, buf)[::2] == (200, b"%d" % i)
        assert time.monotonic() - opened > KEEPALIVE * 1.5


def test_a_refused_upload_reads_its_413_not_a_reset(limited: Running) -> None:
    """The front closed at once after a 413 while the upload went on: the unread bytes
    made the kernel send a reset, and the client lost the 413 (RFC 9112 9.6)."""
    with socket.create_connection((limited.host, limited.port), timeout=5) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % (20 << 20))
        time.sleep(0.3)  # the 413 is sent meanwhile
        s.sendall(b"x" * (4 << 20))  # the client is still uploading
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    assert got.startswith(b"HTTP/1.1 413") and got.endswith(b"bytes\n"), got[:200]


@pytest.mark.parametrize(("head", "status"), [
    (b"GET /echo HTTP/1.1\r\nHost: t\r\nX-Big: " + b"x" * (200 << 10), b"431"),
    (b"GET /" + b"p" * (200 << 10), b"414"),
])
def test_a_refused_head_reads_its_answer_not_a_reset(limited: Running, head: bytes,
                                                     status: bytes) -> None:
    """A header section (or target) past its limit, the client still sending: the
    front closed with bytes unread, and the kernel's reset could lose the answer."""
    with socket.create_connection((limited.host, limited.port), timeout=5) as s:
        s.sendall(head)
        time.sleep(0.3)  # the answer is sent meanwhile
        s.sendall(b"y" * (4 << 20))  # the client is still sending
        got = b""
        while chunk := s.recv(65536):  # (a ConnectionResetError: the reset)
            got += chunk
    assert got.startswith(b"HTTP/1.1 " + status), got[:200]


def test_pipelined_requests_then_a_half_close_read_every_answer(limited: Running) -> None:
    """Answers wait for the loop's turn (`Outbox`), pipelined ones in one write; the
    client's FIN then closes the connection, after what was answered went out. (echo
    answers inline: an answer still to come when the FIN arrives is cancelled, as a
    half-close reads as a hang-up.)"""
    with socket.create_connection((limited.host, limited.port), timeout=5) as s:
        s.sendall(b"".join(b"GET /echo?n=%d HTTP/1.1\r\nHost: t\r\n\r\n" % i for i in range(3)))
        s.shutdown(socket.SHUT_WR)
        buf = bytearray()
        heads = [read_response(s, buf)[1] for _ in range(3)]
        assert [h.split(b" ", 2)[1] for h in heads] == [b"200"] * 3
        assert [b"x-echo-query: n=%d" % i in h for i, h in enumerate(heads)] == [True] * 3
        assert s.recv(1) == b""
