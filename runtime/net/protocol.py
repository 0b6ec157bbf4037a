"""HTTP/1.1 server protocol on httptools.

Keep-alive, pipelining (responses strictly in request order), chunked request
bodies, streamed responses (chunked), ``Expect: 100-continue``, size limits
(413, 414, 431), malformed input (400) and slow clients (408). No input may
raise out of this module: parser errors become a 4xx and a closed connection,
and application errors a 500.

Whole responses are written together once the loop has run what it read (`Outbox`):
each one that is ready in a loop iteration waits for the others, and then every
connection's go out in one write each. A response written the moment it is ready
wakes the client's process, and on a loaded PoP those wake-ups cost more than the
responses (a profile of the WASM hello under wrk: a fifth of the PoP's time in the
kernel's wake-up, now a thirtieth; bench/bench_runtime.py's req/s). A connection's
own writes keep their order: anything else it writes (a stream, a ``100 Continue``,
an error, its close) sends what it has waiting first.

Memory per connection is bounded by backpressure: while the transport holds more
than ``write_buffer_bytes`` unsent, no further response is started (pipelined
requests wait, reading stops) and a streamed body is not pulled further; responses
waiting for the loop's turn are written at once past ``write_buffer_bytes``, so at
most twice ``write_buffer_bytes`` plus one response (or one chunk) is buffered.
Past ``max_connections`` or ``max_connections_per_client`` a connection gets 503.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import deque
from collections.abc import AsyncIterator, Awaitable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import httptools

from edgefn_core.errors import FunctionError, HttpReject
from runtime.net.lane import CONN_CLOSE
from runtime.net.message import Request, Response

# the code of a front error in a JSON body (`_write_error`)
ERROR_CODES = {400: "invalid_request", 408: "timeout", 413: "request_too_large",
               414: "url_too_long", 431: "headers_too_large"}

if TYPE_CHECKING:
    from runtime.net.server import ServerState

log = logging.getLogger("edgefn.http")

REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
STATUS_LINES = {code: b"HTTP/1.1 %d %s\r\n" % (code, phrase) for code, phrase in REASONS.items()}
NO_BODY_STATUS = frozenset({204, 304})
# Framing is the server's job: apps' values for these are dropped (names are lower-case);
# and so are the other fields of one connection (RFC 9110 7.6.1), which a function has
# none of: an `upgrade` reached the client without `connection: upgrade` (7.8), a
# `trailer` announced trailers no response carries
HOP_BY_HOP = frozenset({b"content-length", b"transfer-encoding", b"connection", b"keep-alive",
                        b"upgrade", b"te", b"trailer", b"proxy-connection"})
# Marks the PoP's own warm-up requests for handlers (`runtime.functions.warmup`): a
# handler may trust it, so a client that sends it is refused.
WARMUP_HEADER = b"x-edgefn-warmup"
# Connections past a cap wait at most this long (seconds) for their request before
# the 503; at most MAX_REFUSING wait at once, past that they are cut without one.
REFUSE_WAIT = 1.0
MAX_REFUSING = 256
# After a 413 the upload may still be arriving: it is read and dropped for at most this
# long (or this much) before the close, so the client reads the 413 instead of a reset
# (RFC 9112 9.6: a close with unread data sends an RST, which can discard the answer).
LINGER_SECONDS = 2.0
LINGER_BYTES = 64 << 20
# the front's refusals while the client may still be sending (a body, a target, a header
# section past its limit): read and dropped for a while, so that the client reads the
# answer rather than a reset (RFC 9112 9.6; a 431 arrived as a reset, past the 413)
LINGERED = frozenset({413, 414, 431})


class Outbox:
    """The connections with whole responses waiting for the loop's turn: the first
    one added schedules one `flush` (``call_soon``), which runs once the loop has
    handled everything it read in this iteration; each connection then writes what
    it holds in one write."""

    __slots__ = ("loop", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: list[HttpProtocol] = []

    def add(self, conn: HttpProtocol) -> None:
        waiting = self.waiting
        waiting.append(conn)
        if len(waiting) == 1:
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        waiting, self.waiting = self.waiting, []
        for conn in waiting:
            conn._flush()


class HttpProtocol(asyncio.Protocol):
    # slots: past 30 attributes an instance's dict stops sharing its keys, and every
    # attribute access on this hot path got slower (2.9 -> 3.8 us a request in process)
    __slots__ = ("address", "admitted", "app", "body_parts", "body_size", "busy", "call", "client",
                 "closing", "config", "continue_due", "current", "deadline", "deadline_status",
                 "dispatching", "drain_waiter", "ends", "eof", "head_size", "headers", "held",
                 "held_need", "in_body", "in_message", "lane", "lingered", "loop", "out",
                 "out_size", "parser", "queue", "reading", "refusing", "stalled", "state",
                 "task", "transport",
                 "upgrade_ignored", "url", "write_deadline", "write_paused")

    def __init__(self, app: Any, state: ServerState) -> None:
        # Global state
        self.app = app
        self.state = state
        self.config = state.config
        self.loop = state.loop
        self.parser = httptools.HttpRequestParser(self)
        # any version digits parse (1.2 was "Invalid HTTP version", a 400): `on_headers_
        # complete` serves a later 1.x as 1.1 and answers 505 to the rest
        self.parser.set_dangerous_leniencies(lenient_version=True)
        self.lane = state.lane  # the native lane, if the server has one

        # Per-connection state
        self.transport: asyncio.Transport | None = None
        self.client = ""
        self.address = ""  # the client's IP address, what the per-client cap counts
        self.queue: deque[Request | HttpReject] = deque()  # parsed, waiting for their turn
        self.busy = False  # a response is being produced by a task
        self.dispatching = False  # in `_dispatch` (a task started there may answer at once)
        self.task: asyncio.Task[None] | None = None
        self.call: tuple[Any, ...] | None = None  # the native lane's Python call in progress
        self.closing = False  # close after the response in progress
        self.reading = True
        self.write_paused = False
        self.out: list[bytes] = []  # whole responses waiting for the loop's turn (`Outbox`)
        self.out_size = 0
        self.write_deadline = 0.0  # loop.time() after which a client that reads nothing is cut
        self.admitted = False  # counted in the server's connection caps
        self.refusing = False  # past a cap: answered 503 once its first bytes are read
        self.lingered = -1  # after a 413: bytes read and dropped since (-1: not lingering)
        self.drain_waiter: asyncio.Future[None] | None = None
        # a request the lane waits to see whole (`_hold`): the reads so far, and the
        # bytes still to come (0: none held)
        self.held: list[bytes] = []
        self.held_need = 0
        self.deadline = 0.0  # loop.time() after which the client is too slow or idle
        self.deadline_status = 0  # 408 while a request is arriving, 0 while idle
        self.ends = 0  # messages read to their end (did a read end one?)

        # Per-request state (the request being parsed)
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_size = 0
        self.body_parts: list[bytes] = []
        self.body_size = 0
        self.current: Request | None = None
        self.in_message = False  # between its first byte and its end
        self.in_body = False  # its header section is complete (what follows a body: trailers)
        self.stalled = 0  # bytes read since one last did: a head or trailer line still growing
        self.upgrade_ignored = False  # a GET/HEAD asked to upgrade: answered, then closed
        # its head asked for 100-continue while earlier requests were answered: the 100
        # goes once they are (`_idle`)
        self.continue_due = False
        self.eof = False  # nothing more will be read (an ignored upgrade): close once answered

    # -- asyncio.Protocol -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "")
        self.address = peer[0] if isinstance(peer, tuple) else ""
        refused = self.state.admit(self.address)
        if refused is not None:
            self._refuse_connection(refused)
            return
        self.admitted = True
        self.state.connections.add(self)
        cap = self.config.write_buffer_bytes
        transport.set_write_buffer_limits(high=cap, low=cap // 4)  # type: ignore[attr-defined]
        self._idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.state.refusing.discard(self)
        if self.admitted:
            self.admitted = False
            self.state.connections.discard(self)
            self.state.release(self.address)
        self.transport = None
        self.out.clear()
        if self.task is not None and not self.task.done():
            self.task.cancel()  # the client went away: stop producing its response
        if self.call is not None:
            self.call[0].cancel()  # as the task's cancel would: `_lane_answered` says 499
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.refusing:
            return self._turn_away()  # what it sent is read, so the close is a clean FIN
        if self.lingered >= 0:  # the rest of a refused upload: dropped
            self.lingered += len(data)
            if self.lingered > LINGER_BYTES:
                self._close()
            return
        if self.held_need:  # a request the lane waits for: its body is not all here yet
            self.held.append(data)
            self.held_need -= len(data)
            if self.held_need > 0:
                return
            data = self._unhold()
        if self.lane is not None and not (self.in_message or self.queue or self.busy or
                                          self.closing or self.write_paused or self.eof):
            used = self._lane(data)
            if used > 0 and self.lane.closing:  # the connection's last request: nothing
                if self.call is None:  # after it is read (Python's parser would queue
                    self._finish(False)  # it, then drop it); answered by the C: closed
                return  # now, a call's once answered (`_lane_answered`)
            if used == len(data):
                return
            if used > 0:
                data = data[used:]  # the rest starts at a request's first byte
            need = self.lane.waiting if used >= 0 else 0
            if need:
                return self._hold(data, need)
        self._parse(data)

    def _parse(self, data: bytes) -> None:
        """`data` read by the Python front's parser, and what it completed dispatched."""
        # a message that was arriving, and how far: did this read move it on?
        was = self.head_size + self.body_size if self.in_message else -1
        ends = self.ends
        try:
            self.parser.feed_data(data)
        except HttpReject as r:
            self._refuse(r)
        except httptools.HttpParserUpgrade:
            if self.upgrade_ignored:  # answered as HTTP/1.1; what follows is not HTTP: close
                self.eof = True  # once what came before is answered
                self._stop_reading()
            else:
                self._refuse(HttpReject(400, "protocol upgrades are not supported"))
        except httptools.HttpParserInvalidMethodError as e:
            self._refuse(_unknown_method(data, e))
        except httptools.HttpParserError as e:
            # httptools wraps exceptions raised in callbacks; a HttpReject keeps its status.
            cause = e.__cause__ or e.__context__
            if isinstance(cause, HttpReject):
                self._refuse(cause)
            elif data.startswith(b"PRI * HTTP/2.0"):
                # an HTTP/2 client's preface (llhttp's own words, "Pause on PRI/Upgrade",
                # were a 400's): what any other version than 1.x gets
                self._refuse(HttpReject(505, "HTTP/2 is not supported: send HTTP/1.1"))
            else:
                self._refuse(HttpReject(400, f"malformed HTTP request: {e}"))
        else:
            if not self.in_message:
                self.stalled = 0
            elif was == self.head_size + self.body_size:
                # httptools holds a header line (or a trailer) until it ends, copying it at
                # every read: without this, one endless line grew the PoP by hundreds of MB
                # and held its loop, before `on_header` could measure anything
                self._stalled(len(data))
            elif was < 0 and ends == self.ends and not self.in_body:
                # the read began the message and holds nothing else: what of it no
                # callback counted is the request line's frame and the line still held
                # (an endless line that came whole in a first read waited for the 408)
                self.stalled = 0
                self._stalled(len(data) - len(self.url) - self.head_size)
            else:
                self.stalled = 0
        self._dispatch()

    def _stalled(self, size: int) -> None:
        """`size` more bytes read that no part of the message counted; past the head's
        limits together, a 431."""
        self.stalled += size
        if self.stalled > self.config.max_header_bytes + self.config.max_url_bytes:
            self._refuse(HttpReject(431, "request headers larger than "
                                         f"{self.config.max_header_bytes} bytes"))

    def _lane(self, data: bytes) -> int:
        """The whole requests at the start of `data` the native lane answers, their
        responses waiting for the loop's turn as `_write`'s do; the bytes they took
        (-1: the lane failed, all of `data` is Python's).
        The lane stops once it has written what backpressure allows, so the rest
        goes through `_answer_queued`, which waits for the client. It also stops
        after a request it handed to a Python function (`call`): the connection is
        busy with it, as with a task, until `_lane_answered`. (Called only while no
        message is arriving: the keep-alive deadline is set here, as `_idle` would.
        `_queue_out` and `_idle` are inlined: this runs for every read the lane
        takes, and their two frames were a tenth of the front's own time on it.)"""
        assert self.lane is not None
        state, config = self.state, self.config
        try:
            used, out, call = self.lane.serve(data, self.client, state.date, state.extra_head,
                                              config.write_buffer_bytes - self.out_size)
        except Exception:  # nothing was answered: all of it is Python's
            log.exception("native lane failed; the Python front answers instead")
            return -1
        if out:
            waiting = self.out
            waiting.append(out)
            self.out_size += len(out)
            if self.out_size >= config.write_buffer_bytes:
                self._flush()
            elif len(waiting) == 1:
                state.outbox.add(self)
            self.deadline = self.loop.time() + config.keepalive_timeout
            self.deadline_status = 0
        if call is not None:
            self.busy = True
            self.call = call
            call[0].add_done_callback(self._lane_answered)
        return used

    def _hold(self, data: bytes, need: int) -> None:
        """Keep `data`, a request whose head the lane takes and whose body is not all
        here yet (httpx writes the head and the body apart; a body may come in a
        later segment), until the rest of it is read: then the lane serves it whole,
        or the Python front reads it as it would have. Nothing is parsed meanwhile:
        the body's deadline (408) stands from now, as the front's own would from the
        head's end; the bytes kept are at most what the lane takes (its body limit),
        and joined once, when all came (`_unhold`). `need`: the bytes still to come."""
        self.held.append(data)
        self.held_need = need
        self.deadline = self.loop.time() + self.config.body_timeout
        self.deadline_status = 408

    def _unhold(self) -> bytes:
        """What `_hold` kept, joined, and nothing held any more."""
        self.held_need = 0
        data = b"".join(self.held)
        self.held.clear()
        return data

    def _queue_out(self, out: bytes) -> None:
        """A whole response for the loop's turn (`Outbox`), or now past the budget."""
        self.out.append(out)
        self.out_size += len(out)
        if self.out_size >= self.config.write_buffer_bytes:
            self._flush()
        elif len(self.out) == 1:
            self.state.outbox.add(self)

    def _lane_answered(self, future: asyncio.Future[Any]) -> None:
        """The native lane's Python call is done: its response written (the lane's,
        or the stages' through `_run`, as a task's is), then what waits."""
        call, self.call = self.call, None
        assert call is not None and call[0] is future and self.lane is not None
        state = self.state
        try:
            answer = self.lane.answer(call, self.transport is None, self.closing, state.date,
                                      state.extra_head)
        except Exception:  # its containment failed too: the connection cannot say more
            # than its close (`answer` contains the rest, nothing of it written yet)
            log.exception("native lane failed to answer a Python call")
            self.busy = False
            self._close()
            return
        if answer is None:  # the client is gone
            self.busy = False
        elif isinstance(answer, bytes):
            self._queue_out(answer)
            self.busy = False
            if call[16] & CONN_CLOSE or self.queue or self.eof:
                self._finish(not call[16] & CONN_CLOSE)  # (its answer says connection: close)
                self._dispatch()
            else:  # kept alive, nothing queued meanwhile (most answers): `_finish` is
                # `_idle` then (`answer` writes no bytes once closing), and `_dispatch`
                # has something to do only where reading was paused
                self._idle()
                if not self.reading:
                    self._dispatch()
        else:
            task = asyncio.Task(self._run(*answer), loop=self.loop, eager_start=True)
            if not task.done():
                self.task = task

    def eof_received(self) -> bool:
        """The client closed its side: it is gone. (A half-close, `nc -N`, reads the
        same as a client that hung up; answering it would keep generating an
        abandoned model answer to the end, so the connection closes and what runs for
        it is cancelled, as the events' 499 says.) What is already answered is sent
        first: the transport closes as this returns."""
        self._flush()
        return False

    def _stop_reading(self) -> None:
        if self.reading and self.transport is not None:
            self.reading = False
            self.transport.pause_reading()

    def pause_writing(self) -> None:
        self.write_paused = True
        self.write_deadline = self.loop.time() + self.config.send_timeout

    def resume_writing(self) -> None:
        self.write_paused = False
        self.write_deadline = 0.0
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_result(None)
        elif not self.busy:
            self._dispatch()  # pipelined requests held back while the client was not reading

    # -- httptools callbacks ----------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.head_size = 0
        self.body_parts = []
        self.body_size = 0
        self.in_message, self.in_body = True, False
        self.deadline = self.loop.time() + self.config.header_timeout
        self.deadline_status = 408

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > self.config.max_url_bytes:
            raise HttpReject(414, f"request target longer than {self.config.max_url_bytes} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_size += len(name) + len(value) + 4
        if self.head_size > self.config.max_header_bytes:
            raise HttpReject(431, "request headers larger than "
                             f"{self.config.max_header_bytes} bytes")
        if self.in_body:  # a trailer field: never merged into the header section
            return  # (RFC 9110 6.5.1; it got past the x-edgefn-warmup check there)
        # llhttp drops the whitespace before a value, not after it: a field value has
        # neither (RFC 9110 5.5), so "X-Api-Key: efn_k " is the key (lane.c trims alike)
        self.headers.append((name.lower(), value.rstrip(b" \t")))

    def on_headers_complete(self) -> None:
        """Raises `HttpReject` for what the front will not serve: CONNECT, a version
        but 1.x, a transfer coding but chunked, a target or Host that does not name
        one host (`_target`), an upgrade with a body. (The common request takes the
        cheap checks only: this runs for every request.)"""
        parser = self.parser
        self.in_body = True
        method, version = parser.get_method(), parser.get_http_version()
        if version != "1.1" and version != "1.0":
            if not version.startswith("1."):
                raise HttpReject(505, f"HTTP/{version} is not supported: send HTTP/1.1")
            version = "1.1"  # RFC 9110 2.5: a later minor version, served as the highest
        if method == b"CONNECT":  # its target is no path (host:port)
            raise HttpReject(501, "CONNECT is not supported: the PoP is not a proxy")
        host = b""
        hosts = 0
        length = None
        expect = chunked = odd = False
        for k, v in self.headers:
            if k == b"host":
                host = v
                hosts += 1
            elif k == b"content-length":
                length = int(v) if v.isdigit() else None
            elif k == b"transfer-encoding":
                if v.strip().lower() != b"chunked" or chunked:
                    raise HttpReject(501, "transfer coding not supported: only `chunked`")
                chunked = True
            elif k == b"expect":
                expect = v.lower() == b"100-continue"
            elif k == b"upgrade":
                odd = True
            elif k == WARMUP_HEADER:
                raise HttpReject(400, "header x-edgefn-warmup is reserved: it marks the "
                                 "PoP's own warm-up requests")
        url = self.url
        if not hosts and version == "1.1":
            raise HttpReject(400, "an HTTP/1.1 request needs a Host header (RFC 9112 3.2)")
        if hosts > 1 or not url.startswith(b"/") or 35 in url:  # 35: "#" (an int: 15x faster)
            path, query, target_host = _target(url, hosts, host)
            if target_host != host:  # absolute-form: its authority is the Host the app sees
                host = target_host
                self.headers = [(k, v) for k, v in self.headers if k != b"host"]
                self.headers.append((b"host", host))
        else:
            path, _, query = url.partition(b"?")
        if host not in _HOSTS:
            _check_host(host)
        # find() and ints: `b"/." in path` costs 300 ns (bytes.__contains__ tries the
        # needle as an int first), 15x these; 37 is "%", 92 a backslash
        if path.find(b"/.") >= 0 or 37 in path or 92 in path:
            _check_segments(path)
        if length is not None and length > self.config.max_body_bytes:
            raise HttpReject(413, f"request body larger than {self.config.max_body_bytes} bytes")
        keep_alive = parser.should_keep_alive()
        if chunked and version == "1.0":  # RFC 9112 6.1: faulty framing; close after it (a
            keep_alive = False  # 1.0 hop before the PoP saw no body: the rest, a request)
        self.upgrade_ignored = False
        if odd:
            keep_alive = self._upgrade(length, chunked, keep_alive)
        self.current = Request(method, path, query, self.headers, host, version, keep_alive,
                               self.client)
        self.deadline = self.loop.time() + self.config.body_timeout
        if expect and version == "1.1" and self.transport is not None:  # never a 1xx to
            if self.queue or self.busy:  # HTTP/1.0 (RFC 9110 15.2); after those before it
                self.continue_due = True  # (pipelined: it never came, and the client that
            else:  # waited for it got body_timeout's 408)
                self._send_now(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _upgrade(self, length: int | None, chunked: bool, keep_alive: bool) -> bool:
        """A request with `Upgrade`: answered as HTTP/1.1 when it has no body (RFC
        9110 7.8), then the connection closes (what follows is not HTTP); whether to
        keep the connection. Raises `HttpReject` (400) for an upgrade with a body
        (the parser would skip it)."""
        if not self.parser.should_upgrade():
            return keep_alive
        if length or chunked:
            raise HttpReject(400, "protocol upgrades are not supported (and the body of one "
                             "is not read)")
        self.upgrade_ignored = True
        return False

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)
        if self.body_size > self.config.max_body_bytes:
            raise HttpReject(413, f"request body larger than {self.config.max_body_bytes} bytes")
        self.body_parts.append(body)

    def on_message_complete(self) -> None:
        request = self.current
        assert request is not None
        self.current = None
        self.ends += 1
        self.in_message = self.in_body = False
        self.continue_due = False  # (its body came without it)
        parts = self.body_parts
        if parts:
            request.body = parts[0] if len(parts) == 1 else b"".join(parts)
        self.deadline = 0.0
        self.queue.append(request)
        if not self.busy and len(self.queue) == 1:
            self._dispatch()  # answer now, while still inside feed_data
        elif self.reading and self.transport and self._queue_full():
            self._stop_reading()  # backpressure on a pipelining flood

    def _queue_full(self) -> bool:
        """Over `max_pipelined` requests, or over one `max_body_bytes` of their bodies,
        wait on this connection: read no more until they are answered."""
        if len(self.queue) > self.config.max_pipelined:
            return True
        queued = sum(len(r.body) for r in self.queue if isinstance(r, Request))
        return queued > self.config.max_body_bytes

    # -- dispatch ---------------------------------------------------------------------------
    def _refuse(self, reject: HttpReject) -> None:
        """Queue an error response after the requests already parsed; read no more."""
        self.queue.append(reject)
        self._stop_reading()

    def _dispatch(self) -> None:
        if self.dispatching:  # from a task that answered at once: the loop below goes on
            return  # (a call per queued request nested: 2000 pipelined ones, a RecursionError)
        self.dispatching = True
        try:
            self._answer_queued()
        finally:
            self.dispatching = False

    def _answer_queued(self) -> None:
        while self.queue and not self.busy and not self.write_paused and self.transport:
            item = self.queue.popleft()
            if isinstance(item, HttpReject):
                self._write_error(item.status, item.message)
                return
            try:
                result = self.app(item)
            except Exception:
                log.exception("application raised while handling %s %s", item.method, item.path)
                result = _internal_error()
            if type(result) is Response and type(result.body) is bytes:
                self._write(item, result)
            else:
                self.busy = True
                # started at once, up to its first wait: a task cancelled before its first
                # step (the client gone meanwhile) never ran `result`, so no `finally` of
                # the stages' ran either: the function's concurrency slot was never given
                # back (enough resets left it answering 503 for good) and no event said 499
                task = asyncio.Task(self._run(item, result), loop=self.loop, eager_start=True)
                if not task.done():  # done: it answered, and may have started the next one
                    self.task = task
        if self.queue and self.write_paused:
            # The client is not reading what was already sent: answer nothing more, and
            # read nothing more, until it does (`resume_writing` comes back here).
            self._stop_reading()
        elif not self.queue and not self.reading and not self.closing and self.transport:
            self.reading = True
            self.transport.resume_reading()

    async def _run(self, request: Request, result: Response | Awaitable[Response]) -> None:
        try:
            response = result if isinstance(result, Response) else await result
            if not isinstance(response, Response):
                raise TypeError(f"application returned {type(response).__name__}, not Response")
        except asyncio.CancelledError:
            return
        except Exception:
            log.exception("application failed on %s %s", request.method, request.path)
            response = _internal_error()
        try:
            if isinstance(response.body, bytes):
                self._write(request, response)
            else:
                await self._stream(request, response, response.body)
        except asyncio.CancelledError:
            return
        finally:
            self.busy = False
            self.task = None
        self._dispatch()

    # -- writing ----------------------------------------------------------------------------
    def _head(self, request: Request, response: Response, keep_alive: bool) -> list[bytes]:
        """The status line and header section (without its final CRLF). Every response
        carries a ``date`` (RFC 9110 6.6.1: an origin with a clock sends one), the
        app's own if it set one (a stored response's)."""
        status = response.status
        state = self.state
        out = [STATUS_LINES.get(status) or b"HTTP/1.1 %d Unknown\r\n" % status, b""]
        if state.extra_head:
            out.append(state.extra_head)
        dated = False
        for name, value in response.headers:
            if name not in HOP_BY_HOP:
                out += (name, b": ", value, b"\r\n")
                if name == b"date":
                    dated = True
        if not dated:
            out[1] = state.date
        if not keep_alive:
            out.append(b"connection: close\r\n")
        elif request.http_version == "1.0":  # kept open: a 1.0 client assumes not unless told
            out.append(b"connection: keep-alive\r\n")
        return out

    def _write(self, request: Request, response: Response) -> None:
        transport = self.transport
        if transport is None:
            return
        body = response.body
        assert isinstance(body, bytes)
        keep_alive = request.keep_alive and not self.closing and not response.close
        head = self._head(request, response, keep_alive)
        status = response.status
        if status in NO_BODY_STATUS:
            body = b""
        else:
            if status == 205:  # RFC 9110 15.3.6: no content, framed as such
                body = b""
            head.append(b"content-length: %d\r\n" % len(body))
            if request.method == b"HEAD":
                body = b""
        head.append(b"\r\n")
        head.append(body)
        data = b"".join(head)
        out = self.out
        out.append(data)
        self.out_size += len(data)
        if self.out_size >= self.config.write_buffer_bytes:
            self._flush()
        elif len(out) == 1:
            self.state.outbox.add(self)
        self._finish(keep_alive)

    def _flush(self) -> None:
        """Write the responses waiting for the loop's turn, in one write."""
        out = self.out
        if out:
            data = out[0] if len(out) == 1 else b"".join(out)
            out.clear()
            self.out_size = 0
            if self.transport is not None:
                self.transport.write(data)

    def _send_now(self, data: bytes) -> None:
        """Write `data` after what waits (`Outbox`): a stream, a 1xx, an error."""
        assert self.transport is not None
        if self.out:
            self._flush()
        self.transport.write(data)

    async def _stream(self, request: Request, response: Response,
                      body: AsyncIterator[bytes]) -> None:
        keep_alive = (request.keep_alive and not self.closing and not response.close
                      and request.http_version == "1.1")
        chunked = request.http_version == "1.1" and response.status not in NO_BODY_STATUS
        keep_alive = keep_alive or (response.status in NO_BODY_STATUS and request.keep_alive
                                    and not self.closing and not response.close)
        head = self._head(request, response, keep_alive)
        if chunked:
            head.append(b"transfer-encoding: chunked\r\n")
        head.append(b"\r\n")
        send_body = request.method != b"HEAD" and response.status not in NO_BODY_STATUS
        empty = response.status == 205  # no content (RFC 9110 15.3.6): its chunks end at once
        try:
            self._send_now(b"".join(head))
            async for chunk in body:
                if request.method == b"HEAD":  # never sent: not waited for past the first
                    break  # chunk (an endless SSE stream held the connection to wall_ms; one
                    # failing late closed it). The first starts what each wrapper cleans up
                    # at `aclose` (an unstarted generator runs no `finally`: the isolate
                    # would not be told to stop, the event not emitted)
                if self.transport is None:
                    return
                if chunk and send_body and not empty:
                    data = b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk
                    self._send_now(data)
                    if self.write_paused:
                        await self._drain()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if isinstance(e, FunctionError):  # the function's own, logged as its own
                log.info("response stream of %s %s cut: %s", request.method, request.path, e)
            else:
                log.exception("response stream failed for %s %s", request.method, request.path)
            if self.transport is not None:
                self._close()  # the status line is gone: only a cut stream can signal
            return
        finally:
            aclose = getattr(body, "aclose", None)
            if aclose is not None:
                await aclose()
        if self.transport is None:
            return
        if chunked and send_body:
            self._send_now(b"0\r\n\r\n")
        self._finish(keep_alive)

    async def _drain(self) -> None:
        if self.write_paused and self.transport is not None:
            self.drain_waiter = self.loop.create_future()
            await self.drain_waiter
            self.drain_waiter = None

    def _finish(self, keep_alive: bool) -> None:
        if not keep_alive or self.closing:  # closing: shutdown began during this response
            self.closing = True
            self.queue.clear()
            self._close()
        elif not self.queue:
            if self.eof:  # nothing more is read (an ignored upgrade), and all is answered
                self._close()
            else:
                self._idle()

    def _write_error(self, status: int, message: str) -> None:
        """The front's own error (a request it would not read) and close: plain text,
        or, to a client that sent or accepts JSON, ``{"error": {...}}`` in OpenAI's
        shape (what an API client such as the `openai` package parses)."""
        if self.transport is None:
            return
        self.state.answered[status] += 1
        if any(k in (b"content-type", b"accept") and b"json" in v for k, v in self.headers):
            ctype = b"application/json"
            body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                         "param": None,
                                         "code": ERROR_CODES.get(status, "invalid_request")}
                               }).encode()
        else:
            ctype, body = b"text/plain; charset=utf-8", message.encode() + b"\n"
        self._send_now(
            b"HTTP/1.1 %d %s\r\n%scontent-type: %s\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s"
            % (status, REASONS.get(status, b"Unknown"), self.state.date, ctype,
               len(body), body))
        if status in LINGERED and self.transport.can_write_eof():
            self._linger()
        else:
            self._finish(False)

    def _linger(self) -> None:
        """Send the answer and a FIN, then read (and drop) what the client still sends
        for `LINGER_SECONDS` before closing (`on_deadline`), or until it closes."""
        assert self.transport is not None
        self.closing = True
        self.queue.clear()
        self._flush()
        self.transport.write_eof()
        self.lingered = 0
        self.deadline, self.deadline_status = self.loop.time() + LINGER_SECONDS, 0
        self.reading = True
        self.transport.resume_reading()

    def _refuse_connection(self, why: str) -> None:
        """A connection cap is reached: answer 503 once the request arrives (closing
        with its bytes unread would send a reset that loses the answer), or at once
        after `REFUSE_WAIT`. Past `MAX_REFUSING` such connections, cut at once."""
        self.state.refused += 1
        log.debug("refusing %s: %s", self.client, why)
        assert self.transport is not None
        if len(self.state.refusing) >= MAX_REFUSING:
            self.state.cut += 1
            self.transport.abort()
            self.transport = None
            return
        self.refusing = True
        self.state.refusing.add(self)
        self.deadline = self.loop.time() + min(REFUSE_WAIT, self.config.header_timeout)

    def _turn_away(self) -> None:
        """Answer 503 with Retry-After and close."""
        self.state.refusing.discard(self)
        self.refusing = False
        if self.transport is None:
            return
        self.state.answered[503] += 1
        body = b"server busy: too many connections\n"
        self._send_now(
            b"HTTP/1.1 503 Service Unavailable\r\n%scontent-type: text/plain; charset=utf-8\r\n"
            b"retry-after: %d\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
            % (self.state.date, self.config.retry_after, len(body), body))
        self._close()

    # -- timeouts and shutdown (driven by the server) ------------------------------------------
    def _idle(self) -> None:
        """Every request read so far is answered: wait for the next one."""
        if self.in_message:  # the next request is arriving: its own deadline (and 408) stand
            if self.continue_due and self.transport is not None:  # its 100, its turn now
                self.continue_due = False
                self.deadline = self.loop.time() + self.config.body_timeout
                self._send_now(b"HTTP/1.1 100 Continue\r\n\r\n")
            return
        self.deadline = self.loop.time() + self.config.keepalive_timeout
        self.deadline_status = 0

    def is_idle(self) -> bool:
        return not self.busy and not self.queue and self.deadline_status == 0

    def on_deadline(self) -> None:
        """The client was idle too long (close) or too slow sending a request (408)."""
        if self.refusing:
            return self._turn_away()
        if self.lingered >= 0:
            return self._close()
        if self.transport is None or self.busy:
            return
        if self.held_need:  # read as the front reads it: its error is the request's
            self._parse(self._unhold())
            if self.transport is None or self.busy:
                return
        if self.deadline_status and not self.queue:
            self._write_error(408, "request not received in time")
        elif not self.queue:
            self._close()
        self.deadline = 0.0

    def on_write_stalled(self) -> None:
        """The client read nothing for `send_timeout` while a response waited: cut it
        (its response task is cancelled in `connection_lost`)."""
        self.write_deadline = 0.0
        if self.transport is not None:
            log.info("closing %s: read nothing for %.0fs", self.client, self.config.send_timeout)
            self.transport.abort()

    def shutdown(self) -> None:
        """Close now if idle, else after the response in progress."""
        self.closing = True
        if self.is_idle():
            self._close()

    def _close(self) -> None:
        """Close the transport; from here on every write path is a no-op."""
        if self.transport is not None:
            self._flush()
            self.transport.close()
            self.transport = None


