"""The emulated network: one user-space TCP relay per link (this kernel has no
``netem``), all of a topology's links in one asyncio process.

A link listens on a loopback port and relays each connection to the first healthy
of its routes (a PoP's public listener), in order: that is the failover (a client
geography's anycast address, or a PoP's way to its parents). Every route has its
own one-way delay; on a connection:

- set-up pays one round trip (the TCP handshake) before the relay reads a byte;
- every chunk, either way, is delivered one-way delay later, +- up to `jitter_ms`,
  never before the chunk that was read before it (order is kept);
- a "lost" chunk (probability `loss`) arrives `retransmit_ms` late, holding up the
  ones behind it, as TCP's retransmission does: loss is a delayed retransmit, never
  a dropped connection, so it costs latency and not correctness;
- a close (FIN) travels like a chunk; a reset closes the other side at once.

Health: each route's ``/readyz`` is asked every `health_interval_s`; a route that
does not answer 200, or that refuses a connection, is skipped until it answers
again. A route is also skipped at once when it answers a 503 that closes a
connection its request asked to keep (the relay reads the answer's head as it
passes, before the client does), until a probe that began after that answer says
200: that is how a PoP whose model worker died says "not me", and the client's
next connection, sent as soon as it reads the 503, must not reach the PoP again in
the probes' gap (a passive health check, as a load balancer's outlier detection).
A 503 to a request that asked to close (a function's own, its concurrency limit's)
says nothing of the PoP. With no route up, a new connection still tries them in
order (every probe could be stale); one that reached a route marked down is reset
(both ways) when a probe begun after it got no answer at all (a refusal, or its
timeout: a hung PoP accepts and answers nothing) while the route has sent it no
byte, so a client learns within a probe round what the upstream's timeout would
have told it after minutes. After each probe round the idle connections that lead
elsewhere than a
new one would (to a route that is down, or to a later route once an earlier one
is healthy again) are closed (both ways, FIN), as a load balancer closes
connections to a host that fails its health checks (Envoy's
``close_connections_on_host_health_failure``): a client keeps connections
between requests, and a kept one would still lead there. Idle means
between two HTTP requests: every request begun has been answered in full and
nothing is on its way either way, told by parsing the HTTP/1.1 messages as they
pass (a streamed answer that pauses between tokens is not idle). A connection
whose answer is unfinished is left alone; it is closed as soon as the answer's
last bytes are delivered, if that leaves it idle (a client that sends its next
request at once is never idle at a probe round).

Flow control: each direction of a connection holds the bytes it has read and not
yet handed to the other side (in the delay line, then in the writing transport's
buffer). Above `high_water` it stops reading from the sender until they are back
at `low_water`, so a slow reader pushes back on a fast sender (through the
reader's own bounded buffer, then TCP) instead of filling the relay's memory.
Like a TCP window, that caps one connection at about `high_water` bytes per
one-way delay (1 MiB / 100 ms = 10 MiB/s). `Link.peak` is the most one
direction ever held.

Run as ``python -m runtime.topology.links CONFIG.json``; it runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path

import httptools
import msgspec

READ = 65536
TICK = 0.0005  # uvloop rounds a timer to whole milliseconds: it may fire this early
PROBE = b"GET /readyz HTTP/1.1\r\nHost: link\r\nConnection: close\r\n\r\n"


class Route(msgspec.Struct, kw_only=True):
    """One place a link leads: a PoP's listener, `delay_ms` away (one way)."""

    name: str
    host: str = "127.0.0.1"
    port: int
    delay_ms: float
    up: bool = True


class LinkSpec(msgspec.Struct, kw_only=True):
    name: str
    port: int  # listened on, loopback
    routes: list[Route]


class LinksConfig(msgspec.Struct, kw_only=True):
    jitter_ms: float = 0.0
    loss: float = 0.0
    retransmit_ms: float = 200.0
    health_interval_s: float = 0.2
    seed: int = 0
    high_water: int = 1 << 20  # bytes a direction may hold before it stops reading
    low_water: int = 256 << 10  # ...and resumes once it is back at this
    links: list[LinkSpec] = []


