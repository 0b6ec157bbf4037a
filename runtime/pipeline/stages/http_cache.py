"""`http_cache`: the RFC 9111 shared cache in front of functions (not the OpenAI
API). Every answer to a cacheable request says ``x-edgefn-cache``:

    HIT      served fresh from the cache (synchronously, no task)
    STALE    served stale: within stale-while-revalidate (one background
             revalidation per key) or stale-if-error (the origin failed)
    MISS     no usable entry: the origin answered (and the response was stored
             if it may be)
    EXPIRED  there was an entry, stale: revalidated (304 refreshes it) or refetched

Concurrent misses and revalidations of one key make one origin call; the others
wait for it and serve what it stored (or go to the origin if it stored nothing).
    BYPASS   a request the cache does not serve (unsafe method, Range); a
             successful unsafe method drops the URL's entries (RFC 9111 4.4)

A function with ``[cache.http] enabled = false`` passes straight through. Each
decision goes to ``ctx.decide("http_cache", ...)`` and `CacheStats`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from hashlib import blake2b

from edgefn_core.errors import StoreClosed
from runtime.cache.http import policy
from runtime.cache.http.cache import HttpCache, answered, client_view, served, updated
from runtime.cache.http.store import Entry
from runtime.cache.settings import HttpCacheOverride, HttpCacheSettings
from runtime.cache.stats import CacheStats
from runtime.net.message import Request, Response
from runtime.pipeline.stage import Context, Next, Result, Target, then
from runtime.pipeline.targets import Targets
from runtime.security.settings import merge

CACHED_METHODS = (b"GET", b"HEAD")
# RFC 9111 4.4: a non-error answer to an unsafe method, "including methods whose
# safety is unknown", invalidates the URL (PURGE, MKCOL did not)
SAFE = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE"})
CONDITIONALS = (b"if-none-match", b"if-modified-since")
# the decision of a miss whose response says nothing of freshness: the common one of a
# deployment with nothing stored (shared, never changed: no dict made a request)
NOT_STORED = {"outcome": "MISS", "stored": "no freshness"}


class HttpCacheStage:
    name = "http_cache"

    def __init__(self, cache: HttpCache, targets: Targets, stats: CacheStats) -> None:
        self.cache = cache
        self.targets = targets
        self.stats = stats
        self.settings = cache.settings
        self.merged: dict[int, tuple[HttpCacheOverride, HttpCacheSettings]] = {}
        self.tasks: set[asyncio.Task[None]] = set()  # background revalidations
        if cache.labels is not None:  # workers = N: what another worker stored moves the
            # plans (the native lane serves a deployment that stored nothing, in C)
            self.plan_stamp = cache.labels_stamp

    def idle_for(self, target: Target | None) -> bool:
        """Whether requests for `target` go on untouched (`runtime.pipeline.plan`):
        not a function's, or the cache is off."""
        return target is None or target.kind != "function" or not self.settings.enabled

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        target = self.targets.resolve(request, ctx)
        if target is None or target.kind != "function" or not self.settings.enabled:
            return call_next(request, ctx)
        if ctx.quiet:  # a warm-up is neither looked up, stored nor counted
            return self._quiet(request, ctx, call_next, target)
        s = self._settings(target)
        if not s.enabled:  # its Cache-Tag is still the cache's, never the client's
            return then(call_next(request, ctx), client_view)
        ranged, cc, conditional = _asked(request)
        if request.method not in CACHED_METHODS or ranged is not None:
            return self._bypass(request, ctx, call_next, target)
        if cc is not None and b"only-if-cached" in cc:  # never to the function
            key, scope = HttpCache.key(target.label, request), _scope(request, ctx)
            entry = self.cache.lookup(key, request, scope)
            if entry is None:
                return self._not_cached(ctx, target, key)
            return self._found(entry, request, ctx, call_next, target, key, scope, s)
        if s.default_ttl is None and target.label not in self.cache.caching \
                and not self.cache.store.shared:  # workers = N: another may have stored
            # nothing of this deployment is stored: no lookup, no flight to wait for
            # (a full response, as on any miss: it may be the first one stored)
            return then(call_next(_conditional(request, None)
                                  if conditional and request.method == b"GET" else request, ctx),
                        self.first_answer, request, ctx, target, s, time.perf_counter(),
                        conditional)
        key = HttpCache.key(target.label, request)
        scope = _scope(request, ctx)
        entry = self.cache.lookup(key, request, scope)
        if entry is not None:
            return self._found(entry, request, ctx, call_next, target, key, scope, s)
        if request.method == b"HEAD":  # nothing to store from a HEAD
            return self._miss(request, ctx, call_next, target, key, scope, s, False)
        if not self.cache.coalesces(key, target.label, s.default_ttl):
            return self._miss(request, ctx, call_next, target, key, scope, s, False)
        flight = self.cache.flights.waiting(key)
        if flight is not None:
            return self._follow(flight, request, ctx, call_next, target, key, scope, s)
        return self._miss(request, ctx, call_next, target, key, scope, s, True)

    def _found(self, entry: Entry, request: Request, ctx: Context, call_next: Next,
               target: Target, key: bytes, scope: str, s: HttpCacheSettings) -> Result:
        """Serve a stored `entry` fresh or stale, or revalidate it."""
        req = policy.directives(request.header(b"cache-control"))
        age = self.cache.age(entry)
        if policy.fresh_enough(age, entry, req):
            return self._serve(entry, age, "HIT", request, ctx, target, key)
        if policy.stale_accepted(age, entry, req):  # the client's max-stale
            return self._serve(entry, age, "STALE", request, ctx, target, key)
        if "only-if-cached" in req:
            return self._not_cached(ctx, target, key)
        if not policy.wants_fresh(req) and policy.may_serve_stale(age, entry, req, entry.swr):
            if request.method == b"GET":  # a HEAD's answer could not refresh it
                self._revalidate_later(request, ctx, call_next, key, scope, entry, s)
            return self._serve(entry, age, "STALE", request, ctx, target, key)
        if request.method == b"HEAD":  # leaves the stale GET entry for a GET to refresh
            return self._miss(request, ctx, call_next, target, key, scope, s, False)
        flight = self.cache.flights.waiting(key)
        if flight is not None:  # being revalidated or refetched: wait for that
            return self._follow(flight, request, ctx, call_next, target, key, scope, s)
        return self._revalidate(request, ctx, call_next, target, key, scope, entry, s, req)

    # -- answers from the cache -------------------------------------------------------------
    def _serve(self, entry: Entry, age: float, outcome: str, request: Request, ctx: Context,
               target: Target, key: bytes) -> Response:
        response = served(entry, age, outcome.encode(), request)
        self._record(ctx, target, key, outcome, age=age, nbytes=len(entry.body),
                     saved_ms=entry.origin_ms)
        return response

    def _not_cached(self, ctx: Context, target: Target, key: bytes) -> Response:
        """The 504 a request with ``only-if-cached`` gets when no stored response may
        answer it (RFC 9111 5.2.1.7: it went to the function)."""
        self._record(ctx, target, key, "MISS", stored="only-if-cached")
        return Response(504, [(b"content-type", b"text/plain; charset=utf-8"),
                              (b"x-edgefn-cache", b"MISS")],
                        b"no stored response answers this request (only-if-cached)\n")

    def _bypass(self, request: Request, ctx: Context, call_next: Next, target: Target
                ) -> Result:
        key = HttpCache.key(target.label, request)
        self._record(ctx, target, key, "BYPASS")
        return then(call_next(request, ctx), self._bypassed,
                    key if request.method not in SAFE else None)

    def bypass_answer(self, response: Response, request: Request, ctx: Context,
                      target: Target) -> Response:
        """`_bypass` of a request the native lane took (an unsafe method), its answer
        `response` already here: recorded, its URL's entries dropped on success."""
        key = HttpCache.key(target.label, request)
        self._record(ctx, target, key, "BYPASS")
        return self._bypassed(response, key if request.method not in SAFE else None)

    def _bypassed(self, response: Response, key: bytes | None) -> Response:
        if key is not None and response.status < 400:
            self.cache.invalidate(key)
        response.headers.append((b"x-edgefn-cache", b"BYPASS"))
        return client_view(response)

    # -- misses: one origin call per key ----------------------------------------------------
    def _miss(self, request: Request, ctx: Context, call_next: Next, target: Target,
              key: bytes, scope: str, s: HttpCacheSettings, lead: bool) -> Result:
        started = time.perf_counter()
        # a full response to store; the client's validators are answered from it
        result = call_next(_conditional(request, None) if request.method == b"GET" else request,
                           ctx)
        if isinstance(result, Response):
            return self._fetched(result, started, request, ctx, target, key, scope, s)
        if not lead:
            return self._awaited(result, started, request, ctx, target, key, scope, s)
        self.cache.flights.take_off(key)
        return self._leading(result, started, request, ctx, target, key, scope, s)

    async def _leading(self, pending: Awaitable[Response], started: float, request: Request,
                       ctx: Context, target: Target, key: bytes, scope: str,
                       s: HttpCacheSettings) -> Response:
        try:
            return self._fetched(await pending, started, request, ctx, target, key, scope, s)
        finally:
            self.cache.flights.land(key)

    async def _awaited(self, pending: Awaitable[Response], started: float, request: Request,
                       ctx: Context, target: Target, key: bytes, scope: str,
                       s: HttpCacheSettings) -> Response:
        return self._fetched(await pending, started, request, ctx, target, key, scope, s)

    async def _follow(self, flight: asyncio.Future[None], request: Request, ctx: Context,
                      call_next: Next, target: Target, key: bytes, scope: str,
                      s: HttpCacheSettings) -> Response:
        """Wait for the origin call in flight (a miss or a revalidation), then serve
        what it stored, or go to the origin (without leading a flight) if it
        stored nothing fresh for us."""
        await asyncio.shield(flight)
        entry = self.cache.lookup(key, request, scope)
        req = policy.directives(request.header(b"cache-control"))
        if entry is not None:
            age = self.cache.age(entry)
            if policy.fresh_enough(age, entry, req):
                return self._serve(entry, age, "HIT", request, ctx, target, key)
            if request.method == b"GET":  # still stale: the leader's origin call failed
                # ask again, and answer stale within its stale-if-error on a failure
                # (followers got the 5xx: only the leader's client got the stale entry)
                result = self._revalidate(request, ctx, call_next, target, key, scope, entry,
                                          s, req, lead=False)
                return result if isinstance(result, Response) else await result
        result = self._miss(request, ctx, call_next, target, key, scope, s, False)
        return result if isinstance(result, Response) else await result

    def _fetched(self, response: Response, started: float, request: Request, ctx: Context,
                 target: Target, key: bytes, scope: str, s: HttpCacheSettings,
                 outcome: str = "MISS") -> Response:
        """Store the origin's `response` if allowed, and answer it."""
        origin_ms = (time.perf_counter() - started) * 1000
        stored: Entry | str = "HEAD"
        req = policy.directives(request.header(b"cache-control"))
        if request.method == b"GET":
            stored = "request no-store" if "no-store" in req else self.cache.admit(
                key, request, scope, response, origin_ms, s.default_ttl)
        self._record(ctx, target, key, outcome, stored=stored)
        if isinstance(stored, Entry):
            self.cache.stored(key, target.label)
        elif request.method == b"GET":
            self.cache.passed(key)
        if isinstance(stored, Entry):
            return served(stored, stored.initial_age, outcome.encode(), request)
        return answered(response, request, outcome.encode())

    def _quiet(self, request: Request, ctx: Context, call_next: Next, target: Target) -> Result:
        """A warm-up (`runtime.pipeline.warm`): what a miss does before and after the
        origin (the function's merged settings, the unconditional request, the
        response's client view), with no lookup, no entry stored, no decision and
        no count. These cost the first client 20 us
        more than the next ones (README "Cold starts")."""
        s = self._settings(target)
        if not s.enabled or request.method != b"GET":
            return call_next(request, ctx)
        return then(call_next(_conditional(request, None), ctx), _read)

    def first_answer(self, response: Response, request: Request, ctx: Context,
                     target: Target, s: HttpCacheSettings, started: float,
                     conditional: bool) -> Response:
        """The origin's answer for a deployment with nothing stored: stored if it
        says it may be (then the deployment takes the full path from now on). Also
        the native lane's, for such a call it finishes in Python.
        `conditional`: whether the request carries validators (`_asked`)."""
        if request.method == b"GET":
            for k, _ in response.headers:  # a loop: a generator costs more per request
                if k == b"cache-control" or k == b"expires":
                    key = HttpCache.key(target.label, request)
                    return self._fetched(response, started, request, ctx, target, key,
                                         _scope(request, ctx), s)
        ctx.decide("http_cache", NOT_STORED)
        principal = ctx.principal
        self.stats.record("http", "MISS", function=target.name,
                          tenant=principal.tenant if principal is not None else None)
        return answered(response, request, b"MISS", conditional)

    # -- stale entries ----------------------------------------------------------------------
    def _revalidate(self, request: Request, ctx: Context, call_next: Next, target: Target,
                    key: bytes, scope: str, entry: Entry, s: HttpCacheSettings,
                    req: policy.Directives, lead: bool = True) -> Result:
        """Ask the origin about a stale `entry` (conditionally when it has validators),
        leading the key's flight unless `lead` is False (a follower's own try)."""
        started = time.perf_counter()
        result = call_next(_conditional(request, entry), ctx)
        if isinstance(result, Response):
            return self._revalidated(result, started, request, ctx, call_next, target, key,
                                     scope, entry, s, req)
        if lead:
            self.cache.flights.take_off(key)
        return self._revalidating(result, started, request, ctx, call_next, target, key,
                                  scope, entry, s, req, lead)

    async def _revalidating(self, pending: Awaitable[Response], started: float,
                            request: Request, ctx: Context, call_next: Next, target: Target,
                            key: bytes, scope: str, entry: Entry, s: HttpCacheSettings,
                            req: policy.Directives, lead: bool) -> Response:
        try:
            result = self._revalidated(await pending, started, request, ctx, call_next,
                                       target, key, scope, entry, s, req)
            return result if isinstance(result, Response) else await result
        finally:
            if lead:
                self.cache.flights.land(key)

    def _revalidated(self, response: Response, started: float, request: Request,
                     ctx: Context, call_next: Next, target: Target, key: bytes, scope: str,
                     entry: Entry, s: HttpCacheSettings, req: policy.Directives) -> Result:
        if response.status == 304 and not policy.validates(response.headers, entry.etag):
            # a strong validator the entry does not have (RFC 9111 4.3.4): it may not
            # be updated from it, and this client asked for no 304: the full response
            self.cache.invalidate(key)
            return then(call_next(_conditional(request, None), ctx), self._fetched, started,
                        request, ctx, target, key, scope, s, "EXPIRED")
        if response.status == 304:  # any stored status (RFC 9111 4.3.3): a 301, a 404
            fresh = self.cache.refresh(key, request, scope, entry, response, s.default_ttl)
            self._record(ctx, target, key, "EXPIRED", stored=fresh)
            if isinstance(fresh, Entry):
                return served(fresh, fresh.initial_age, b"EXPIRED", request)
            # no longer storable (a Set-Cookie, `no-store`): still the 304's fields over
            # the stored ones (they were dropped: its cookie never reached the client)
            return answered(updated(entry, response), request, b"EXPIRED")
        if response.status >= 500:
            age = self.cache.age(entry)
            if policy.may_serve_stale(age, entry, req, entry.sie):
                return self._serve(entry, age, "STALE", request, ctx, target, key)
        else:
            self.cache.invalidate(key)  # replaced, or no longer storable
        return self._fetched(response, started, request, ctx, target, key, scope, s,
                             "EXPIRED")

    def _revalidate_later(self, request: Request, ctx: Context, call_next: Next, key: bytes,
                          scope: str, entry: Entry, s: HttpCacheSettings) -> None:
        """Revalidate `entry` in the background, unless the key already has an origin
        call in flight."""
        if self.cache.flights.waiting(key) is not None:
            return
        self.cache.flights.take_off(key)
        task = asyncio.get_running_loop().create_task(
            self._background(request, ctx, call_next, key, scope, entry, s))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _background(self, request: Request, ctx: Context, call_next: Next, key: bytes,
                          scope: str, entry: Entry, s: HttpCacheSettings) -> None:
        try:
            quiet = _detached(ctx)
            result = call_next(_conditional(request, entry), quiet)
            response = result if isinstance(result, Response) else await result
            if response.status == 304 and policy.validates(response.headers, entry.etag):
                self.cache.refresh(key, request, scope, entry, response, s.default_ttl)
            elif response.status < 500:
                self.cache.invalidate(key)
                self.cache.admit(key, request, scope, response, 0.0, s.default_ttl)
        except StoreClosed:
            pass  # the PoP is closing
        finally:
            self.cache.flights.land(key)

    # -- bookkeeping ------------------------------------------------------------------------
    def settings_for(self, target: Target) -> HttpCacheSettings:
        """The settings requests for `target` are cached under (`_settings`)."""
        return self._settings(target)

    def _settings(self, target: Target) -> HttpCacheSettings:
        """The PoP's settings with the function's ``[cache.http]`` over them."""
        override = target.cache.http
        if override is None:
            return self.settings
        hit = self.merged.get(id(override))
        if hit is None or hit[0] is not override:
            if len(self.merged) >= 4096:  # overrides of deployments long replaced
                self.merged.clear()
            hit = self.merged[id(override)] = (override, merge(self.settings, override))
        return hit[1]

    def _record(self, ctx: Context, target: Target, key: bytes, outcome: str, *,
                age: float = 0.0, nbytes: int = 0, saved_ms: float = 0.0,
                stored: Entry | str | None = None) -> None:
        record: dict[str, object] = {"outcome": outcome, "key": _label(key)}
        if outcome in ("HIT", "STALE"):
            record.update(age=int(age), bytes=nbytes, saved_ms=round(saved_ms, 3))
        if stored is not None:
            record["stored"] = True if isinstance(stored, Entry) else stored
        ctx.decide("http_cache", record)
        principal = ctx.principal
        self.stats.record("http", outcome, function=target.name,
                          tenant=principal.tenant if principal is not None else None,
                          nbytes=nbytes, saved_ms=saved_ms)

    async def aclose(self) -> None:
        """Cancel background revalidations still running."""
        for task in list(self.tasks):
            task.cancel()