def _target(url: bytes, hosts: int, host: bytes) -> tuple[bytes, bytes, bytes]:
    """Path, query and host of a request that is not a plain one (RFC 9112 3.2, 3.3):
    `hosts` Host headers, the last `host`. Raises `HttpReject` (400) for more than
    one Host, a fragment, or a target that is neither origin-form nor absolute-form
    (asterisk-form, ``OPTIONS *``, as nginx does: functions answer for their paths);
    an absolute-form target's authority is the host (its Host header is ignored)."""
    if hosts > 1:
        raise HttpReject(400, "more than one Host header")
    if b"#" in url:
        raise HttpReject(400, "a request target has no fragment (#...)")
    if url.startswith(b"/"):
        path, _, query = url.partition(b"?")
    elif url == b"*":
        raise HttpReject(400, "the asterisk-form target (OPTIONS *) is not served: the PoP's "
                              "functions answer OPTIONS for their own paths")
    else:  # absolute-form (proxy style)
        try:
            parsed = httptools.parse_url(url)
        except httptools.HttpParserInvalidURLError:
            raise HttpReject(400, f"request target is neither a path nor an absolute URL: "
                                  f"{url[:100].decode('latin-1')!r}") from None
        scheme = (parsed.schema or b"").lower()  # (RFC 3986 3.1: case-insensitive)
        if scheme not in (b"http", b"https") or not parsed.host:
            raise HttpReject(400, "an absolute request target needs http(s)://host")
        path, query = parsed.path or b"/", parsed.query or b""
        name = b"[%s]" % parsed.host if b":" in parsed.host else parsed.host  # an IPv6 literal
        host = name + (b":%d" % parsed.port if parsed.port else b"")
    return path, query, host  # none at all: "" (no host-bound route matches it)


