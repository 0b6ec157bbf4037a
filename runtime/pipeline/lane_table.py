"""Which targets the native lane serves (its table), and what their requests leave behind.

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

import ctypes
import logging
from typing import TYPE_CHECKING, Any

from runtime.executors.python.function import PythonFunction
from runtime.executors.wasm.function import WasmFunction
from runtime.executors.wasm.native import NativeReactorCall
from runtime.functions.manifest import Route, parse_path
from runtime.functions.registry import Deployment
from runtime.functions.router import Router
from runtime.net.message import Request
from runtime.pipeline.chain import Chain
from runtime.pipeline.contain import rendered
from runtime.pipeline.stage import Context, Stage
from runtime.pipeline.stages.auth import Auth
from runtime.pipeline.stages.bots import Bots
from runtime.pipeline.stages.cors import Cors
from runtime.pipeline.stages.dispatch import Dispatch
from runtime.pipeline.stages.events import Events
from runtime.pipeline.stages.health import Health
from runtime.pipeline.stages.http_cache import HttpCacheStage
from runtime.pipeline.stages.ratelimit import RateLimit
from runtime.pipeline.stages.request_id import RequestId
from runtime.pipeline.stages.residency import Residency

if TYPE_CHECKING:
    from collections.abc import Callable

    from runtime.functions.registry import Registry
    from runtime.pop import PoP

log = logging.getLogger("edgefn.http")

CACHE_NONE, CACHE_OFF, CACHE_FIRST = range(3)  # lane.c's: what http_cache does for a route
# lane.c's: a route's flags (its tuple's `origin`)
ROUTE_ORIGIN, ROUTE_PREFIX, ROUTE_PATTERN, ROUTE_LIMITED, ROUTE_REFUSES = 1, 2, 4, 8, 16
ROUTE_GUARD_COUNTS = 32
ROUTE_MISS, ROUTE_PASSED = 1, 2  # lane_drain.c.h's: a route's flags in `route_texts`
# lane.c's EX_*: a path under a prefix route another target takes: exactly; it and the
# paths under it; every path it starts
EXCLUDE_PATH, EXCLUDE_TREE, EXCLUDE_PREFIX, EXCLUDE_SEGMENT = range(4)  # (+ i: segment i's)
ANY_SEGMENT = b":"  # EXCLUDE_SEGMENT's for any non-empty segment (no literal is ":")
type Exclusions = tuple[tuple[bytes, int], ...]
type Segmented = tuple[tuple[str, tuple[str, ...]], ...]  # routes, each with its segments
# the bot classes, in lane.c's order: a route's `allowed` and `blocked` bits, a verdict's class
CLASSES = ("browser", "verified_agent", "declared_agent", "automation", "abusive")


class LaneTable:
    """`NativeLane`'s table: which of the registry's routes the C serves, and how
    (made again by `_rebuild` when the routes, the canaries or the stages' stamp
    change). A mixin of `NativeLane`, which defines the state declared here."""

    if TYPE_CHECKING:
        c: Any
        chain: Chain
        pop: PoP
        registry: Registry
        bots: Bots
        ratelimit: Stage | None
        http_cache: HttpCacheStage | None
        commands: bool
        records: list[tuple[Any, ...]]
        routes: list[tuple[Deployment, str, str, int]]
        limits: list[list[tuple[Any, ...]]]
        route_texts: tuple[tuple[str, str, str | None, str | None, int], ...]
        guards: dict[int, tuple[Any, ...]]
        guard_checks: dict[str, list[Any]]
        guard_refusals: dict[tuple[int, str, str], tuple[dict[str, Any], str]]
        limit_checks: dict[tuple[int, str], tuple[list[Any], list[Any]]]
        refusing: set[int]
        router: object
        canaries: object
        stamped: object
        stamp: Callable[[], object] | None

        def drain(self) -> None: ...
        def _block(self, cls: str, record: dict[str, Any]) -> tuple[Any, ...]: ...

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

    def _blocked(self, fn: Deployment) -> int:
        """The bot classes (a bit each, `CLASSES`) whose requests for `fn` bots blocks
        (403), where the lane writes that as the stage does (`_block`): where no
        ratelimit comes before bots in its plan (one would count them first), nor an
        http_cache (it would mark and count the 403), and none after it counts the
        403 against rules by ip."""
        kept = self.chain.kept(fn) or []
        stage = next((s for s in kept if isinstance(s, Bots)), None)
        if stage is None or any(isinstance(s, RateLimit | HttpCacheStage)
                                for s in kept[:kept.index(stage)]):
            return 0
        if stage.on_refused is not None and isinstance(self.ratelimit, RateLimit) and \
                self.ratelimit.ip_rules:
            return 0  # the ratelimit after it counts the 403 (`stages.refusals`)
        policy = stage.manager.policy(fn.policy.bots)
        return sum(1 << i for i, c in enumerate(CLASSES) if getattr(policy, c) == "block")

    def _limits(self, fn: Deployment) -> list[tuple[Any, ...]]:
        """What ratelimit counts `fn`'s requests without a principal against (its
        `anonymous`): [] when nothing, or it is not in `fn`'s plan."""
        stage = self.ratelimit
        if not isinstance(stage, RateLimit) or stage not in (self.chain.kept(fn) or ()):
            return []
        return stage.anonymous(fn) or []

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


CGI_NAMES = frozenset({"REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "SERVER_PROTOCOL",
                       "CONTENT_LENGTH", "CONTENT_TYPE", "X_MATCHED_ROUTE", "REMOTE_ADDR",
                       "REMOTE_USER", "EDGEFN_WILDCARD"})


def _request_sets(name: str) -> bool:
    """Whether a request may set the variable `name` (`wasi.environ`), which then hides
    a manifest env entry of that name."""
    return name in CGI_NAMES or name.startswith(("HTTP_", "EDGEFN_PRINCIPAL_", "EDGEFN_PARAM_"))
