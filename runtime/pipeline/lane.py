"""The native lane's Python side: `NativeLane`, one PoP's C `Lane` (runtime.net.lane).

- the front's call: `serve` (the requests at the start of a read the C answers) and
  the table check before it, the drain's schedule;
- Python functions' calls the C starts (`_submit`, `_command`) and their answers
  (`answer`, `_finish`: the stages' own code where the C cannot write one);
- what the C asks the stages for while it serves: ratelimit's admission and 429
  (`_limit_admits`, `_refusal`), auth's 401 counted by a rule (`_guard_refusal`),
  bots' verdicts and 403s (`_classify`, `_verdict`, `_block`);
- the drain: the records of the requests the C answered, as the events, access-log
  lines and metric groups the stages would have made (`drain`, `LaneEvents`,
  `groups_of`).

Which targets the lane serves, and how its table is made from the registry's routes
and the stages' plans: runtime/pipeline/lane_table.py (`LaneTable`, a mixin of
`NativeLane`).
"""
from __future__ import annotations

import asyncio
import ctypes
import logging
import time
from asyncio import _get_running_loop as running_loop
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from wasmtime import _ffi as ffi

from edgefn_core.abi import GuestRequest, decode_request
from edgefn_core.errors import Rejected
from runtime.cache.http.cache import client_view
from runtime.executors.base import Caller, principal_blob
from runtime.executors.python.function import PythonFunction
from runtime.executors.python.isolate import response_of
from runtime.executors.python.wire import FRAME_HEAD
from runtime.executors.wasm import native_wasi
from runtime.executors.wasm.function import WasmFunction
from runtime.executors.wasm.native import Result
from runtime.functions.registry import Deployment
from runtime.net import lane as native
from runtime.net.lane import CONN_CLOSE, CONN_HTTP10
from runtime.net.message import Request, Response
from runtime.observe.batch import EventBatch, Group
from runtime.observe.event import Event
from runtime.observe.metrics import DURATION_BUCKETS
from runtime.observe.ring import PLAIN_TEXT
from runtime.pipeline.chain import Chain
from runtime.pipeline.contain import contain, rendered
from runtime.pipeline.lane_table import (
    CACHE_FIRST,
    CLASSES,
    ROUTE_MISS,
    ROUTE_PASSED,
    LaneTable,
)
from runtime.pipeline.stage import Context
from runtime.pipeline.stages.auth import Auth
from runtime.pipeline.stages.bots import Bots
from runtime.pipeline.stages.dispatch import counted, tagged
from runtime.pipeline.stages.events import CLIENT_GONE, Events
from runtime.pipeline.stages.http_cache import NOT_STORED, HttpCacheStage
from runtime.pipeline.stages.ratelimit import PASSED, RateLimit
from runtime.pipeline.stages.request_id import RequestId

if TYPE_CHECKING:
    from runtime.pop import PoP

log = logging.getLogger("edgefn.http")

# lane.c's METHOD_NAMES: a record's method code; from POST on, unsafe (http_cache bypasses)
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
POST = METHODS.index("POST")
BYPASSED = {"outcome": "BYPASS"}  # an unsafe method's http_cache record, as the metrics count it
LINE_FORMATS = {"text": 1, "json": 2}  # lane_drain.c.h's: the access-log lines `make` writes
# what a browser's other headers make of it (`Classifier.classify`), in lane.c's BV_* order
BROWSER_VERDICTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("browser", ()), ("automation", ("browser_headers_missing",)),
    ("automation", ("no_sec_fetch",)), ("automation", ("hints_mismatch",)))
NO_UA = ("automation", ("empty_ua",))  # `Classifier.classify` without a User-Agent
MAX_VERDICTS = 256
# the fields `EventMaker.make` writes into its copy of an Event, in lane.c's F_* order
MADE_FIELDS = ("ts", "rid", "client", "bot", "method", "host", "path", "query", "status",
               "target", "owner", "route", "decisions", "stages_ms", "bytes_in",
               "bytes_out", "duration_ms", "error")
DRAIN_EVERY = 0.001  # seconds: under load, the records drained at most this often
STATUS_LINES = tuple(b"HTTP/1.1 %d %s\r\n" % (s, HTTPStatus(s).phrase.encode())
                     if s in HTTPStatus._value2member_map_ else None for s in range(600))


