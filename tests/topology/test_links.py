"""The emulated link: added delay vs configured (set-up, each way), loss as a
delayed retransmit, order kept under jitter, failover to the next route. An echo
server on loopback behind a real `Link`; no PoP."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import uvloop

from runtime.topology.links import READ, Link, LinksConfig, LinkSpec, Route

SLACK = 0.012  # loopback, two event loops and a busy 2-core machine, per round trip


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while line := await reader.readline():
        writer.write(line)
    writer.close()


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def _link(delays: list[float | None], **net: float) -> AsyncIterator[tuple[Link, int]]:
    """A link whose routes are echo servers `delays` ms away (None: a dead port)."""
    servers, routes = [], []
    for i, delay in enumerate(delays):
        port = _dead_port()
        if delay is not None:
            servers.append(await asyncio.start_server(_echo, "127.0.0.1", port))
        routes.append(Route(name=f"r{i}", port=port, delay_ms=delay or 0.0))
    spec = LinkSpec(name="t", port=_dead_port(), routes=routes)
    async with _running(spec, servers, LinksConfig(**net)) as link:  # type: ignore[arg-type]
        yield link, spec.port


@asynccontextmanager
async def _running(spec: LinkSpec, servers: list[asyncio.Server],
                   config: LinksConfig) -> AsyncIterator[Link]:
    """`spec`'s link, started; stopped after, and `servers` with it."""
    link = Link(spec, config, random.Random(1))
    await link.start()
    try:
        yield link
    finally:
        assert link.server is not None
        link.server.close()
        for s in servers:
            s.close()


@asynccontextmanager
async def _link_to(*handlers: Callable[[asyncio.StreamReader, asyncio.StreamWriter],
                                       Awaitable[None]]) -> AsyncIterator[tuple[Link, int]]:
    """A link to a server per handler, in order, each 5 ms away; their routes probed
    once (no probe rounds run)."""
    servers = [await asyncio.start_server(h, "127.0.0.1", 0) for h in handlers]
    spec = LinkSpec(name="t", port=_dead_port(), routes=[
        Route(name=f"r{i}", port=s.sockets[0].getsockname()[1], delay_ms=5.0)
        for i, s in enumerate(servers)])
    async with _running(spec, servers, LinksConfig()) as link:
        yield link, spec.port


async def _round_trips(port: int, n: int, line: bytes = b"ping\n") -> tuple[float, list[float]]:
    """Seconds to the first echo on a fresh connection, then `n` more on it."""
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(line)
    assert await reader.readline() == line
    first, rest = time.perf_counter() - t0, []
    for _ in range(n):
        t = time.perf_counter()
        writer.write(line)
        assert await reader.readline() == line
        rest.append(time.perf_counter() - t)
    writer.close()
    return first, rest


def test_every_byte_pays_the_one_way_delay_and_setup_a_round_trip() -> None:
    async def main() -> None:
        async with _link([20.0], jitter_ms=0.0) as (_, port):
            trips = [await _round_trips(port, 10) for _ in range(3)]
        # a fresh connection: handshake (2 x 20) + request (20) + answer (20); the
        # quickest of three, so that one scheduling stall of a busy machine (a CI run
        # once saw +32 ms) is not read as a wrong delay
        firsts = [first for first, _ in trips]
        assert all(f >= 0.080 for f in firsts) and min(firsts) <= 0.080 + SLACK, firsts
        rest = [rtt for _, more in trips for rtt in more]
        rtts = sorted(rest)
        assert rtts[0] >= 0.040 and statistics.median(rtts) <= 0.040 + SLACK, rtts
    asyncio.run(main())


def test_loss_is_a_late_retransmit_not_a_lost_byte() -> None:
    async def main() -> None:
        async with _link([5.0], jitter_ms=0.0, loss=1.0, retransmit_ms=50.0) as (_, port):
            _, rest = await _round_trips(port, 3)
        # every chunk lost once: both ways pay 50 ms more, and the bytes all arrive
        assert all(0.110 <= r <= 0.110 + SLACK for r in rest), rest
    asyncio.run(main())


