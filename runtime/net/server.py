"""Listening sockets, connection caps, timeouts and graceful shutdown around
`HttpProtocol`."""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import time
from collections import Counter
from email.utils import formatdate
from typing import Annotated, Any, Literal, Protocol

import msgspec

from runtime.net.message import Request, Response
from runtime.net.protocol import HttpProtocol, Outbox

log = logging.getLogger("edgefn.http")


Positive = Annotated[int, msgspec.Meta(ge=1)]
Seconds = Annotated[float, msgspec.Meta(gt=0)]
# File descriptors kept free of connections: listeners, isolate sockets, LMDB, logs.
FD_RESERVE = 256


class ServerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Limits and timeouts of one HTTP listener (`[http]` in pop.toml)."""

    max_body_bytes: Annotated[int, msgspec.Meta(ge=0)] = 16 << 20  # 0: no body at all
    # a request line and a Host header fit the least of these (-1 or 0 answered 431 to all)
    max_header_bytes: Annotated[int, msgspec.Meta(ge=256)] = 32 << 10
    max_url_bytes: Annotated[int, msgspec.Meta(ge=16)] = 8 << 10
    header_timeout: Seconds = 10.0  # from the first byte of a request to its last header
    body_timeout: Seconds = 30.0  # from the last header to the last body byte
    keepalive_timeout: Seconds = 5.0
    max_pipelined: Positive = 64  # parsed requests queued on one connection before it stops reading
    sweep_interval: Seconds = 0.25
    # Past either cap a new connection gets 503 with `Retry-After: retry_after` and is closed.
    max_connections: Positive = 4096  # open connections on this listener
    max_connections_per_client: Positive = 256  # from one client address
    retry_after: Annotated[int, msgspec.Meta(ge=0)] = 1
    # Unsent response bytes one connection may hold before the response stops being
    # produced (streams pause, pipelined requests wait): the transport's high-water mark.
    write_buffer_bytes: Positive = 64 << 10
    send_timeout: Seconds = 60.0  # a client that reads nothing for this long is cut off
    # "auto": requests for eligible targets are served by the native lane (C), with the
    # same answers and events (runtime.pipeline.lane); "off": all by the Python front.
    # EDGEFN_NATIVE_LANE=0 turns it off too.
    native_lane: Literal["auto", "off"] = "auto"


# a native lane's call in progress (`Lane.serve`): its future first, then the lane's own
type Call = tuple[Any, ...]


class Lane(Protocol):
    """What the front asks of a native lane (`runtime.pipeline.lane.NativeLane`)."""

    def serve(self, data: bytes, client: str, date: bytes, extra: bytes, budget: int
              ) -> tuple[int, bytes, Call | None]:
        """The whole requests at the start of `data` it answers: the bytes of `data`
        they took and their responses (at least `budget` bytes of them stop it),
        and the call it started for the last of them (a Python function's), if any:
        its future (``call[0]``) says when to ask for its `answer`."""
        ...

    @property
    def closing(self) -> bool:
        """After a `serve`: whether the last request it took was not kept alive (the
        connection closes once that is answered; nothing after it is read)."""
        ...

    @property
    def waiting(self) -> int:
        """After a `serve` that left bytes: the body bytes the request they start with
        still needs when the lane would take it once they come (the front holds the
        bytes until then, and serves them all again); 0 when it is Python's."""
        ...

    def answer(self, call: Call, gone: bool, closing: bool, date: bytes, extra: bytes
               ) -> bytes | tuple[Request, Response] | None:
        """The answer to `call`, whose future is done: the response's bytes, or the
        request and response for the front to write, or None when the client is
        `gone`."""
        ...


class ServerState:
    """State shared by every connection of one server."""

    def __init__(self, config: ServerConfig, loop: asyncio.AbstractEventLoop,
                 lane: Lane | None = None) -> None:
        self.config = config
        self.loop = loop
        self.lane = lane  # serves what it can of each read before the Python front
        self.connections: set[HttpProtocol] = set()
        self.per_client: Counter[str] = Counter()  # open connections by client address
        self.refused = 0  # connections turned away at a cap
        self.cut = 0  # of those, cut unanswered (past MAX_REFUSING waiting for their 503)
        self.answered: Counter[int] = Counter()  # the front's own error answers, by status
        self.refusing: set[HttpProtocol] = set()  # past a cap, waiting for their 503
        self.outbox = Outbox(loop)  # responses written once the loop has run what it read
        self.extra_head = b""  # a header line every response carries (`worker_header`)
        self.date = b""  # ``date: <IMF-fixdate>\r\n`` of this second (`tick_date`)
        self.date_timer: asyncio.TimerHandle | None = None
        self.tick_date()

    def tick_date(self) -> None:
        """Make `date` now's, and again at the start of each next second while the
        loop runs, until `stop`: one timer a second (a clock read per response cost
        the front ~5%)."""
        now = time.time()
        self.date = b"date: %s\r\n" % formatdate(int(now), usegmt=True).encode()
        if self.loop.is_running():
            self.date_timer = self.loop.call_later(1.0 - now % 1.0 + 0.001, self.tick_date)

    def stop(self) -> None:
        """Stop the date's timer (the server is shutting down)."""
        if self.date_timer is not None:
            self.date_timer.cancel()
            self.date_timer = None

    def admit(self, address: str) -> str | None:
        """Count a new connection from `address`; None if admitted, else why not."""
        if len(self.connections) >= self.config.max_connections:
            return f"{self.config.max_connections} connections are open (http.max_connections)"
        if self.per_client[address] >= self.config.max_connections_per_client:
            return (f"{self.config.max_connections_per_client} connections are open from "
                    f"{address} (http.max_connections_per_client)")
        self.per_client[address] += 1
        return None

    def release(self, address: str) -> None:
        """An admitted connection from `address` closed."""
        left = self.per_client[address] - 1
        if left > 0:
            self.per_client[address] = left
        else:
            del self.per_client[address]


class Server:
    """One HTTP listener serving `app` (see `runtime.net.message`)."""

    def __init__(self, app: Any, config: ServerConfig | None = None,
                 lane: Lane | None = None) -> None:
        """`lane`: a native lane serving what it can of each read first (None: none)."""
        self.app = app
        self.config = config or ServerConfig()
        self.lane = lane
        self.state: ServerState | None = None
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int, reuse_port: bool = False,
                    extra_head: bytes = b"") -> None:
        """Bind and start accepting; with `reuse_port`, beside other processes'
        listeners on the same port (SO_REUSEPORT: the kernel spreads connections).
        `extra_head`: a ``name: value\r\n`` line added to every response. Raises
        OSError if the address is unavailable."""
        loop = asyncio.get_running_loop()
        raise_fd_limit(self.config.max_connections)
        self.state = state = ServerState(self.config, loop, self.lane)
        state.extra_head = extra_head
        self._server = await loop.create_server(
            lambda: HttpProtocol(self.app, state), host, port, reuse_address=True,
            reuse_port=reuse_port or None, backlog=1024)
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
            for conn in [*self.state.connections, *self.state.refusing]:
                if conn.deadline and now > conn.deadline:
                    conn.on_deadline()
                if conn.write_deadline and now > conn.write_deadline:
                    conn.on_write_stalled()

    async def shutdown(self, grace: float = 10.0) -> None:
        """Stop accepting, let in-flight requests finish for `grace` seconds, then cut."""
        if self._server is None or self.state is None:
            return
        self._server.close()
        for conn in [*self.state.connections, *self.state.refusing]:
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
        self.state.stop()
        await self._server.wait_closed()
        self._server = None


def raise_fd_limit(connections: int) -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one; warn when `connections` (plus
    `FD_RESERVE`) do not fit under it. Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as e:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, e)
    if soft != resource.RLIM_INFINITY and connections + FD_RESERVE > soft:
        log.warning("http.max_connections = %d does not fit under the open-file limit %d "
                    "(%d kept for the PoP itself): past it connections are refused by the "
                    "kernel, not answered 503", connections, soft, FD_RESERVE)
    return soft