class NativeLane(LaneTable):
    """One PoP's lane: the C `Lane`, its eligible routes, and the drain of its
    records into events. Loop thread only."""

    def __init__(self, module: Any, chain: Chain, pop: PoP) -> None:
        """Raises RuntimeError when llhttp or the reactor entry do not fit the C."""
        if chain.planner is None:
            raise RuntimeError("the chain is timed (tracing or stage timings): every stage "
                               "runs for every request")
        stages = {type(s): s for s in chain.stages}
        rid, bots, events = stages.get(RequestId), stages.get(Bots), stages.get(Events)
        if not isinstance(rid, RequestId) or not isinstance(bots, Bots) or \
                pop.wasm.native is None:
            raise RuntimeError("the pipeline has no request_id and bots stages, or the WASM "
                               "native call is off")
        self.chain, self.pop, self.registry = chain, pop, pop.registry
        self.request_id, self.bots = rid, bots
        # None: no events stage; the records are counted and dropped (`drain`)
        self.events = events if isinstance(events, Events) else None
        self.classifier = bots.manager.classifier
        self.verdicts: list[tuple[str, tuple[str, ...]]] = [NO_UA]
        # per verdict: its class and the bots stage's record (shared, as a stage's may be)
        self.records_of: list[tuple[str, dict[str, Any]]] = [_bots_record(*NO_UA)]
        # per bot class, the principal dispatch gives a WASI command (`_caller`: no agent)
        self.callers = {c: Caller({"bot": c}) for c in CLASSES}
        # per verdict, for `EventMaker.make`: its class, an event's decisions without and
        # with http_cache's MISS, then both with ratelimit's pass (copied for each event)
        self.verdict_texts: tuple[tuple[Any, ...], ...] = ()
        self._verdict_texts()
        self.texts: dict[str | bytes, str] = {}
        entry = pop.wasm.native.lib.edgefn_reactor_call
        http = pop.config.http
        self.c = module.Lane(native.httptools_parser(), _address(entry),
                             _address(ffi.dll.wasm_trap_delete),
                             _address(ffi.dll.wasmtime_error_delete),
                             ctypes.sizeof(Result),
                             tuple(principal_blob({"bot": c}) for c in CLASSES),
                             self._classes(), self._classify, STATUS_LINES, rid.prefix,
                             rid.header, http.max_url_bytes, http.max_header_bytes,
                             http.max_body_bytes, rid.trust,
                             all(s.jwt is None for s in chain.stages if isinstance(s, Auth)))
        self.c.python(self._submit)
        self.c.guard_ask(self._guard_refusal)
        # per verdict, bots' 403 (`_block`): what the C writes for a class a route blocks
        self.blocks = [self._block(*r) for r in self.records_of]
        self.c.blocks(tuple(self.blocks))
        self.ratelimit = stages.get(RateLimit)
        # (route index, client) -> the checks its requests make (`_limit_admits`), as
        # the counters take them and as the stage hits them: a connection's client is one
        # str, its hash kept
        self.limit_checks: dict[tuple[int, str], tuple[list[Any], list[Any]]] = {}
        self.refusing: set[int] = set()  # route indexes whose 429 the C writes
        # guarded routes (`_guarded_routes`): auth's 401, by route index; for those
        # whose refusal ratelimit counts, each client's checks (by ip) and the 429s'
        # records (by route, limit and error)
        self.guards: dict[int, tuple[Any, ...]] = {}
        self.guard_checks: dict[str, list[Any]] = {}
        self.guard_refusals: dict[tuple[int, str, str], tuple[dict[str, Any], str]] = {}
        # a refusal's record, per limit: its decisions and error (shared by its events,
        # and by its records, which the C groups by it)
        self.refusals: dict[str, tuple[dict[str, Any], str]] = {}
        if isinstance(self.ratelimit, RateLimit) and not self.ratelimit.limiter.remote:
            counters = self.ratelimit.limiter.counters
            self.lane_checks = self.ratelimit.lane_checks
            self.admits_all = counters.admits_all
            self.limit_fields = self.ratelimit.settings.headers  # RateLimit fields written
            self.c.limiter(self._limit_admits, counters.count)
        # WASI commands the C runs itself (`_cgi`): wasi.c's run and the ticker's marks
        wasi, self.commands = native_wasi.enabled(), False
        if wasi is not None:
            lib = pop.wasm.native.lib
            try:
                self.c.commands(_address(wasi.lib.edgefn_wasi_run),
                                wasi.lib.edgefn_wasi_result_size(),
                                _address(lib.edgefn_guest_begin), _address(lib.edgefn_guest_end),
                                tuple(b"EDGEFN_PRINCIPAL_BOT\0%s\0" % c.encode() for c in CLASSES))
                self.commands = True
            except ValueError as e:  # (a wasi.c the lane was not built for)
                log.warning("native lane: WASI commands are Python's calls (%s)", e)
        native.check_layout(module)
        rid.counter = self.c  # one sequence of ids, whichever path a request takes
        self.http_cache = next((s for s in chain.stages if isinstance(s, HttpCacheStage)), None)
        self.routes: list[tuple[Deployment, str, str, int]] = []  # parallel to the C's
        # per route, the limits ratelimit counts its requests against (`anonymous`)
        self.limits: list[list[tuple[Any, ...]]] = []
        # per route, for `EventMaker.make`: path, target, owner, route, flags: ROUTE_MISS
        # (http_cache counts a MISS: `first_answer`), ROUTE_PASSED (ratelimit passes it)
        self.route_texts: tuple[tuple[str, str, str | None, str | None, int], ...] = ()
        ev = self.events
        self.maker = module.EventMaker(
            Event(ts=0.0, rid="", pop=ev.pop, tier=ev.tier, geo=ev.geo, client="",
                  method="GET", host="", path="", status=0), MADE_FIELDS, DURATION_BUCKETS
        ) if ev is not None else None
        # what the C served, until `drain` (lane_records.c.h: packed, no object a request)
        self.new_records: Callable[[], Any] = module.Records
        self.records: Any = module.Records()
        self.served = 0  # requests the lane answered
        self.calls = 0  # requests to Python functions whose call the lane started
        # the call `_submit` started in this `serve` (the C starts one at most, last),
        # with the deployment whose concurrency slot it took (None: a WASI command's,
        # whose run on a thread holds its own, as dispatch's `counted`)
        self.submitted: tuple[Deployment | None, asyncio.Future[Any]] | None = None
        self.scheduled = False  # a drain is scheduled (`serve`)
        self.stamp_checked = False  # a read of this loop turn checked the stamp (`_turned`)
        # the PoP's (the events stage's), also without one: what reads them drains first
        self.observers = pop.observers
        self.drained = 0.0  # the loop's time of the last drain
        # what the table was made for: the routes, the canaries, the stages' stamp
        self.router: object = None
        self.canaries: object = None
        self.stamped: object = None
        self.stamp = chain.planner.stamp

    # -- the front's call (runtime.net.protocol) --------------------------------------------
    def serve(self, data: bytes, client: str, date: bytes, extra: bytes, budget: int
              ) -> tuple[int, bytes, tuple[Any, ...] | None]:
        """The whole requests at the start of `data` the lane answers: how many bytes
        of `data` they took, their responses, and the call started for the last one
        when it is a Python function's (its future first: `answer` once it is done).
        Raises what the C raises (a Python error in it, MemoryError).

        The table is checked against the routes and canaries at every read, and
        against the stages' stamp (a clock read, and the key file's state: 0.4 us
        of each read's 10) at the first read of each turn of the loop, not at those
        after it until the turn ends (`stamp_checked`): the reads of one poll of
        the loop, all sent before any answer to them went out (`Outbox`; a Python
        call's answer comes in a later turn), so no client can tell them from
        reads made before the stamp moved."""
        registry = self.registry
        if registry.router is not self.router or registry.canaries is not self.canaries or \
                (not self.stamp_checked and self.stamp is not None and
                 self.stamp() != self.stamped):
            self._rebuild()
        records = self.records
        try:
            used, out, call = self.c.serve(data, date, extra, budget, records, client)
        except BaseException:  # a call submitted meanwhile reaches no one (no `answer`):
            lost, self.submitted = self.submitted, None  # stopped, its slot given back
            if lost is not None:
                if lost[0] is not None:
                    lost[0].inflight -= 1
                lost[1].cancel()
            raise
        self.submitted = None
        if records and not self.scheduled:
            self._schedule()
            self.stamp_checked = self.scheduled  # by this read, in this poll, to its end
        elif not self.stamp_checked and self.stamp is not None:
            # checked by this read (a call started, or a drain already waits for a later
            # turn): not again in this poll
            loop = running_loop()
            if loop is not None:
                self.stamp_checked = True
                loop.call_soon(self._turned)
        return used, out, call

    @property
    def waiting(self) -> int:
        """The body bytes the request the last `serve` stopped at still needs, when the
        C would take it once they come (lane.c `held`), else 0."""
        return self.c.waiting

    @property
    def closing(self) -> bool:
        """Whether the last request the last `serve` took was not kept alive: its
        connection closes once that is answered, and nothing after it is read."""
        return bool(self.c.closing)

    def _schedule(self) -> None:
        """Drain once this loop turn has run what it read (one pass for all), or,
        when the last drain was less than DRAIN_EVERY ago, once that is past: under
        load one drain takes a millisecond's requests (its cost is mostly per pass:
        the C's call, the observers', the access log's write; a turn held a few
        requests, a Python call's answer one). Sooner when Python makes an event
        meanwhile, or anything reads the observers (`Observers.first`: the admin
        API's events, metrics and cache counts flush them): in order."""
        loop = running_loop()
        if loop is None:  # a direct call (a test): now
            self.drain()
            return
        self.scheduled = True
        self.observers.first = self.drain
        due = self.drained + DRAIN_EVERY
        if loop.time() >= due:
            loop.call_soon(self.drain)
        else:
            loop.call_at(due, self.drain)
            loop.call_soon(self._turned)

    def _turned(self) -> None:
        """The loop's turn has run what it read: the next read checks the stamp."""
        self.stamp_checked = False

    # -- Python functions' calls --------------------------------------------------------
    def _submit(self, ri: int, call: tuple[Any, ...]) -> asyncio.Future[Any] | None:
        """The C's one call for a request to a Python route: its frame (`call[12]`,
        the encoded request framed as the isolate reads it) submitted to the
        function's pool, as `dispatch` submits it (its whole response to come back
        undecoded: `answer` has the C check and write it), or a WASI command's run
        (`_command`); None (the request is Python's) past
        `limits.concurrency`, whose 503 is dispatch's. The concurrency slot a Python
        function's call takes comes back in `answer`, or in `serve` when the C fails
        after this returned (its call then reaches no `answer`)."""
        fn, route = self.routes[ri][0], self.routes[ri][1]
        if fn.inflight >= fn.concurrency:
            return None
        executor = fn.executor
        future: asyncio.Future[Any]  # a Response, or a Python function's whole one as bytes
        if isinstance(executor, WasmFunction):
            future = self._command(fn, executor, route, call)
            self.submitted = (None, future)
        else:
            assert isinstance(executor, PythonFunction) and executor.pool is not None
            # no CDN-Loop: lane.c leaves such requests to Python
            future = executor.pool.submit_frame(call[12])  # (its Lineage: at a first fetch)
            self.submitted = (fn, future)
            fn.inflight += 1
        self.calls += 1
        return future

    def _command(self, fn: Deployment, wasm: WasmFunction, route: str, call: tuple[Any, ...]
                 ) -> asyncio.Future[Response]:
        """`call`'s request run by the WASI command `wasm`, as dispatch runs it (the
        request as the front makes it, the caller dispatch's for its bot class): a
        future done with its answer or what it raised when it ran inline, else the
        run on a worker thread, holding a concurrency slot until it ends (dispatch's
        `counted`). What it raises reaches `answer` (contained in `_finish`)."""
        g = decode_request(call[12][FRAME_HEAD:])
        request, verdict = _request(call, g), call[5]
        # what the route captured (lane.c `encode`): the Router's text of the path's bytes
        params = {k.decode("latin-1"): v.decode("latin-1") for k, v in g.params}
        loop = asyncio.get_running_loop()
        try:
            result = wasm.handle(request, route, params,
                                 self.callers[self.records_of[verdict][0]])
        except Exception as e:
            done = loop.create_future()
            done.set_exception(e)
            return done
        if isinstance(result, Response):
            done = loop.create_future()
            done.set_result(result)
            return done
        fn.inflight += 1
        return asyncio.ensure_future(counted(result, fn))

    def answer(self, call: tuple[Any, ...], gone: bool, closing: bool, date: bytes,
               extra: bytes) -> bytes | tuple[Request, Response] | None:
        """The answer to `call` (serve's), whose future is done: the response as the
        front writes it (the C's, its record appended), or the request and the
        response the front is to write (`_finish`: Python's stages made it), or None
        when its client is `gone` (its event says 499). `closing`: the connection
        closes after it (Python writes that). A failure making the answer (`respond`,
        `_finish`) is contained as dispatch's link contains one (the function's 502,
        its event and log line); raises only what that containment raises."""
        future, (fn, _, _, _, max_response) = call[0], call[1]
        if not isinstance(fn.executor, WasmFunction):  # first: whatever follows, the slot
            fn.inflight -= 1  # is given back once (a command's thread run gives its own)
        if gone or future.cancelled():
            if not future.cancelled():
                future.exception()  # retrieved: it is the 499's now, not a loose error
            if self.events is not None:
                request, ctx = self._context(call)
                self.events.emit(request, ctx, Response(CLIENT_GONE), call[10], 0)
            return None
        kept = len(self.records)
        try:
            if not closing and future.exception() is None:
                response = future.result()  # a whole response as the guest framed it, or
                if type(response) is bytes:  # a Response (a WASI command's, a stream)
                    out = self.c.respond_frame(call, response, max_response, date, extra,
                                               self.records)
                elif type(response.body) is bytes:
                    out = self.c.respond(call, response.status, response.headers,
                                         response.body, date, extra, self.records)
                else:
                    out = None
                if out is not None:
                    if not self.scheduled:
                        self._schedule()
                    return bytes(out)
            return self._finish(call)
        except Exception as e:  # a bug here: contained as dispatch's link contains one (its
            self.records.truncate(kept)  # event, its log line), never the C's record of it too
            request, ctx = self._context(call)
            return request, self._observed(contain(ctx, e), request, ctx, call)

    def _finish(self, call: tuple[Any, ...]) -> tuple[Request, Response]:
        """`call`'s response as the stages after the front make it (dispatch and its
        containment, http_cache, request_id, events), by their own code."""
        future, (fn, _, _, cache, _), *_ = call
        request, ctx = self._context(call)
        try:
            answered = future.result()
            if type(answered) is bytes:  # a Python function's whole response, as it came
                executor = fn.executor
                assert isinstance(executor, PythonFunction) and executor.pool is not None
                answered = response_of(answered, executor.pool.cfg)
            response = tagged(answered, fn.tag)
        except Exception as e:  # what dispatch's link contains
            response = contain(ctx, e)
        http = self.http_cache
        if cache == CACHE_FIRST and http is not None and call[6] >= POST:
            response = http.bypass_answer(response, request, ctx, fn)
        elif cache == CACHE_FIRST and http is not None:
            response = http.first_answer(response, request, ctx, fn, http.settings_for(fn),
                                   call[11] / 1e9, False)
        else:  # a Cache-Tag is the HTTP cache's, on or off, never the client's
            response = client_view(response)
        if call[15]:  # ratelimit's fields, after http_cache's (`_add`)
            response.headers.extend(tuple(line.split(b": ", 1))
                                    for line in call[15].split(b"\r\n") if line)
        return request, self._observed(response, request, ctx, call)

    def _observed(self, response: Response, request: Request, ctx: Context,
                  call: tuple[Any, ...]) -> Response:
        """`response` as request_id and events, the stages before dispatch, leave it:
        tagged with its id, its event (and access-log line) made."""
        response = self.request_id.tagged(response, ctx.request_id)
        if self.events is None:
            return response
        return self.events.answered(response, request, ctx, call[10])

    def _context(self, call: tuple[Any, ...]) -> tuple[Request, Context]:
        """The request of `call` and the context the stages before dispatch leave."""
        _, (fn, route, _, _, _), _, _, n, verdict, _, _, _, client, _, started, *_ = call
        request = _request(call)
        ctx = Context(client)
        ctx.started = started / 1e9  # CLOCK_MONOTONIC, perf_counter's clock
        # the caller's id (bytes), kept; else the number request_id gave it
        ctx.request_id = n if type(n) is bytes else b"%s-%x" % (self.request_id.prefix, n)
        ctx.resolved, ctx.target, ctx.route = True, fn, route
        cls, record = self.records_of[verdict]
        ctx.bot = cls
        ctx.decide("bots", record)
        if call[15] is not None:  # counted by ratelimit as it was submitted
            ctx.decide("ratelimit", PASSED)
        return request, ctx

    # -- the stages' answers the C asks for (refusals, limits) ---------------------------
    def _guard_refusal(self, ri: int, client: str) -> tuple[Any, ...]:
        """The C's question for a request without a credential to guarded route `ri`
        whose refusal ratelimit counts (`on_refused`: `RateLimit.refused`, as
        `lane_refusal` hits the PoP's rules by ip): auth's 401 once counted, or, where
        one of them is full, the 429 auth answers instead (its record and ratelimit's)."""
        refusal = self.guards[ri]
        stage = self.ratelimit
        assert isinstance(stage, RateLimit)
        ip = client.rpartition(":")[0] or client
        checks = self.guard_checks.get(ip)
        if checks is None:
            if len(self.guard_checks) >= 4096:
                self.guard_checks.clear()
            checks = self.guard_checks[ip] = stage.ip_checks(ip)
        made = stage.lane_refusal(checks, time.time())
        if made is None:
            return refusal
        status, head, body, name, code = made
        key = (ri, name, code)
        pair = self.guard_refusals.get(key)
        if pair is None:
            if len(self.guard_refusals) >= 4096:
                self.guard_refusals.clear()
            pair = self.guard_refusals[key] = ({**refusal[3][0], "ratelimit": {"limited": name}},
                                               code)
        return status, head, body, pair

    def _block(self, cls: str, record: dict[str, Any]) -> tuple[Any, ...]:
        """Bots' 403 for a verdict (its class and the stage's `record` of it), as the
        C writes it (lane.c `block`): the `Rejected` the manager raises (`enforce`),
        rendered as `contain` renders it, and the stage's record with the action
        ``block``."""
        try:
            verdict: Any = (cls, None, record["signals"], None)
            self.bots.manager.enforce("block", verdict, "", None)  # type: ignore[arg-type]
        except Rejected as e:
            return (*rendered(e), ({"bots": {**record, "action": "block"}}, e.code))
        raise RuntimeError("bots' block refused nothing")

    def _limit_admits(self, ri: int, client: str) -> tuple[list[Any], float, bool] | None:
        """The C's question for a limited route's request from `client`, before the
        function runs: would ratelimit's counters admit it now (counting nothing)?
        Then the arguments of their `count`, which the C calls once it answered it
        (the checks, this instant, whether to write the fields), else None."""
        key = (ri, client)
        entry = self.limit_checks.get(key)
        if entry is None:
            if len(self.limit_checks) >= 4096:
                self.limit_checks.clear()
            entry = self.limit_checks[key] = self.lane_checks(
                self.limits[ri], client.rpartition(":")[0] or client)
        checks, hits = entry
        now = time.time()
        if self.admits_all(checks, now):
            return checks, now, self.limit_fields
        if ri not in self.refusing:
            return None
        return self._refusal(hits, now)

    def _refusal(self, hits: list[Any], now: float) -> tuple[Any, ...] | None:
        """What the C answers a request ratelimit refuses at `now` with (`hits`: its
        checks as the stage hits them, counted here): the stages' 429 (status, header
        lines, body) and its record (`refusals`); None when admitted after all, which
        cannot be (`RateLimit.lane_refusal`)."""
        assert isinstance(self.ratelimit, RateLimit)
        refused = self.ratelimit.lane_refusal(hits, now)
        if refused is None:  # (counted: it cannot be left to Python, to count it again)
            raise RuntimeError("ratelimit admitted a request its counters refused")
        status, head, body, name, code = refused
        refusal = self.refusals.get(name)
        if refusal is None or refusal[1] != code:
            if len(self.refusals) >= 4096:
                self.refusals.clear()
            refusal = self.refusals[name] = ({"ratelimit": {"limited": name}}, code)
        return status, head, body, refusal

    # -- bots -------------------------------------------------------------------------------
    def _classes(self) -> tuple[int, ...]:
        return tuple(CLASSES.index(c) for c, _ in self.verdicts)

    def _classify(self, ua: bytes) -> int | tuple[int, int, int, int, int, bool]:
        """The verdict of a request whose User-Agent is `ua` (-1: Python's), or for a
        browser's, whose other headers count (`Classifier.classify`), the verdicts
        they choose from (lane.c `browser_verdict`: a browser; automation without
        Accept or Accept-Language, without Sec-Fetch-Mode, with hints that disagree),
        the Chrome version it claims and whether it sends Sec-Fetch-*."""
        view = self.classifier.view(ua)
        if not view.browser:
            return self._verdict((view.cls, view.signals))
        browser, missing, no_fetch, hints = (self._verdict(v) for v in BROWSER_VERDICTS)
        return browser, missing, no_fetch, hints, view.chrome, view.sec_fetch

    def _verdict(self, verdict: tuple[str, tuple[str, ...]]) -> int:
        """The index of `verdict` (class, signals) in the lane's table, added if new;
        -1 when the table is full."""
        try:
            return self.verdicts.index(verdict)
        except ValueError:
            if len(self.verdicts) >= MAX_VERDICTS:
                return -1
        self.verdicts.append(verdict)
        self.records_of.append(_bots_record(*verdict))
        self.blocks.append(self._block(*self.records_of[-1]))
        self._verdict_texts()
        self.c.verdicts(self._classes())
        self.c.blocks(tuple(self.blocks))
        return len(self.verdicts) - 1

    def _verdict_texts(self) -> None:
        self.verdict_texts = tuple(
            (cls, {"bots": record}, {"bots": record, "http_cache": NOT_STORED},
             {"bots": record, "ratelimit": PASSED},
             {"bots": record, "ratelimit": PASSED, "http_cache": NOT_STORED})
            for cls, record in self.records_of)

    # -- events -----------------------------------------------------------------------------
    def drain(self) -> None:
        """The records of the requests the lane served since the last drain, as the
        `Event`s the events stage would have made, handed to the observers as that
        stage hands them, in one `EventBatch` (with, from the C, the access log's
        lines and the metrics' groups: what each event would have added). Runs as
        `_schedule` says, or earlier, from the observers, when Python observes an
        event first (a request answered after them) or they are read (`flush`).
        Without an events stage, only what http_cache counts of them
        (`_count_cache`)."""
        self.scheduled = self.stamp_checked = False
        self.observers.first = None
        loop = running_loop()
        if loop is not None:
            self.drained = loop.time()
        records, self.records = self.records, self.new_records()
        self.served += len(records)
        ev, maker = self.events, self.maker
        if ev is None or maker is None:  # (both or neither)
            self._count_cache(records.served())
            return
        if not records:
            return
        sample, redact = ev.sample, ev.redact
        prefix = self.request_id.prefix.decode()
        # every event as it is made (no sampling, no redaction): made when read
        later = LaneEvents(maker, self.route_texts, self.verdict_texts, prefix) \
            if sample >= 1.0 and redact is None else None
        fmt = ev.observers.line_format if redact is None else None
        events, lines, made, text = maker.make(
            records, self.route_texts, self.verdict_texts, self.texts, prefix,
            LINE_FORMATS.get(fmt or "", 0), later)
        groups: list[Group] | None = self._groups(made)
        if later is not None and text <= PLAIN_TEXT:
            ev.observers.observe_batch(EventBatch.later(later, records, lines, groups,
                                                        fmt or "text"))
            return
        if later is not None:  # a long path, query or host: the ring bounds it now
            events = later.events(records)
        if sample < 1.0:
            rand = ev.rand
            for event in events:
                if event.status < 500 and rand() >= sample:
                    event.sampled = False
        if redact is not None:  # the lines and groups are of the events before it
            events, groups = [redact(e) for e in events], None
        ev.observers.observe_batch(EventBatch(events, lines, groups, line_format=fmt or "text"))

    def _groups(self, made: list[tuple[Any, ...]]) -> list[Group]:
        """The C's groups as `Group`s, counted in http_cache's stats (`_count_cache`)."""
        self._count_cache((ri, method, n) for ri, _, method, n, *_, refused in made
                          if refused is None)  # (a refused request reached no cache)
        return groups_of(made, self.route_texts, self.verdict_texts)

    def _count_cache(self, served: Iterable[tuple[int, int, int]]) -> None:
        """Each MISS of http_cache's (`first_answer`'s count), and each BYPASS (an
        unsafe method: `_bypass`'s), of the requests `served` (route index, method
        code, requests: each) counted in its stats."""
        stats = self.http_cache.stats if self.http_cache is not None else None
        if stats is None:
            return
        counts: dict[tuple[str, str], int] = {}  # (function, outcome) -> requests
        for ri, method, n in served:
            if self.route_texts[ri][4] & ROUTE_MISS:
                key = (self.routes[ri][0].name, "BYPASS" if method >= POST else "MISS")
                counts[key] = counts.get(key, 0) + n
        for (name, outcome), n in counts.items():
            stats.record("http", outcome, function=name, n=n)