def test_jitter_never_reorders_bytes() -> None:
    """On uvloop, as the links process runs: its timers are whole milliseconds, so
    chunks whose due times are a microsecond apart once fired out of order (a CI
    run saw an SSE stream's head arrive after its tail: 4 of 5 such rounds failed)."""
    async def main() -> None:
        async with _link([2.0], jitter_ms=2.0) as (_, port):
            for _ in range(3):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                lines = [f"{i}\n".encode() for i in range(2000)]

                async def send(w: asyncio.StreamWriter = writer, todo: list[bytes] = lines
                               ) -> None:
                    for line in todo:  # each write its own chunk, jittered on its own
                        w.write(line)
                        await asyncio.sleep(0.0001)

                sender = asyncio.create_task(send())
                got = [await reader.readline() for _ in lines]
                await sender
                writer.close()
                assert got == lines
    uvloop.run(main())


def test_a_dead_route_is_skipped_and_marked_down() -> None:
    async def main() -> None:
        async with _link([None, 5.0]) as (link, port):
            first, _ = await _round_trips(port, 0)
            assert [r.up for r in link.spec.routes] == [False, True]
            # the live route's delay only, no retry cost (a busy CI run saw 35 ms)
            assert first <= 0.020 + 3 * SLACK
            await link._probe(link.spec.routes[1])  # an echo server is not a PoP: not ready
            assert not link.spec.routes[1].up
    asyncio.run(main())


class _Http:
    """A keep-alive HTTP/1.1 server: ``GET /fast`` is answered at once (chunked);
    ``GET /slow`` gets its head and a first chunk, then a pause (as a streamed
    answer between tokens) until `release` is set, then its end."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n")
                if head.startswith(b"GET /slow "):
                    await self.release.wait()
                writer.write(b"0\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> None:
    """Send ``GET path`` and read its answer to the end."""
    writer.write(f"GET {path} HTTP/1.1\r\nhost: t\r\n\r\n".encode())
    assert (await reader.readuntil(b"hi\r\n")).startswith(b"HTTP/1.1 200 OK")
    assert await reader.readuntil(b"0\r\n\r\n") == b"0\r\n\r\n"


@asynccontextmanager
async def _http_link(routes: int) -> AsyncIterator[tuple[Link, int, _Http]]:
    """A link to `routes` `_Http` servers, each 5 ms away."""
    http = _Http()
    async with _link_to(*[http] * routes) as (link, port):
        yield link, port, http


def test_a_route_that_goes_down_loses_its_idle_connections_not_a_busy_one() -> None:
    """A client keeps connections between requests; one kept to a route that went
    down would still lead there. The link closes those that are idle (every request
    answered in full), and leaves one whose streamed answer pauses between tokens
    until it is idle."""
    async def main() -> None:
        async with _http_link(1) as (link, port, http):
            idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)
            busy_r, busy_w = await asyncio.open_connection("127.0.0.1", port)
            for r, w in ((idle_r, idle_w), (busy_r, busy_w)):
                await _get(r, w, "/fast")
            link.close_idle()  # the route is up: nothing is closed
            busy_w.write(b"GET /slow HTTP/1.1\r\nhost: t\r\n\r\n")
            assert (await busy_r.readuntil(b"hi\r\n")).startswith(b"HTTP/1.1 200 OK")
            link.spec.routes[0].up = False  # the server spoke last, but its answer goes on
            link.close_idle()
            assert await asyncio.wait_for(idle_r.read(), 1) == b""  # FIN, at once
            http.release.set()
            assert await asyncio.wait_for(busy_r.readuntil(b"0\r\n\r\n"), 1) == b"0\r\n\r\n"
            link.close_idle()  # idle now, and its route still down
            assert await asyncio.wait_for(busy_r.read(), 1) == b""
            assert not link.conns
            idle_w.close()
            busy_w.close()
    asyncio.run(main())


def test_back_from_a_failover_the_kept_connections_of_the_later_route_are_closed() -> None:
    """Kept connections made while the first route was down lead to the second; once
    the first is healthy again, new connections go there, and the idle kept ones
    are closed so that their client's next request follows."""
    async def main() -> None:
        async with _http_link(2) as (link, port, _):
            first, second = link.spec.routes
            first.up = False
            r, w = await asyncio.open_connection("127.0.0.1", port)
            await _get(r, w, "/fast")
            assert [c.route for c in link.conns] == [second]
            link.close_idle()  # the second is where a new connection goes
            await _get(r, w, "/fast")
            first.up = True
            link.close_idle()
            assert await asyncio.wait_for(r.read(), 1) == b""
            w.close()
    asyncio.run(main())


