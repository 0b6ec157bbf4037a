"""The loopback clients the memory and cap tests drive a real PoP in a child process
with (`tests.support.pop_process`: its RSS is its own)."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

from tests.support import PopProcess, pop_process, rss_of

__all__ = ["PopProcess", "non_reader", "pop_process", "rss_of"]


def non_reader(host: str, port: int, raw: bytes, source: str = "") -> socket.socket:
    """A connection that sends `raw` and never reads (a tiny receive buffer, so the
    kernel holds little for it)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    if source:
        s.bind((source, 0))
    s.connect((host, port))
    s.sendall(raw)
    return s


def get(host: str, port: int, path: str, source: str = "",
        timeout: float = 5.0) -> tuple[int, bytes, bytes]:
    """One GET on a fresh connection: (status, head, body). Raises OSError."""
    with socket.create_connection((host, port), timeout=timeout,
                                  source_address=(source, 0) if source else None) as s:
        s.sendall(b"GET %s HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n" % path.encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head, body


@dataclass
class Prober:
    """A second client asking `path` in a loop until stopped: every answer must be
    200 with `expect` as its body."""

    host: str
    port: int
    path: str
    expect: bytes
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with socket.create_connection((self.host, self.port), timeout=5) as s:
            request = b"GET %s HTTP/1.1\r\nhost: t\r\n\r\n" % self.path.encode()
            while not self.stop.is_set():
                start = time.perf_counter()
                try:
                    s.sendall(request)
                    status, body = _read_one(s)
                except OSError as e:
                    self.errors.append(repr(e))
                    return
                self.latencies.append(time.perf_counter() - start)
                if status != 200 or body != self.expect:
                    self.errors.append(f"{status} {body[:80]!r}")
                time.sleep(0.005)

    def p99(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[int(len(ordered) * 0.99)] if ordered else float("inf")


def _read_one(s: socket.socket) -> tuple[int, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed mid-response")
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed mid-body")
        body += chunk
    return int(head.split(b" ", 2)[1]), body
