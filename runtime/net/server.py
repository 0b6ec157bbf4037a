"""Listening sockets, timeouts and graceful shutdown around `HttpProtocol`."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import msgspec

from runtime.net.protocol import HttpProtocol

log = logging.getLogger("edgefn.http")


class ServerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Limits and timeouts of one HTTP listener (`[http]` in pop.toml)."""

    max_body_bytes: int = 16 << 20
    max_header_bytes: int = 32 << 10
    max_url_bytes: int = 8 << 10
    header_timeout: float = 10.0  # from the first byte of a request to its last header
    body_timeout: float = 30.0  # from the last header to the last body byte
    keepalive_timeout: float = 5.0
    max_pipelined: int = 64
    sweep_interval: float = 0.25


class ServerState:
    """State shared by every connection of one server."""

    def __init__(self, config: ServerConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.loop = loop
        self.connections: set[HttpProtocol] = set()


class Server:
    """One HTTP listener serving `app` (see `runtime.net.message`)."""

    def __init__(self, app: Any, config: ServerConfig | None = None) -> None:
        self.app = app
        self.config = config or ServerConfig()
        self.state: ServerState | None = None
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> None:
        """Bind and start accepting. Raises OSError if the address is unavailable."""
        loop = asyncio.get_running_loop()
        self.state = state = ServerState(self.config, loop)
        self._server = await loop.create_server(
            lambda: HttpProtocol(self.app, state), host, port, reuse_address=True, backlog=1024)
        for sock in self._server.sockets:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sweeper = loop.create_task(self._sweep())

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None, "server not started"
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def _sweep(self) -> None:
        """Expire idle and too-slow connections; one timer for all of them."""
        assert self.state is not None
        while True:
            await asyncio.sleep(self.config.sweep_interval)
            now = self.state.loop.time()
            for conn in list(self.state.connections):
                if conn.deadline and now > conn.deadline:
                    conn.on_deadline()

    async def shutdown(self, grace: float = 10.0) -> None:
        """Stop accepting, let in-flight requests finish for `grace` seconds, then cut."""
        if self._server is None or self.state is None:
            return
        self._server.close()
        for conn in list(self.state.connections):
            conn.shutdown()
        loop = self.state.loop
        end = loop.time() + grace
        while self.state.connections and loop.time() < end:
            await asyncio.sleep(0.02)
        for conn in list(self.state.connections):
            if conn.transport is not None:
                log.warning("closing %s: still busy after the %.1fs grace period",
                            conn.client, grace)
                conn.transport.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
        await self._server.wait_closed()
        self._server = None
