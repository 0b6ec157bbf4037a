"""A load generator that POSTs as httpx does: each request's head and body written
apart (two sends, TCP_NODELAY), on kept-alive connections.

    python bench/_split_post.py URL SECONDS CONNECTIONS BODY [NAME:VALUE ...]

Prints one JSON line: {"rps", "errors", "requests"}. (wrk and ab write a request in
one send; this is what a client that writes them apart costs the server. It is
Python on uvloop, so it is itself the bottleneck of req/s on a small machine: read
the server's CPU per request.)
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import socket
import sys
import time
from urllib.parse import urlsplit

import uvloop

LENGTH = re.compile(rb"\r\ncontent-length: (\d+)\r\n", re.I)


class Client(asyncio.Protocol):
    """One connection: a request, its whole response, the next, until `stop`."""

    def __init__(self, head: bytes, body: bytes, stop: float, done: asyncio.Future[None]
                 ) -> None:
        self.head, self.body, self.stop, self.done = head, body, stop, done
        self.buf = b""
        self.count = self.errors = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP,
                                                      socket.TCP_NODELAY, 1)
        self.send()

    def send(self) -> None:
        assert self.transport is not None
        self.transport.write(self.head)  # two sends, as httpx makes them
        self.transport.write(self.body)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        m = LENGTH.search(self.buf, 0, end + 2)
        size = int(m.group(1)) if m else 0
        if len(self.buf) < end + 4 + size:
            return
        if not self.buf.startswith(b"HTTP/1.1 2"):
            self.errors += 1
        self.buf = self.buf[end + 4 + size:]
        self.count += 1
        if time.monotonic() < self.stop:
            self.send()
        elif not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.errors += 1
            self.done.set_result(None)


def _same(client: Client) -> Client:
    return client


async def main(url: str, seconds: float, connections: int, body: bytes,
               headers: list[str]) -> dict[str, float]:
    u = urlsplit(url)
    extra = "".join(f"{h.split(':', 1)[0].strip()}: {h.split(':', 1)[1].strip()}\r\n"
                    for h in headers)
    head = (f"POST {u.path or '/'}{'?' + u.query if u.query else ''} HTTP/1.1\r\n"
            f"Host: {u.netloc}\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    loop = asyncio.get_running_loop()
    start = time.monotonic()
    stop = start + seconds
    clients: list[Client] = []
    for _ in range(connections):
        client = Client(head, body, stop, loop.create_future())
        await loop.create_connection(functools.partial(_same, client),
                                     u.hostname or "127.0.0.1", u.port or 80)
        clients.append(client)
    await asyncio.gather(*(c.done for c in clients))
    took = time.monotonic() - start
    for c in clients:
        if c.transport is not None:
            c.transport.close()
    count = sum(c.count for c in clients)
    return {"rps": count / took, "errors": sum(c.errors for c in clients), "requests": count}


if __name__ == "__main__":
    url, seconds, connections, body = sys.argv[1:5]
    print(json.dumps(uvloop.run(main(url, float(seconds), int(connections), body.encode(),
                                     sys.argv[5:]))))