# RFC 9112 3.2 / RFC 3986 3.2.2: uri-host [":" port] (IP-literal, IPv4 or reg-name)
HOST = re.compile(rb"(?:\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9\-._~!$&'()*+,;=%]*)(?::[0-9]{0,5})?")
_HOSTS: set[bytes] = {b""}  # Host values already checked (at most MAX_HOSTS kept)
MAX_HOSTS = 1024


def _check_host(host: bytes) -> None:
    """Raises `HttpReject` (400) for a Host that is not ``host[:port]`` (RFC 9112 3.2:
    "a, b", "a@evil", "evil/x?" reached functions building links from it)."""
    if not HOST.fullmatch(host):
        raise HttpReject(400, f"invalid Host header {host[:100].decode('latin-1')!r}: "
                              "expected host[:port]")
    if len(_HOSTS) < MAX_HOSTS:
        _HOSTS.add(host)


def _check_segments(path: bytes) -> None:
    """Raises `HttpReject` (400) for a path with a ``.`` or ``..`` segment (``%2e``
    too, and between encoded slashes: ``/a/..%2fb``): routing matched it as sent,
    while a function decoding and normalising it (RFC 3986 5.2.4) acted on another
    route (``/hello/../probe`` was served by hello)."""
    decoded = path.replace(b"%2e", b".").replace(b"%2E", b".")
    for sep in (b"%2f", b"%2F", b"%5c", b"%5C", b"\\"):
        decoded = decoded.replace(sep, b"/")
    for segment in decoded.split(b"/"):
        if segment in (b".", b".."):
            raise HttpReject(400, "a request path has no `.` or `..` segments (RFC 3986 "
                                  "5.2.4): send it normalised")


