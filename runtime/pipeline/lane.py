"""Which targets the native lane serves, and what their requests leave behind.

The native lane (`runtime.net.lane`, C) answers a request without a Python frame
per request when nothing Python does for it would make a difference. Whether that
holds is decided here, per target, from the target's plan (`Chain.kept`): a
deployed function is *eligible* when every stage its requests go through has an
exact native form, and its executor is one the lane can call:

    health       its paths are never a function's route
    request_id   the lane takes its numbers from the same counter, with the same prefix,
                 and keeps a caller's well-formed id as the stage does (lane.c `kept_id`)
    events       the lane's record of each request becomes the same `Event` (made in C:
                 lane.c `EventMaker`), handed to the same observers (ring, metrics,
                 access log, file) as one `EventBatch` at the end of a loop turn, or
                 under load once a millisecond (`DRAIN_EVERY`), with the access log's
                 lines and the metrics' groups the C made of them, and before any
                 event Python makes, and before anything reads the observers (their
                 flush): in the order of the answers.
                 Without an events stage the records are only counted (http_cache's
                 MISS and BYPASS) and dropped, and no event is made, as in Python
    auth         a function whose mode is ``none`` (a request without a credential goes
                 on untouched, whatever keys exist; so does one whose ``Authorization``
                 or ``x-api-key`` holds no ``efn_`` where no ``[auth.jwt]`` is set: it
                 proves no one, and dispatch leaves it to the function. The C leaves
                 any other credential to Python, where auth proves the principal).
                 A function whose mode asks for a credential (key, jwt) is in the
                 table only to refuse: a request without one gets auth's 401 from the
                 C, any other is Python's (`_guarded_routes`, `_guard`, lane.c
                 `guarded`)
    ratelimit    no rule a request without a principal meets (a key's or tenant's
                 limits need a credential, Python's); or, on memory storage, rules
                 by ip or function (the PoP's, the function's own): the C asks the
                 stage's counters before the function runs whether they would admit
                 the request now (`_limit_admits`: `admits_all`, counting nothing;
                 else the stage hits them as it would and the C writes its 429, the
                 function never run, where only stages before ratelimit act on a
                 refusal: `_refuses`, `_refusal`, lane.c `refuse`; else the request is
                 Python's, which refuses it), counts it as the
                 C answers it, or as a Python function's call is submitted (their
                 `count`: the same counters, the same instant; the call carries the
                 fields, `_finish` adds them too), and writes the RateLimit fields it
                 adds; its event carries the stage's pass. Not a rule by agent, not
                 on Redis
    cors         a request without an Origin header (cors hands it on untouched), or
                 one whose path is outside the stage's `paths`; one with an Origin on
                 them (a preflight, or a response cors tags) goes to Python
    bots         a User-Agent Python classified (`Classifier.view`, which depends on the
                 string alone; a browser's by its other headers too, in C as
                 `Classifier.classify` decides it: lane.c `browser_verdict`), whose
                 class's action for the target is ``allow``; no ``abusive_rate`` (it
                 counts requests). A class whose action is ``block`` gets bots' 403
                 from the C, where no ratelimit or http_cache comes before bots
                 (`_blocked`, `_block`, lane.c `block`)
    residency    no tenant header, no de-sensitised mark (those go to Python), no
                 samples ingest on the path
    http_cache   off for the function (its Cache-Tag dropped), or nothing of the
                 deployment stored and no default TTL (`first_answer`: MISS, counted in the
                 cache's stats; with workers, stored by any worker: `SharedLabels`,
                 whose stamp the lane checks at each read); a request with Range,
                 Cache-Control or a validator, a deployment with entries, or a GET
                 answered with Cache-Control or Expires (stored: the function runs
                 again in Python) are Python's
    dispatch     a WASM reactor without host imports on the native call, run inline,
                 no canary, nothing in flight on a worker thread; or a Python function
                 whose pool is running (no canary): the C encodes the request and
                 hands its frame to the pool (`_submit`, under `limits.concurrency`),
                 and writes the answer (`respond`) when it comes back; or a WASI
                 command (no canary): without host imports or sleeps and with an env
                 no request hides (`_cgi`), the C runs it as `handle` runs it inline
                 (lane.c `command_call`: the CGI variables of a UTF-8 request, the
                 run, the CGI answer parsed); any other, and whatever the C leaves
                 (a failed run, stderr, an answer parse_response refuses), `_submit`
                 runs as dispatch runs it (inline, or its future on a worker
                 thread). What the C
                 cannot write exactly as the stages would (a failure, contained; a
                 streamed body; an answer the HTTP cache stores; a table changed
                 meanwhile; a connection closing) is finished in Python by the
                 stages' own code (`_finish`), from the same call: never run twice

Any other kept stage (waf, auth with a key or JWT mode, ratelimit but as above, the
caches, tracing, a timed chain, an ``access_log`` stage without ``events``) makes the
target ineligible: its requests take the Python path, as does every request the C
does not take (see lane.c: a body past Content-Length framing or the limits, a method
but GET, HEAD, POST, PUT, PATCH and DELETE, a path it has no route for, odd headers,
a credential, an Origin where cors acts, a failed call). An unsafe
method where http_cache counts is its BYPASS: the header (lane.c), the event's record
(`EventMaker`), the count (`_groups`), `bypass_answer` when Python finishes the call.

A literal route also serves the paths under it (every route is a prefix: ``/api``
serves ``/api/todos/7``; ``/`` every path) but those the Router gives another target
(`_under`: another route's subtree under it, a built-in path or prefix; none where a
route ties it); the request's path then goes into its record, call and event (lane.c
`path_object`). A route with captures or a final wildcard (``/users/:id``,
``/files/*``) serves its matches but those a route that outranks it takes
(`_beside`), its captures (a wildcard's rest as ``*``) encoded as the request's params
(lane.c `matches`, `encode`), or for a WASI command the C runs, its variables
(`cgi_strings`: EDGEFN_PARAM_<NAME>, EDGEFN_WILDCARD; `_command` passes them on).

The table is made again when the plans would be: the routes or the canaries change
(a deploy, rollback or removal), or a stage's stamp does; the check runs before each
read the lane serves, so no request is served by a version already switched away.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import time
from asyncio import _get_running_loop as running_loop
from collections.abc import Iterable
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
from runtime.executors.wasm.native import NativeReactorCall, Result
from runtime.functions.manifest import Route, parse_path
from runtime.functions.registry import Deployment
from runtime.functions.router import Router
from runtime.net import lane as native
from runtime.net.lane import CONN_CLOSE, CONN_HTTP10
from runtime.net.message import Request, Response
from runtime.observe.batch import EventBatch, Group
from runtime.observe.event import Event
from runtime.observe.metrics import DURATION_BUCKETS
from runtime.observe.ring import PLAIN_TEXT
from runtime.pipeline.chain import Chain
from runtime.pipeline.contain import contain, rendered
from runtime.pipeline.stage import Context, Stage
from runtime.pipeline.stages.auth import Auth
from runtime.pipeline.stages.bots import Bots
from runtime.pipeline.stages.cors import Cors
from runtime.pipeline.stages.dispatch import Dispatch, counted, tagged
from runtime.pipeline.stages.events import CLIENT_GONE, Events
from runtime.pipeline.stages.health import Health
from runtime.pipeline.stages.http_cache import NOT_STORED, HttpCacheStage
from runtime.pipeline.stages.ratelimit import PASSED, RateLimit
from runtime.pipeline.stages.request_id import RequestId
from runtime.pipeline.stages.residency import Residency

if TYPE_CHECKING:
    from runtime.pop import PoP

log = logging.getLogger("edgefn.http")

# lane.c's METHOD_NAMES: a record's method code; from POST on, unsafe (http_cache bypasses)
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
POST = METHODS.index("POST")
BYPASSED = {"outcome": "BYPASS"}  # an unsafe method's http_cache record, as the metrics count it
CACHE_NONE, CACHE_OFF, CACHE_FIRST = range(3)  # lane.c's: what http_cache does for a route
# lane.c's: a route's flags (its tuple's `origin`)
ROUTE_ORIGIN, ROUTE_PREFIX, ROUTE_PATTERN, ROUTE_LIMITED, ROUTE_REFUSES = 1, 2, 4, 8, 16
ROUTE_GUARD_COUNTS = 32
ROUTE_MISS, ROUTE_PASSED = 1, 2  # lane_drain.c.h's: a route's flags in `route_texts`
LINE_FORMATS = {"text": 1, "json": 2}  # lane_drain.c.h's: the access-log lines `make` writes
# lane.c's EX_*: a path under a prefix route another target takes: exactly; it and the
# paths under it; every path it starts
EXCLUDE_PATH, EXCLUDE_TREE, EXCLUDE_PREFIX, EXCLUDE_SEGMENT = range(4)  # (+ i: segment i's)
ANY_SEGMENT = b":"  # EXCLUDE_SEGMENT's for any non-empty segment (no literal is ":")
type Exclusions = tuple[tuple[bytes, int], ...]
type Segmented = tuple[tuple[str, tuple[str, ...]], ...]  # routes, each with its segments
# what a browser's other headers make of it (`Classifier.classify`), in lane.c's BV_* order
BROWSER_VERDICTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("browser", ()), ("automation", ("browser_headers_missing",)),
    ("automation", ("no_sec_fetch",)), ("automation", ("hints_mismatch",)))
CLASSES = ("browser", "verified_agent", "declared_agent", "automation", "abusive")
NO_UA = ("automation", ("empty_ua",))  # `Classifier.classify` without a User-Agent
MAX_VERDICTS = 256
# the fields `EventMaker.make` writes into its copy of an Event, in lane.c's F_* order
MADE_FIELDS = ("ts", "rid", "client", "bot", "method", "host", "path", "query", "status",
               "target", "owner", "route", "decisions", "stages_ms", "bytes_in",
               "bytes_out", "duration_ms", "error")
DRAIN_EVERY = 0.001  # seconds: under load, the records drained at most this often
STATUS_LINES = tuple(b"HTTP/1.1 %d %s\r\n" % (s, HTTPStatus(s).phrase.encode())
                     if s in HTTPStatus._value2member_map_ else None for s in range(600))


class NativeLane:
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
        self.records: list[tuple[Any, ...]] = []  # what the C served, until `drain`
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
            del self.records[kept:]  # event, its log line), never the C's record of it too
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
        elif cache == CACHE_OFF:
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

    # -- eligibility ------------------------------------------------------------------------
    def refresh(self) -> None:
        """Make the table now for what the registry routes, as `serve` would at its next
        read: `PoP.warm` calls this after each switch, so the first request after a
        deploy finds it made (0.15-0.25 ms with two functions, paid by that request
        before). Loop thread only."""
        self._rebuild()

    def _rebuild(self) -> None:
        if self.records:
            self.drain()  # they name routes by their index in the table being replaced
        registry = self.registry
        self.router, self.canaries = registry.router, registry.canaries
        self.stamped = self.stamp() if self.stamp is not None else None
        routes: list[tuple[Deployment, str, str, int]] = []
        table: list[tuple[Any, ...]] = []
        self.guards, self.guard_refusals = {}, {}  # by route index: those change
        limits: list[list[tuple[Any, ...]]] = []
        router = self.registry.router
        if not router.host_bound:
            taken = self._taken()
            for fn in self.registry.functions.values():
                allowed = self.allowed(fn)
                if not allowed:
                    self._guarded_routes(fn, taken, routes, table, limits)
                    continue
                cache = self._cache_mode(fn)
                limited = self._limits(fn)
                refuses = bool(limited) and self._refuses(fn)
                blocked = self._blocked(fn)
                for path, route, under, pattern in self._table_routes(fn, taken):
                    if len(table) >= 256:
                        break
                    routes.append((fn, route, path, cache))
                    limits.append(limited)
                    table.append(self._entry(fn, path, route, allowed, cache, under,
                                             pattern=pattern, limited=bool(limited),
                                             refuses=refuses, blocked=blocked))
        self.c.routes(table)
        self.routes, self.limits = routes, limits
        self.guard_checks.clear()  # (a rule changed by a config reload: its new limits)
        self.refusing = {i for i, entry in enumerate(table) if entry[12] & ROUTE_REFUSES}
        self.limit_checks.clear()  # by route index: those changed
        counts = self.http_cache is not None and self.http_cache.stats is not None
        self.route_texts = tuple((path, fn.label, fn.tenant, route or None,
                                  (ROUTE_MISS if cache == CACHE_FIRST and counts else 0) |
                                  (ROUTE_PASSED if limited else 0))
                                 for (fn, route, path, cache), limited in zip(routes, limits,
                                                                               strict=True))
        log.debug("native lane: %d routes (%s)", len(routes),
                  ", ".join(sorted({r[0].label for r in routes})) or "none")

    def allowed(self, fn: Deployment) -> int:
        """The bot classes (a bit each, `CLASSES`) whose requests for `fn` the lane may
        serve; 0 when it serves none (`fn` is not eligible)."""
        kept = self.chain.kept(fn)
        if kept is None or not _lane_executor(fn) or fn.name in self.registry.canaries:
            return 0
        if any(not self._native(s, fn) for s in kept):
            return 0
        manager = self.bots.manager
        if manager.settings.abusive_rate or not any(isinstance(s, Bots) for s in kept):
            return 0  # abusive_rate counts every request; without bots ctx.bot is None
        policy = manager.policy(fn.policy.bots)
        return sum(1 << i for i, c in enumerate(CLASSES) if getattr(policy, c) == "allow")

    def _native(self, stage: Stage, fn: Deployment) -> bool:
        """Whether the lane does exactly what `stage` does for requests for `fn`."""
        if isinstance(stage, Residency):
            return stage.ingest is None
        if isinstance(stage, HttpCacheStage):
            # with workers, a deployment another worker stored moves the stamp
            # (`HttpCache.labels_stamp`), and the C then finds it in `caching`
            s = stage.settings_for(fn)
            return not s.enabled or s.default_ttl is None
        if isinstance(stage, Auth):  # (the C leaves a credential to Python)
            return stage.untouched_anonymous(fn)
        if isinstance(stage, RateLimit):  # a request with a principal is Python's too; the
            # C asks the stage about those without (`_limit_admits`)
            return stage.anonymous(fn) is not None
        return isinstance(stage, Health | RequestId | Events | Bots | Dispatch | Cors)

    def _refuses(self, fn: Deployment) -> bool:
        """Whether the lane answers what ratelimit refuses of `fn`'s requests as the
        stages do: a 429 only the stages before ratelimit act on (request_id's id, the
        bots record, the event), when the stages after it are http_cache and dispatch,
        which a refused request never reaches (the default order; in another, a stage
        after it, request_id or bots, would not see the refusal, and an http_cache
        before it would mark and count it)."""
        kept = self.chain.kept(fn) or []
        if self.ratelimit not in kept:
            return False
        at = kept.index(self.ratelimit)
        return all(isinstance(s, HttpCacheStage | Dispatch) for s in kept[at + 1:]) and \
            not any(isinstance(s, HttpCacheStage) for s in kept[:at])

    def _guarded_routes(self, fn: Deployment, taken: Any, routes: list[Any],
                        table: list[Any], limits: list[Any]) -> None:
        """`fn`'s routes (appended to the tables `_rebuild` makes) where the lane only
        refuses: a function whose auth asks for a credential (`_guard`), its requests
        without one answered with auth's 401, every other Python's."""
        guard = self._guard(fn)
        if guard is None:
            return
        allowed, refusal, counts = guard
        blocked = self._blocked(fn)
        for path, route, under, pattern in self._table_routes(fn, taken):
            if len(table) >= 256:
                break
            routes.append((fn, route, path, CACHE_NONE))
            limits.append([])
            self.guards[len(table)] = refusal
            flags = self._flags(fn, path, under, pattern) | \
                (ROUTE_GUARD_COUNTS if counts else 0)
            table.append((path.encode("latin-1"), 0, 0, 0, 0, 0, 0, b"", fn.label.encode(), fn,
                          allowed, CACHE_NONE, flags, None, fn.label, fn.executor, None, None,
                          under, blocked, refusal))

    def _table_routes(self, fn: Deployment, taken: Any
                      ) -> list[tuple[str, str, Exclusions | None, bool]]:
        """`fn`'s routes the table may hold, each as (path, route, exclusions, pattern):
        its literal ones (those it serves under them but `_under`'s), then those with
        captures whose matches it serves but `_beside`'s (none: left out)."""
        out: list[tuple[str, str, Exclusions | None, bool]] = [
            (path, route, _under(path, *taken) if route == path else None, False)
            for path, route in self._paths(fn)]
        for route in self._patterns(fn):
            beside = _beside(route, *taken)
            if beside is not None:
                out.append((route, route, beside, True))
        return out

    def _flags(self, fn: Deployment, path: str, under: Exclusions | None, pattern: bool
               ) -> int:
        """A route's ROUTE_* flags for its place: ROUTE_PATTERN, or ROUTE_PREFIX for a
        literal one serving paths under it; ROUTE_ORIGIN where cors acts (`_origin`: on
        a pattern's literal head and what lies under it)."""
        if pattern:
            segments = parse_path(path).segments
            head = "/" + "/".join(segments[:_literal_head(segments)])
            return self._origin(fn, head, True) | ROUTE_PATTERN
        prefix = under is not None
        return self._origin(fn, path, prefix) | (ROUTE_PREFIX if prefix else 0)

    def _guard(self, fn: Deployment) -> tuple[int, tuple[Any, ...], bool] | None:
        """For a function whose auth asks for a credential (mode ``key``, ``jwt``):
        the bot classes (a bit each) bots lets on to auth, auth's 401 to a request
        without one as the C writes it (`refuse`: the stages' error response, auth's
        record of it, its error), and whether a ratelimit after auth counts that
        refusal (`on_refused`: the PoP's rules by ip, in memory; `_guard_refusal`),
        where the lane writes it as the stages do: the stages before auth are those it
        models (health, request_id, events, bots, cors: bots among them, `ctx.bot`),
        bots counts nothing (no ``abusive_rate``), no canary, no Redis to count on.
        None otherwise: every request for it is Python's."""
        kept = self.chain.kept(fn)
        if kept is None or fn.name in self.registry.canaries or \
                self.bots.manager.settings.abusive_rate:
            return None
        auth = next((s for s in kept if isinstance(s, Auth)), None)
        if auth is None:
            return None
        before = kept[:kept.index(auth)]
        if not all(isinstance(s, Health | RequestId | Events | Bots | Cors) for s in before) \
                or not any(isinstance(s, Bots) for s in before):
            return None
        counts = auth.on_refused is not None and isinstance(self.ratelimit, RateLimit) and \
            bool(self.ratelimit.ip_rules)
        if counts and self.ratelimit.limiter.remote:  # type: ignore[union-attr]
            return None
        refused = auth.anonymous_refusal(fn)
        if refused is None:
            return None
        mode, e = refused
        policy = self.bots.manager.policy(fn.policy.bots)
        allowed = sum(1 << i for i, c in enumerate(CLASSES) if getattr(policy, c) == "allow")
        return allowed, (*rendered(e), ({"auth": {"mode": mode, "result": e.code}}, e.code)
                         ), counts

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

    def _blocked(self, fn: Deployment) -> int:
        """The bot classes (a bit each, `CLASSES`) whose requests for `fn` bots blocks
        (403), where the lane writes that as the stage does (`_block`): where no
        ratelimit comes before bots in its plan (one would count them first), nor an
        http_cache (it would mark and count the 403)."""
        kept = self.chain.kept(fn) or []
        stage = next((s for s in kept if isinstance(s, Bots)), None)
        if stage is None or any(isinstance(s, RateLimit | HttpCacheStage)
                                for s in kept[:kept.index(stage)]):
            return 0
        policy = stage.manager.policy(fn.policy.bots)
        return sum(1 << i for i, c in enumerate(CLASSES) if getattr(policy, c) == "block")

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

    def _limits(self, fn: Deployment) -> list[tuple[Any, ...]]:
        """What ratelimit counts `fn`'s requests without a principal against (its
        `anonymous`): [] when nothing, or it is not in `fn`'s plan."""
        stage = self.ratelimit
        if not isinstance(stage, RateLimit) or stage not in (self.chain.kept(fn) or ()):
            return []
        return stage.anonymous(fn) or []

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

    def _cache_mode(self, fn: Deployment) -> int:
        stage = self.http_cache
        kept = self.chain.kept(fn) or []
        if stage is None or stage not in kept:
            return CACHE_NONE
        return CACHE_FIRST if stage.settings_for(fn).enabled else CACHE_OFF

    def _paths(self, fn: Deployment) -> list[tuple[str, str]]:
        """`fn`'s literal routes, each with the route a request for exactly that path
        resolves to (the Targets' own lookup: built-in paths and prefixes first)."""
        out = []
        targets = self.chain.planner.targets if self.chain.planner is not None else None
        for r in fn.manifest.route_list():
            path = r.path
            if r.host or not path.startswith("/") or ":" in path or "*" in path or \
                    len(path.encode("latin-1", "replace")) > 255:
                continue
            raw = path.encode("latin-1")
            request = Request(b"GET", raw, b"", [(b"host", b"lane")], b"lane", "1.1", True,
                              "lane:0")
            ctx = Context("lane:0")
            if targets is not None and targets.resolve(request, ctx) is fn and not ctx.params:
                out.append((path, ctx.route))
        return out

    def _taken(self) -> tuple[Segmented, tuple[str, ...], tuple[str, ...]]:
        """What claims paths besides a route (`_under`, `_beside`): every function's
        routes (as written, patterns too, each with its segments: parsed once a
        rebuild, not once per pair); the built-in endpoints and health paths, each
        exactly (`Registry.reserved`, `Targets.builtin`); the built-in APIs' prefixes
        taken before function routes (`Targets.before`)."""
        routes = tuple((r.path, parse_path(r.path).segments)
                       for f in self.registry.functions.values() for r in f.manifest.route_list())
        exact = {p.decode("latin-1") for p in self.registry.reserved}
        targets = self.chain.planner.targets if self.chain.planner is not None else None
        before: tuple[str, ...] = ()
        if targets is not None:
            exact |= {p.decode("latin-1") for p in targets.builtin}
            before = tuple(p.decode("latin-1") for p, _ in targets.before)
        return routes, tuple(sorted(exact)), before

    def _patterns(self, fn: Deployment) -> list[str]:
        """`fn`'s routes with captures or a final wildcard (``/users/:id``,
        ``/files/*``; no host) the C may match (lane.c `matches`: a WASI command gets
        them as EDGEFN_PARAM_* and EDGEFN_WILDCARD, `cgi_strings`), of at most 16
        segments and 255 bytes."""
        out = []
        for r in fn.manifest.route_list():
            pattern = parse_path(r.path)
            if r.host or pattern.literal or len(pattern.segments) > 16 \
                    or len(r.path.encode("latin-1", "replace")) > 255 or r.path.endswith("/"):
                continue
            out.append(r.path)
        return out

    def _entry(self, fn: Deployment, path: str, route: str, allowed: int, cache: int,
               under: Exclusions | None = None, pattern: bool = False, limited: bool = False,
               refuses: bool = False, blocked: int = 0) -> tuple[Any, ...]:
        """The C's route tuple for `fn`'s route `path`: a literal one (`under`: it also
        serves the paths under it but these), or with `pattern` one with captures, whose
        matches but `under` it serves (lane.c `find_route`); `limited`: ratelimit
        counts its requests (`_limit_admits`); `refuses`: the C writes the 429s it
        refuses them with (`_refuses`); `blocked`: the bot classes whose 403 the C
        writes (`_blocked`)."""
        executor = fn.executor
        assert isinstance(executor, PythonFunction | WasmFunction)
        caching = self.http_cache.cache.caching if self.http_cache is not None else None
        origin = self._flags(fn, path, under, pattern)
        if limited:
            origin |= ROUTE_LIMITED | (ROUTE_REFUSES if refuses else 0)
        if isinstance(executor, PythonFunction):  # a call (`_submit`)
            assert executor.pool is not None  # (`_lane_executor`)
            return (path.encode("latin-1"), 0, 0, 0, 0, 0, 0, executor.env_blob,
                    fn.label.encode(), fn, allowed, cache, origin, caching, fn.label, executor,
                    (fn, route, path, cache, executor.pool.cfg.max_response), None, under,
                    blocked)
        if executor.abi == "wasi":  # run by the C (`_cgi`), else, and what it leaves, a call
            cgi = self._cgi(executor, route)
            engine, pre = executor.raw_pre if cgi is not None else (0, 0)
            return (path.encode("latin-1"), engine or 0, pre or 0, executor.memory_limit,
                    executor.slice_ticks, executor.max_response, 0, executor.env_blob,
                    fn.label.encode(), fn, allowed, cache, origin, caching, fn.label,
                    executor,
                    (fn, route, path, cache, 0), cgi, under, blocked)
        wasm = executor
        assert isinstance(wasm.call, NativeReactorCall)
        call = wasm.call
        times = ctypes.addressof(call.times) if call.times is not None else 0
        return (path.encode("latin-1"), call.engine or 0, call.pre or 0, call.memory_limit,
                call.deadline_ticks, call.max_response, times, wasm.env_blob,
                fn.label.encode(), fn, allowed, cache, origin, caching, fn.label, wasm, None,
                None, under, blocked)

    def _origin(self, fn: Deployment, path: str, prefix: bool = False) -> int:
        """1 when a `cors` stage `fn`'s requests go through acts on a request for
        `path` (`prefix`: or for one under it) that carries an Origin header (a
        preflight, or a response to tag: its `paths` hold it), which the C then leaves
        to Python; else 0 (cors hands the request on untouched)."""
        raw = path.encode("latin-1")
        under = raw if raw.endswith(b"/") else raw + b"/"  # "/": every path
        for s in self.chain.kept(fn) or ():
            if not isinstance(s, Cors):
                continue
            if raw.startswith(s.paths) or (prefix and any(
                    p.startswith(under) or under.startswith(p) for p in s.paths)):
                return 1
        return 0

    def _cgi(self, wasm: WasmFunction, route: str) -> tuple[bytes, int, bytes] | None:
        """What the C needs to run the WASI command `wasm` itself, as `handle` runs it
        inline on the native path (lane.c `command_call`: argv[0] and the manifest env,
        NUL-ended, their pair count, X_MATCHED_ROUTE), or None when it may not: no
        native run, host imports (bindings), sleeps (`poll_oneoff` is Python's), or a
        manifest env `environ` would filter per request (a name a request sets) or C
        would cut (a NUL)."""
        if not self.commands or wasm.native_wasi is None or wasm.host_functions is not None:
            return None
        if any(i.module == "wasi_snapshot_preview1" and i.name == "poll_oneoff"
               for i in wasm.module.imports):
            return None
        env = wasm.env
        if any(_request_sets(k) or "\0" in k or "\0" in v for k, v in env.items()):
            return None
        strings = "\0".join([wasm.name, *(s for pair in env.items() for s in pair)]) + "\0"
        return strings.encode(), len(env), route.encode()

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
        records, self.records = self.records, []
        self.served += len(records)
        ev, maker = self.events, self.maker
        if ev is None or maker is None:  # (both or neither)
            self._count_cache((r[2], r[7], 1) for r in records if r[13] is None)
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
            ev.observers.observe_batch(EventBatch.later(events, records, lines, groups,
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
    ring keeps (this, record) pairs), by the C that makes them at once otherwise:
    the same `Event`s."""

    __slots__ = ("maker", "prefix", "routes", "verdicts")

    def __init__(self, maker: Any, routes: tuple[tuple[Any, ...], ...],
                 verdicts: tuple[tuple[Any, ...], ...], prefix: str) -> None:
        self.maker, self.routes, self.verdicts, self.prefix = maker, routes, verdicts, prefix

    def events(self, records: list[tuple[Any, ...]]) -> list[Event]:
        made: list[Event] = self.maker.make(records, self.routes, self.verdicts, {},
                                            self.prefix, False)[0]
        return made


def _under(path: str, routes: Segmented, exact: tuple[str, ...],
           before: tuple[str, ...]) -> Exclusions | None:
    """What of the paths under the literal route `path` ("/a" serves "/a/x"; "/" every
    path) the Router gives another target (lane.c `excluded`), or None when the lane
    may serve none of them. Per segment a literal beats a capture, which beats a
    route's end, so another route takes paths under `path` only when `path`'s
    segments start it and it goes on: a literal route takes its own subtree; a
    pattern at most the paths under its literal head (what its captures refuse is
    left to Python too), or where a capture follows `path`'s segments any path with a
    non-empty segment there; one that ties (the same segments: a wildcard's, another
    spelling) may take any (None). Built-in paths under it are excluded exactly,
    built-in prefixes (taken before routes) as prefixes. None for a path ending in
    "/" (but "/")."""
    if path != "/" and path.endswith("/"):
        return None
    mine = parse_path(path).segments
    n = len(mine)
    under = "/" if path == "/" else path + "/"
    out: list[tuple[bytes, int]] = []
    for q, segments in routes:
        if q == path:
            continue
        if len(segments) < n or segments[:n] != mine:
            continue
        head = _literal_head(segments)
        if len(segments) == n:
            return None  # a tie: the same segments (a wildcard's, another spelling)
        if head == n:  # a capture next: any path with a segment there may be q's
            out.append((ANY_SEGMENT, EXCLUDE_SEGMENT + n))
            continue
        text = ("/" + "/".join(segments[:head])).encode("latin-1")
        out.append((text, EXCLUDE_TREE) if head == len(segments) else
                   (text + b"/", EXCLUDE_PREFIX))  # a literal's (a wildcard's) subtree
    out += [(p.encode("latin-1"), EXCLUDE_PATH) for p in exact if p.startswith(under)]
    for b in before:
        if under.startswith(b):
            return None
        if b.startswith(under):
            out.append((b.encode("latin-1"), EXCLUDE_PREFIX))
    return tuple(out)


def _beside(route: str, routes: Segmented, exact: tuple[str, ...],
            before: tuple[str, ...]) -> Exclusions | None:
    """What of the paths the route with captures `route` matches the Router gives
    another target (lane.c `excluded`), or None when the lane may serve none of them.
    The Router ranks routes segment by segment (a literal beats a capture, which beats
    a route's end), so walking `route` beside another route `q`: a literal of `route`
    against a capture of `q`, or two literals that differ, settle it for `route` (or
    nothing of `q` meets it); a capture of `route` against a literal of `q` gives `q`
    the paths whose segment there is that literal (excluded); `q` going on past
    `route`'s end takes those whose next segment is its literal, or with a capture
    any non-empty one (excluded); a tie (the same segments) any (None). Built-in
    paths it matches are excluded exactly; a built-in prefix it may meet: None."""
    mine = parse_path(route).segments
    n = len(mine)
    out: list[tuple[bytes, int]] = []
    for q, theirs in routes:
        if q == route:
            continue
        for i, (a, b) in enumerate(zip(mine, theirs, strict=False)):
            if a.startswith(":") and not b.startswith(":"):
                out.append((_segment(b), EXCLUDE_SEGMENT + i))
                break
            if not a.startswith(":") and (b.startswith(":") or a != b):
                break  # `route` outranks q there, or they never meet
        else:
            if len(theirs) < n:
                continue  # q ends where `route` goes on: `route` outranks it
            if len(theirs) == n:
                return None  # a tie: the same segments
            out.append((_segment(theirs[n]), EXCLUDE_SEGMENT + n))
    alone = Router([(Route(route), "lane", None)])  # (as `Registry._check_reserved` asks)
    out += [(p.encode("latin-1"), EXCLUDE_PATH) for p in exact
            if alone.match(b"", p.encode("latin-1")) is not None]
    for b in before:
        if all(x.startswith(":") or x == y for x, y in zip(mine, b.strip("/").split("/"),
                                                          strict=False)):
            return None
    return tuple(out)


def _literal_head(segments: tuple[str, ...]) -> int:
    """How many of a route's `segments` come before its first capture (all of them
    for a literal route, or a wildcard's)."""
    return next((i for i, s in enumerate(segments) if s.startswith(":")), len(segments))


def _segment(segment: str) -> bytes:
    """A route's segment as an EXCLUDE_SEGMENT exclusion: a literal as it is, a
    capture as ANY_SEGMENT (any non-empty one)."""
    return ANY_SEGMENT if segment.startswith(":") else segment.encode("latin-1")


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


CGI_NAMES = frozenset({"REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "SERVER_PROTOCOL",
                       "CONTENT_LENGTH", "CONTENT_TYPE", "X_MATCHED_ROUTE", "REMOTE_ADDR",
                       "REMOTE_USER", "EDGEFN_WILDCARD"})


def _request_sets(name: str) -> bool:
    """Whether a request may set the variable `name` (`wasi.environ`), which then hides
    a manifest env entry of that name."""
    return name in CGI_NAMES or name.startswith(("HTTP_", "EDGEFN_PRINCIPAL_", "EDGEFN_PARAM_"))


def _address(fn: Any) -> int:
    """A ctypes function's address (0: none)."""
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


def _bots_record(cls: str, signals: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    """A verdict's class and the record `bots` makes of it (its action: allow)."""
    return cls, {"class": cls, "agent": None, "signals": signals, "action": "allow"}


def _lane_executor(fn: Deployment) -> bool:
    """A WASM reactor run inline on the native call: no host imports (so a request
    it does not finish can run again in Python), not on worker threads; a Python
    function whose pool runs on this loop; or a WASI command (`_command`)."""
    wasm = fn.executor
    if isinstance(wasm, PythonFunction):
        return wasm.pool is not None and wasm.pool.loop is not None
    if not isinstance(wasm, WasmFunction):
        return False
    if wasm.abi == "wasi":
        return True
    if wasm.abi != "reactor":
        return False
    call = wasm.call
    return wasm.host_functions is None and not wasm.threaded and \
        isinstance(call, NativeReactorCall) and call.fast is not None


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