class _Line:
    """One direction of a connection: the delay line and the bytes it holds.

    Chunks wait in a FIFO with their due times, and one timer at a time serves its
    head: order never depends on timers firing in order (uvloop's are whole
    milliseconds, and two due a microsecond apart can fire the wrong way round).
    `room` is set while the direction may read again: what it holds (`scheduled`,
    plus the writing transport's buffer) is back at low water."""

    def __init__(self, writer: asyncio.StreamWriter, net: LinksConfig, link: Link) -> None:
        self.writer, self.link = writer, link
        self.loop = asyncio.get_running_loop()
        self.queue: deque[tuple[float, bytes | None]] = deque()  # (due, chunk); None: FIN
        self.timer: asyncio.TimerHandle | None = None
        self.ended = self.loop.create_future()  # set once the FIN was passed on
        self.emptied: Callable[[], None] | None = None  # called when it delivered all it held
        self.scheduled = 0
        self.high, self.low = net.high_water, net.low_water
        self.room = asyncio.Event()
        self.room.set()
        # the transport pauses (and `drain` waits) above high_water, resumes at low_water
        writer.transport.set_write_buffer_limits(high=net.high_water, low=net.low_water)

    def now(self) -> int:
        return self.scheduled + self.writer.transport.get_write_buffer_size()

    def push(self, due: float, chunk: bytes | None) -> None:
        """Deliver `chunk` (None: the FIN) at `due`, after everything pushed before."""
        if chunk:
            self.scheduled += len(chunk)
            if self.scheduled > self.high:
                self.room.clear()
        self.queue.append((due, chunk))
        if self.timer is None:
            self.timer = self.loop.call_at(due, self._serve)

    def _serve(self) -> None:
        """Deliver the chunks that are due, in order; wait for the next one."""
        self.timer = None
        now = self.loop.time() + TICK
        while self.queue and self.queue[0][0] <= now:
            _, chunk = self.queue.popleft()
            if chunk is None:
                _close(self.writer)
                if not self.ended.done():
                    self.ended.set_result(None)
                return
            _write(self.writer, chunk)  # into the transport's buffer
            self.scheduled -= len(chunk)
            if self.scheduled <= self.low:
                self.room.set()
            self.link.peak = max(self.link.peak, self.now())
        if self.queue:
            self.timer = self.loop.call_at(self.queue[0][0], self._serve)
        elif self.emptied is not None:
            self.emptied()

    def reset(self) -> None:
        """The sender reset: the other side goes at once, with nothing still held."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.queue.clear()
        self.writer.transport.abort()
        if not self.ended.done():
            self.ended.set_result(None)


class _Messages:
    """httptools callbacks: counts the HTTP messages begun and completed, and calls
    `on_head` (if set) once each one's head is read; `on_head` returns whether the
    message counts (an interim ``1xx`` answer completes no request)."""

    def __init__(self, on_head: Callable[[], bool] | None = None) -> None:
        self.begun = self.completed = 0
        self.on_head = on_head
        self.counts = True  # the message being parsed

    def on_message_begin(self) -> None:
        self.begun += 1

    def on_headers_complete(self) -> None:
        if self.on_head is not None:
            self.counts = self.on_head()

    def on_message_complete(self) -> None:
        self.completed += self.counts


class _Conn:
    """One relayed connection: where it leads, its two directions, and how many HTTP
    requests it carried and responses it completed (parsed as they pass, so that
    `idle` knows when it sits between two requests; a streamed answer that pauses
    between tokens is not idle)."""

    def __init__(self, link: Link, route: Route, client: asyncio.StreamWriter,
                 server: asyncio.StreamWriter) -> None:
        self.link, self.route, self.client, self.server = link, route, client, server
        self.lines: list[_Line] = []
        self.requests = _Messages(self._request_head)
        self.responses = _Messages(self._answer_head)
        self.parsers = (httptools.HttpRequestParser(self.requests),
                        httptools.HttpResponseParser(self.responses))
        self.opaque = False  # not HTTP/1.1 as parsed: never called idle
        self.kept: deque[bool] = deque()  # each unanswered request: did it ask to keep alive
        # opened to a route marked down (none was up): when, while it has heard nothing
        self.blind: float | None = asyncio.get_running_loop().time() if not route.up else None

    def _request_head(self) -> bool:
        self.kept.append(self.parsers[0].should_keep_alive())
        return True

    def _answer_head(self) -> bool:
        """A 503 that closes a connection its request asked to keep takes its route
        out at once (`Link.shed`): the PoP chose to close, so it says "not me"; a
        request that asked to close gets any 503 (a function's, a concurrency
        limit's) closing, which says nothing of the PoP. Returns whether the answer
        is final: a ``1xx`` (but ``101``, the upgrade) answers no request."""
        answer = self.parsers[1]
        status = answer.get_status_code()
        if 100 <= status < 200 and status != 101:
            return False
        kept = self.kept.popleft() if self.kept else True
        if status == 503 and kept and not answer.should_keep_alive():
            self.link.shed(self.route)
        return True

    def saw(self, chunk: bytes, from_server: bool) -> None:
        """Count the messages in `chunk`, read from the server or the client."""
        if from_server:
            self.blind = None  # the route answers: whatever its probes say
        if self.opaque:
            return
        try:
            self.parsers[from_server].feed_data(chunk)
        except httptools.HttpParserError:  # an upgrade, or not HTTP: leave it alone
            self.opaque = True

    def idle(self) -> bool:
        """Whether it sits between two requests: every request begun was answered in
        full, and nothing is on its way in either direction."""
        return (not self.opaque and self.requests.begun == self.responses.completed
                and len(self.lines) == 2 and not any(
                    line.queue or line.writer.transport.get_write_buffer_size()
                    for line in self.lines))

    def answered(self) -> None:
        """The server's bytes were all delivered: if that left it idle on a route a new
        connection would not take, close it now (a client that sends its next request
        at once is never idle at a probe round)."""
        self.close_if_astray(self.link.best())

    def close_if_astray(self, best: Route | None) -> None:
        """Close it if it is idle and leads elsewhere than a new connection would
        (`best`: the link's first healthy route); reset it if it was opened to a route
        marked down that has sent it nothing since, and a probe begun after it was
        opened got no answer (`Link.silent`)."""
        if (self.blind is not None and not self.route.up
                and self.link.silent.get(self.route.name, self.blind) > self.blind):
            self.link.conns.discard(self)
            self.client.transport.abort()
            self.server.transport.abort()
        elif self.route is not best and self.idle():
            self.link.conns.discard(self)
            self.close()

    def close(self) -> None:
        """Close both sides (a FIN each way); the relay's pipes then end."""
        self.client.close()
        self.server.close()


class Link:
    """One link: its listener, routes and their health."""

    def __init__(self, spec: LinkSpec, net: LinksConfig, rng: random.Random) -> None:
        self.spec, self.net, self.rng = spec, net, rng
        self.server: asyncio.Server | None = None
        self.peak = 0  # the most bytes one direction of a connection held (flow control)
        self.conns: set[_Conn] = set()
        self.shed_at: dict[str, float] = {}  # route name: when it last answered 503, closing
        self.silent: dict[str, float] = {}  # route name: when its last unanswered probe began

    async def start(self) -> None:
        """Raises OSError if the port is taken."""
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.spec.port,
                                                 reuse_address=True)

    async def watch(self) -> None:
        """Probe every route's health forever."""
        while True:
            await asyncio.gather(*(self._probe(r) for r in self.spec.routes))
            self.close_idle()
            await asyncio.sleep(self.net.health_interval_s)

    def close_idle(self) -> None:
        """Close the idle connections (`_Conn.idle`) that lead elsewhere than a new
        one would: to a route that is down, or past the first healthy route (back
        from a failover); reset those that went to a route already down and still
        wait for its first byte after a probe got no answer (`_Conn.close_if_astray`)."""
        best = self.best()
        for conn in list(self.conns):
            conn.close_if_astray(best)

    def best(self) -> Route | None:
        """Where a new connection goes: the first route that is up."""
        return next((r for r in self.spec.routes if r.up), None)

    def shed(self, route: Route) -> None:
        """`route` answered a 503 that closes its connection: new connections skip it
        until a probe begun after now says it is ready."""
        route.up = False
        self.shed_at[route.name] = asyncio.get_running_loop().time()

    async def _probe(self, route: Route) -> None:
        timeout = max(0.5, 2 * self.net.health_interval_s)
        begun = asyncio.get_running_loop().time()
        w: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(timeout):
                r, w = await asyncio.open_connection(route.host, route.port)
                w.write(PROBE)
                line = await r.readline()
            # a probe begun before the route's 503 may have been answered before it: stale
            route.up = (line.split(b" ")[1:2] == [b"200"]
                        and self.shed_at.get(route.name, begun - 1) < begun)
        except (OSError, TimeoutError):  # refused, or accepted and never answered
            route.up = False
            self.silent[route.name] = begun
        except IndexError:
            route.up = False
        finally:  # a route that accepts and never answers left a socket a probe round
            if w is not None:
                w.close()

    async def _connect(self) -> tuple[Route, asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The first healthy route that accepts a connection (then the others, in
        case every probe is stale), or None."""
        ordered = ([r for r in self.spec.routes if r.up]
                   + [r for r in self.spec.routes if not r.up])
        for route in ordered:
            try:
                reader, writer = await asyncio.open_connection(route.host, route.port)
            except OSError:
                route.up = False
                continue
            return route, reader, writer
        return None

    async def _serve(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        found = await self._connect()
        if found is None:
            cwriter.transport.abort()
            return
        route, sreader, swriter = found
        delay = route.delay_ms / 1000
        conn = _Conn(self, route, cwriter, swriter)
        self.conns.add(conn)
        await asyncio.sleep(2 * delay)  # the handshake's round trip
        try:
            await asyncio.gather(self._pipe(creader, swriter, delay, conn, False),
                                 self._pipe(sreader, cwriter, delay, conn, True))
        finally:
            self.conns.discard(conn)
            cwriter.close()
            swriter.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    delay: float, conn: _Conn, from_server: bool) -> None:
        """Relay `reader` to `writer`, each chunk `delay` (+ jitter, + loss) later and
        never before the one read before it; returns once the end (FIN or reset) has
        been passed on."""
        loop = asyncio.get_running_loop()
        line = _Line(writer, self.net, self)
        if from_server:
            line.emptied = conn.answered
        conn.lines.append(line)
        last = 0.0
        while True:
            try:
                await line.room.wait()  # the delay line is back at low_water
                await writer.drain()  # so is the transport's buffer
                chunk = await reader.read(READ)
            except OSError:  # reset: the other side goes at once
                line.reset()
                return
            if chunk:
                conn.saw(chunk, from_server)
            last = max(loop.time() + delay + self._extra(), last)
            line.push(last, chunk or None)
            self.peak = max(self.peak, line.now())
            if not chunk:
                await line.ended
                return

    def _extra(self) -> float:
        net = self.net
        extra = self.rng.uniform(-net.jitter_ms, net.jitter_ms) / 1000 if net.jitter_ms else 0.0
        if net.loss and self.rng.random() < net.loss:
            extra += net.retransmit_ms / 1000
        return extra


def _write(writer: asyncio.StreamWriter, chunk: bytes) -> None:
    if not writer.transport.is_closing():
        writer.write(chunk)


def _close(writer: asyncio.StreamWriter) -> None:
    """The FIN arrives: half-close when the transport can, else close."""
    if writer.transport.is_closing():
        return
    if writer.can_write_eof():
        try:
            writer.write_eof()
            return
        except OSError:
            pass
    writer.close()


async def serve(config: LinksConfig) -> None:
    """Run every link of `config` until SIGTERM/SIGINT. Raises OSError if a port is taken."""
    rng = random.Random(config.seed)
    links = [Link(spec, config, rng) for spec in config.links]
    for link in links:
        await link.start()
    watchers = [asyncio.create_task(link.watch()) for link in links]
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    for w in watchers:
        w.cancel()
    for link in links:
        assert link.server is not None
        link.server.close()


def main() -> None:
    import uvloop

    config = msgspec.json.decode(Path(sys.argv[1]).read_bytes(), type=LinksConfig)
    uvloop.run(serve(config))


if __name__ == "__main__":
    main()