# a request line with a method token the parser does not know (not garbage, not TLS)
REQUEST_LINE = re.compile(rb"(?:^|\n)([!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}) [^ \r\n]+ "
                          rb"HTTP/1\.[01]\r?\n")

# what llhttp parses (its HTTP methods; RTSP's are not accepted on a request parser)
PARSED_METHODS = frozenset(b"""DELETE GET HEAD POST PUT CONNECT OPTIONS TRACE COPY LOCK MKCOL MOVE
    PROPFIND PROPPATCH SEARCH UNLOCK BIND REBIND UNBIND ACL REPORT MKACTIVITY CHECKOUT MERGE
    M-SEARCH NOTIFY SUBSCRIBE UNSUBSCRIBE PATCH PURGE MKCALENDAR LINK UNLINK SOURCE QUERY
    PRI""".split())


def _unknown_method(data: bytes, e: Exception) -> HttpReject:
    """501 for a well-formed request line whose method is not one HTTP knows (RFC 9110
    9.1); 400 for anything else the parser refused at the method."""
    methods = [m.group(1) for m in REQUEST_LINE.finditer(data)]
    method = next((m.decode("ascii") for m in methods if m not in PARSED_METHODS), None)
    if method is None:
        return HttpReject(400, f"malformed HTTP request: {e}")
    return HttpReject(501, f"request method {method!r} is not recognized (HTTP methods: GET, "
                           "HEAD, POST, PUT, PATCH, DELETE, OPTIONS, ...)")


def _internal_error() -> Response:
    return Response(500, [(b"content-type", b"text/plain; charset=utf-8")],
                    b"internal server error\n")
