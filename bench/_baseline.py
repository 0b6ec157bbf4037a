"""Baseline for the benchmark: a raw uvloop + httptools hello-world server.

It is the floor edgefn is compared against: one ``asyncio.Protocol`` per
connection, an ``httptools.HttpRequestParser`` fed straight from
``data_received`` and a precomputed response, HTTP/1.1 keep-alive and
pipelining (responses are written in request order as each message completes).

Run it directly::

    python bench/_baseline.py PORT

It prints ``listening on 127.0.0.1:PORT`` (flushed) and serves until SIGTERM or
SIGINT, then exits with status 0. Or, from the benchmark, ``start(port)``
launches it under the current interpreter and waits until it accepts.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

import httptools
import uvloop

HOST = "127.0.0.1"
BODY = b"hello world\n"
RESPONSE = (
    b"HTTP/1.1 200 OK\r\n"
    b"content-type: text/plain\r\n"
    b"content-length: " + str(len(BODY)).encode() + b"\r\n"
    b"\r\n" + BODY
)
BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class HelloProtocol(asyncio.Protocol):
    """One connection: parse requests, answer each with ``hello world``."""

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    def data_received(self, data: bytes) -> None:
        if self._closing or self._transport is None:
            return
        try:
            self._parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self._fail()

    def on_message_complete(self) -> None:
        """httptools callback: runs once per request, in order, even pipelined."""
        if self._closing or self._transport is None:
            return
        self._transport.write(RESPONSE)
        if not self._parser.should_keep_alive():
            self._closing = True
            self._transport.close()

    def _fail(self) -> None:
        if self._transport is not None and not self._closing:
            self._closing = True
            self._transport.write(BAD_REQUEST)
            self._transport.close()


async def serve(port: int) -> None:
    """Serve on 127.0.0.1:``port`` until SIGTERM/SIGINT.

    Raises OSError if the port cannot be bound.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await loop.create_server(HelloProtocol, HOST, port, reuse_address=True, backlog=1024)
    print(f"listening on {HOST}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        server.close()
        await server.wait_closed()


def main(argv: list[str]) -> int:
    """Entry point for ``python bench/_baseline.py PORT``; returns the exit status."""
    if len(argv) != 2 or not argv[1].isdigit():
        print(f"usage: {argv[0]} PORT", file=sys.stderr)
        return 2
    uvloop.run(serve(int(argv[1])))
    return 0


def port_in_use(host: str, port: int) -> bool:
    """True if something already accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_until_listening(proc: subprocess.Popen, host: str, port: int, timeout: float) -> None:
    """Block until ``host:port`` accepts a TCP connection.

    Raises RuntimeError if ``proc`` exits first or ``timeout`` seconds pass.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server not accepting on {host}:{port} after {timeout:g}s")


def start(port: int, timeout: float = 10.0) -> subprocess.Popen:
    """Launch this server with ``sys.executable`` and wait until it accepts.

    The caller owns the process (``terminate()`` then ``wait()``).
    Raises RuntimeError if the port is already taken, or, carrying the
    server's stderr, if it exits or does not accept within ``timeout`` seconds.
    """
    if port_in_use(HOST, port):
        raise RuntimeError(f"baseline: {HOST}:{port} is already in use")
    # stderr goes to a file, not a pipe, so a chatty server can never block.
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(port)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            wait_until_listening(proc, HOST, port, timeout)
        except RuntimeError as exc:
            proc.kill()
            proc.wait()
            err.seek(0)
            stderr = err.read().decode(errors="replace").strip()
            raise RuntimeError(f"baseline: {exc}\n{stderr}") from None
    return proc


if __name__ == "__main__":
    sys.exit(main(sys.argv))
