"""The load generator's client: a stale kept-alive connection is replaced for an
idempotent request, never for another one."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from runtime.topology.load import Client

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


@contextmanager
def closes_the_second_request() -> Iterator[int]:
    """Each connection answers its first request (keep-alive), then reads the next
    one and closes without a byte: the race a client's idle check cannot see."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            conn.sendall(OK)
            conn.recv(65536)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


@pytest.mark.parametrize(("method", "second"), [("GET", 200), ("HEAD", 200), ("POST", 0)])
def test_a_stale_connection_is_retried_only_for_idempotent_requests(method: str,
                                                                    second: int) -> None:
    with closes_the_second_request() as port, Client("geo", port, timeout=5) as client:
        assert client.send("x", method, "/").status == 200
        sample = client.send("x", method, "/", b"{}" if method == "POST" else None)
        assert sample.status == second, sample
        if second == 0:
            assert "RemoteDisconnected" in sample.error or "Connection" in sample.error