class LaneEvents:
    """The events of one drain's records, made when they are read (`Deferred`: the
    ring keeps this and the `Records` as one `Chunk`), by the C that makes them at
    once otherwise: the same `Event`s."""

    __slots__ = ("maker", "prefix", "routes", "verdicts")

    def __init__(self, maker: Any, routes: tuple[tuple[Any, ...], ...],
                 verdicts: tuple[tuple[Any, ...], ...], prefix: str) -> None:
        self.maker, self.routes, self.verdicts, self.prefix = maker, routes, verdicts, prefix

    def events(self, records: Any) -> list[Event]:
        """The events of `records`: a `Records`, or a list of the tuples it reads as."""
        made: list[Event] = self.maker.make(records, self.routes, self.verdicts, {},
                                            self.prefix, False)[0]
        return made


def _request(call: tuple[Any, ...], g: GuestRequest | None = None) -> Request:
    """The request of a Python route's `call` (lane.c `python_call`) as the front
    makes it: its frame (the request encoded; `g`, decoded already) decoded, with its
    Host, client, version and whether it is kept alive (`call[16]`, lane.c `conn_of`)."""
    if g is None:
        g = decode_request(call[12][FRAME_HEAD:])
    conn = call[16]
    request = Request(g.method, g.path, g.query, g.headers, call[7],
                      "1.0" if conn & CONN_HTTP10 else "1.1", not conn & CONN_CLOSE, call[9])
    request.body = g.body
    return request