def _scope(request: Request, ctx: Context) -> str:
    """Who a non-public response is for: "" (anonymous), the principal's tenant,
    or a hash of the credential a request carries that no stage verified."""
    principal = ctx.principal
    if principal is not None:
        return "t:" + principal.tenant
    credential = request.header(b"authorization") or request.header(b"x-api-key")
    if credential is None:
        return ""
    return "c:" + blake2b(credential, digest_size=12).hexdigest()


def _read(response: Response) -> Response:
    """`response` as a miss hands it on (its client view), nothing recorded: a
    quiet request's."""
    return client_view(response)


def _asked(request: Request) -> tuple[bytes | None, bytes | None, bool]:
    """One pass over `request`'s headers: its first Range and Cache-Control values,
    and whether it carries a validator (If-None-Match, If-Modified-Since)."""
    ranged = cc = None
    conditional = False
    for k, v in request.headers:  # a loop: a generator costs more per request
        if k == b"range":
            if ranged is None:
                ranged = v
        elif k == b"cache-control":
            if cc is None:
                cc = v
        elif k in CONDITIONALS:
            conditional = True
    return ranged, cc, conditional


def _conditional(request: Request, entry: Entry | None) -> Request:
    """`request` asking the origin to validate `entry` (RFC 9111 4.3.1): its own
    conditionals replaced by the entry's validators (None: none, a plain GET)."""
    if entry is None:
        for k, _ in request.headers:
            if k in CONDITIONALS:
                break
        else:
            return request
    headers = [(k, v) for k, v in request.headers if k not in CONDITIONALS]
    if entry is not None and entry.etag is not None:
        headers.append((b"if-none-match", entry.etag))
    if entry is not None and entry.last_modified is not None:
        headers.append((b"if-modified-since", entry.last_modified))
    copy = Request(request.method, request.path, request.query, headers, request.host,
                   request.http_version, request.keep_alive, request.client)
    copy.body = request.body
    return copy


def _detached(ctx: Context) -> Context:
    """A context for a background origin call: the request's target and caller,
    none of its decisions."""
    quiet = Context(ctx.client)
    quiet.request_id, quiet.principal, quiet.bot, quiet.agent = (
        ctx.request_id, ctx.principal, ctx.bot, ctx.agent)
    quiet.resolved, quiet.target, quiet.route, quiet.params = (
        True, ctx.target, ctx.route, ctx.params)
    return quiet


def _label(key: bytes) -> str:
    """A primary key as text: ``name@version host/path?query``."""
    if not key:
        return ""
    label, host, path, query = key.decode("latin-1").split("\0")
    return f"{label} {host}{path}" + (f"?{query}" if query else "")