def test_a_connection_that_is_not_http_is_never_closed_as_idle() -> None:
    async def main() -> None:
        async with _link([5.0]) as (link, port):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"ping\n")
            assert await r.readline() == b"ping\n"
            link.spec.routes[0].up = False
            link.close_idle()
            w.write(b"pong\n")
            assert await asyncio.wait_for(r.readline(), 1) == b"pong\n"
            w.close()
    asyncio.run(main())


def test_with_no_route_alive_the_connection_is_closed_at_once() -> None:
    async def main() -> None:
        async with _link([None, None]) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            t = time.perf_counter()
            assert await reader.read() == b""
            assert time.perf_counter() - t < 0.5
            writer.close()
    asyncio.run(main())


def test_a_slow_reader_keeps_the_relays_buffer_bounded_and_loses_nothing() -> None:
    """8 MiB from a fast sender to a reader that takes 16 KiB per 2 ms, through a
    link that may hold 256 KiB a direction: the relay pauses the sender instead of
    buffering, and every byte arrives, in order."""
    high, low = 256 << 10, 64 << 10
    data = random.Random(7).randbytes(8 << 20)
    got = bytearray()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(16 << 10):
            got.extend(chunk)
            await asyncio.sleep(0.002)
        writer.close()

    async def main() -> int:
        server = await asyncio.start_server(slow, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        spec = LinkSpec(name="t", port=_dead_port(), routes=[
            Route(name="slow", port=port, delay_ms=5.0)])
        link = Link(spec, LinksConfig(high_water=high, low_water=low), random.Random(1))
        await link.start()
        _, writer = await asyncio.open_connection("127.0.0.1", spec.port)
        writer.write(data)  # all at once: the sender never waits by itself
        await writer.drain()
        writer.write_eof()
        async with asyncio.timeout(120):
            while len(got) < len(data):
                await asyncio.sleep(0.05)
        writer.close()
        assert link.server is not None
        link.server.close()
        server.close()
        return link.peak

    peak = asyncio.run(main())
    print(f"relay peak {peak} bytes held for 8 MiB sent (high water {high})")
    assert bytes(got) == data
    # above high_water it reads no more: one read (READ) past it at most, in the
    # delay line, and the transport's buffer filled up to high_water from it
    assert high <= peak <= 2 * high + 2 * READ, peak


def test_back_from_a_failover_a_busy_connection_closes_once_its_answer_is_delivered() -> None:
    """A client that sends its next request as soon as an answer arrives is never idle
    at a probe round: its connection to the later route is closed right after the
    answer in flight is delivered (without waiting for another round)."""
    async def main() -> None:
        async with _http_link(2) as (link, port, http):
            first, _ = link.spec.routes
            first.up = False
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /slow HTTP/1.1\r\nhost: t\r\n\r\n")
            assert (await r.readuntil(b"hi\r\n")).startswith(b"HTTP/1.1 200 OK")
            first.up = True
            link.close_idle()  # its answer is not finished: left alone
            http.release.set()
            assert await asyncio.wait_for(r.readuntil(b"0\r\n\r\n"), 1) == b"0\r\n\r\n"
            assert await asyncio.wait_for(r.read(), 1) == b""  # closed once delivered
            assert not link.conns
            w.close()
    asyncio.run(main())


class _Pop:
    """A PoP's HTTP face, one answer per connection: ``/readyz`` 200 (once `ready`
    is set), anything else `status` with ``connection: close``; `asked` holds the
    paths it was asked for."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.ready = asyncio.Event()
        self.ready.set()
        self.asked: list[str] = []

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        path = head.split(b" ")[1].decode()
        self.asked.append(path)
        if path == "/readyz":
            await self.ready.wait()
        status = 200 if path == "/readyz" else self.status
        writer.write(b"HTTP/1.1 %d X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n" % status)
        await writer.drain()
        writer.close()


async def _status(port: int, path: str) -> int:
    """``GET path`` on a new connection through the link: the answer's status."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nhost: t\r\n\r\n".encode())
    line = await asyncio.wait_for(reader.readline(), 2)
    writer.close()
    return int(line.split(b" ")[1])


def test_a_503_that_closes_its_connection_sends_the_next_connection_elsewhere() -> None:
    """A PoP whose model worker dies under a request answers 503 and closes; its
    client tries again at once on a new connection, before any probe round has seen
    the PoP not ready: that one goes to the next route (a regional-failover chat was
    answered 503 twice by the regional in CI)."""
    async def main() -> None:
        down, spare = _Pop(503), _Pop(200)
        async with _link_to(down, spare) as (link, port):
            for route in link.spec.routes:
                await link._probe(route)
            assert await _status(port, "/chat") == 503
            assert await _status(port, "/chat") == 200
            assert (down.asked, spare.asked) == (["/readyz", "/chat"], ["/readyz", "/chat"])
            await link._probe(link.spec.routes[0])  # ready again: it is used again
            assert await _status(port, "/chat") == 503
    asyncio.run(main())


def test_a_probe_begun_before_a_routes_503_does_not_bring_it_back() -> None:
    """A probe round that asked before the 503 and read 200 after it says nothing
    about the route now."""
    async def main() -> None:
        down, spare = _Pop(503), _Pop(200)
        async with _link_to(down, spare) as (link, port):
            first = link.spec.routes[0]
            down.ready.clear()
            stale = asyncio.create_task(link._probe(first))
            while "/readyz" not in down.asked:  # asked, not yet answered
                await asyncio.sleep(0.001)
            assert await _status(port, "/chat") == 503
            down.ready.set()
            await stale
            assert not first.up
            assert await _status(port, "/chat") == 200
    asyncio.run(main())


def test_a_probe_of_a_route_that_never_answers_closes_its_connection() -> None:
    """A PoP that accepts and never answers ``/readyz`` (hung) is down after the
    probe's timeout, and the probe's connection is closed: it was left open, a socket
    a probe round (5 a second) in the links process for as long as the PoP hung."""
    async def main() -> None:
        ends: list[bytes] = []

        async def hung(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            ends.append(await reader.read())  # b"" once the probe closes its side
            writer.close()

        async with _link_to(hung) as (link, _):
            route = link.spec.routes[0]
            await link._probe(route)  # times out after 0.5 s
            assert not route.up
            for _ in range(100):
                if ends:
                    break
                await asyncio.sleep(0.01)
            assert ends and ends[0].endswith(b"\r\n\r\n"), ends  # the probe, then its close
    asyncio.run(main())


async def _mirror_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A PoP whose functions answer 503 (a concurrency limit, a function's own 503):
    ``/readyz`` 200; anything else 503, closing the connection only where the
    request asked for that (``connection: close``), as the PoP's server does."""
    with contextlib.suppress(asyncio.IncompleteReadError):
        while head := await reader.readuntil(b"\r\n\r\n"):
            if b" /readyz " in head:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                continue
            close = b"connection: close" in head.lower()
            writer.write(b"HTTP/1.1 503 X\r\ncontent-length: 0\r\n%s\r\n"
                         % (b"connection: close\r\n" if close else b""))
            await writer.drain()
            if close:
                break
    writer.close()


def test_a_503_to_a_request_that_asked_to_close_keeps_its_route() -> None:
    """A client that sends ``connection: close`` gets any 503 with ``connection:
    close`` (the PoP closes because it was asked to): that says nothing of the
    PoP's health. One tenant's function at its concurrency limit must not send
    every client of the link to the next region (with such requests arriving
    faster than probe rounds, every probe was stale and the route stayed down)."""
    async def main() -> None:
        async with _link_to(_mirror_close, _mirror_close) as (link, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /fn HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
            assert (await asyncio.wait_for(reader.readline(), 2)).startswith(b"HTTP/1.1 503")
            await asyncio.wait_for(reader.read(), 2)
            writer.close()
            routes = link.spec.routes
            assert routes[0].up and link.best() is routes[0]
    asyncio.run(main())


async def _continue_then_ok(reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter) -> None:
    """``Expect: 100-continue`` as the PoP answers it: ``100 Continue``, then the
    body is read and the final answer sent; the connection is kept."""
    with contextlib.suppress(asyncio.IncompleteReadError):
        while await reader.readuntil(b"\r\n\r\n"):
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await reader.readexactly(5)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
    writer.close()


def test_a_100_continue_is_not_the_answer_a_connection_astray_waits_for() -> None:
    """A connection on a route a new one would not take (back from a failover) is
    closed once it is idle: a ``100 Continue`` (curl asks for it past 1 KiB of body)
    completes no request, so the relay must not close it between the 100 and the
    final answer, with the request's body still to come."""
    async def main() -> None:
        async with _link_to(_continue_then_ok, _continue_then_ok) as (link, port):
            routes = link.spec.routes
            routes[0].up = False  # failed over to r1
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            routes[0].up = True  # r0 is back: r1's idle connections go
            writer.write(b"POST /fn HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n"
                         b"expect: 100-continue\r\n\r\n")
            assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2) \
                == b"HTTP/1.1 100 Continue\r\n\r\n"
            await asyncio.sleep(0.05)
            writer.write(b"hello")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
            assert head.startswith(b"HTTP/1.1 200")
            writer.close()
    asyncio.run(main())


def test_a_connection_to_a_route_already_down_is_reset_when_a_later_probe_goes_unanswered(
        ) -> None:
    """With no route up a new connection still goes to one (every probe could be
    stale). A hung PoP accepts it and answers nothing: once a probe begun after the
    connection gets no answer, the link resets it (its client waited out its own
    timeout, minutes for a model call). A probe begun before it says nothing of it;
    neither does a PoP that answers its probe, even "not ready", nor one that sent
    the connection a byte."""
    async def main() -> None:
        answer = asyncio.Event()
        asked: list[bytes] = []

        async def hung(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            asked.append(head.split(b" ")[1])
            if head.startswith(b"GET /partial"):
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            await answer.wait()  # never, in this test
            writer.close()

        async def ask(path: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET %s HTTP/1.1\r\nhost: t\r\n\r\n" % path)
            while path not in asked:
                await asyncio.sleep(0.005)
            return reader, writer

        async with _link_to(hung) as (link, port):
            route = link.spec.routes[0]
            await link._probe(route)  # times out after 0.5 s
            assert not route.up
            link.close_idle()
            reader, writer = await ask(b"/chat")
            partial, pwriter = await ask(b"/partial")
            link.close_idle()  # the probe that failed began before it: kept
            assert not reader.at_eof()
            route.up = True  # a probe says "up" (a stale one): nothing to reset
            link.silent[route.name] = asyncio.get_running_loop().time()
            link.close_idle()
            await asyncio.sleep(0.05)
            assert not reader.at_eof()
            route.up = False
            await link._probe(route)  # begun after it, unanswered
            t0 = time.perf_counter()
            link.close_idle()
            with contextlib.suppress(ConnectionError):
                assert await asyncio.wait_for(reader.read(), 1) == b""
            print(f"reset in {1000 * (time.perf_counter() - t0):.1f} ms")
            # the one that heard the answer's head is left to its answer
            assert not partial.at_eof()
            assert (await partial.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            writer.close()
            pwriter.close()
            answer.set()
            await asyncio.sleep(0.05)
    asyncio.run(main())