def groups_of(made: list[tuple[Any, ...]], route_texts: tuple[tuple[Any, ...], ...],
              verdict_texts: tuple[tuple[Any, ...], ...]) -> list[Group]:
    """`EventMaker.make`'s groups of records as the metrics' `Group`s, the routes and
    verdicts named by the texts `make` was given."""
    groups = []
    for ri, status, method, n, size, verdicts, buckets, durations, refused in made:
        _, target, _, route, flags = route_texts[ri]
        first, passed = flags & ROUTE_MISS, 2 if flags & ROUTE_PASSED else 0
        if refused is not None:  # a stage's refusal, no http_cache (`refuse`)
            decided = [({**verdict_texts[v][1], **refused[0]}, k)
                       for v, k in verdicts.items()]
        elif first and method >= POST:  # what the metrics read of `_bypass`'s record
            decided = [({**verdict_texts[v][1 + passed], "http_cache": BYPASSED}, k)
                       for v, k in verdicts.items()]
        else:
            at = (2 if first else 1) + passed
            decided = [(verdict_texts[v][at], k) for v, k in verdicts.items()]
        groups.append(Group(target, route, status, METHODS[method], n, size, buckets,
                            durations, decided))
    return groups


def _address(fn: Any) -> int:
    """A ctypes function's address (0: none)."""
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


def _bots_record(cls: str, signals: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    """A verdict's class and the record `bots` makes of it (its action: allow)."""
    return cls, {"class": cls, "agent": None, "signals": signals, "action": "allow"}


def for_pop(pop: PoP) -> NativeLane | None:
    """`pop`'s lane, or None (logged) when ``[http] native_lane = "off"``, the
    environment turns it off, or it cannot be built."""
    if pop.config.http.native_lane == "off" or native.disabled():
        return None
    module = native.load()
    if module is None:
        return None
    try:
        return NativeLane(module, pop.pipeline, pop)
    except RuntimeError as e:
        log.warning("the native lane is off: %s", e)
        return None
