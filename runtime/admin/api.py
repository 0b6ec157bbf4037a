"""The admin API: loopback only, bearer token from DATA/admin.token, or an API key
whose scopes grant the operation (``admin:deploy``, ``admin:rollback``,
``admin:delete``, ``admin:read``, ``admin:kv``, ``admin:vectors``, ``admin:ai``,
``admin:keys``, ``admin:cache``; ``admin:*`` for all), chosen from the percent-decoded
path the request is routed on. A key acts for its tenant: it lists, reads, deploys, rolls
back and deletes only functions whose ``owner`` is that tenant, reaches only the
namespaces and indexes its tenant owns or is granted, and cannot open the dashboard
(which shows every tenant's traffic).

    POST   /v1/keys/reload                    re-read DATA/keys.json now (`edgefn keys` does)
    GET    /v1/functions                      deployed functions
    POST   /v1/deploy                         body: tar.gz package; header x-edgefn-source,
                                              x-edgefn-replaces (a function it takes over)
    POST   /v1/stage                          the same, staged: loaded and warm, not routed to
    POST   /v1/functions/NAME/stage           {"version"}: stage a stored version (a rollback)
    POST   /v1/functions/NAME/activate        {"version", "canary"?: percent}: route to a staged
                                              version, or split requests with it as a canary
    POST   /v1/functions/NAME/abort           {"version"}: drop a staged version
    POST   /v1/functions/NAME/promote         the canary becomes the live version
    GET    /v1/functions/NAME/versions        versions and history
    POST   /v1/functions/NAME/rollback        body: {"version": "..."} (optional; without
                                              it during a canary: drop the canary)
    DELETE /v1/functions/NAME
    GET    /v1/ai/models                      models and LoRA adapters of the model worker
    GET    /v1/ai/metrics                     queue depth, batch size, TTFT, tokens/s, busy
    POST   /v1/ai/loras                       {"name", "path", "base"?, "scale"?}: add an adapter
    DELETE /v1/ai/loras/NAME                  stop serving an adapter (kept off after restarts)
    POST   /v1/kv/NAMESPACE/OP                {get,put,delete,list,increment,cas,create} args
    POST   /v1/vectors/INDEX/OP               {create,upsert,query,delete,stats} args
    POST   /v1/cache/purge                    exactly one of {"key": URL}, {"prefix": "/p/"},
                                              {"tag": "t"}, {"function": "name"}
    POST   /v1/cache/ai/purge                 the AI cache: {"all": true}, or {"model": M},
                                              {"tenant": T} ("" = anonymous callers) or both
    GET    /v1/cache/stats                    what the caches decided (CacheStats.snapshot)
    GET    /v1/limits                         the rate limits and budgets in force
    GET    /v1/events?since=10m&function=F&status=5xx&tenant=T&path=/p&method=GET&min_ms=N&limit=N
                                              the ring's events, oldest first (`edgefn events`)
    GET    /v1/events/stream?...              the same filters, live as SSE (`edgefn tail`)
    PUT    /v1/dev/starting                   {"why": text | null}: while `edgefn dev` deploys
                                              its folders, a path no function serves yet gets
                                              503 `starting` (why) on every worker; null: 404
    POST   /v1/dashboard/login                a one-time login token for the dashboard
                                              (`edgefn dashboard`); the page and its stream
                                              (`runtime.observe.dashboard.serve`) need the
                                              session it is exchanged for, not admin auth
    GET    /metrics                           Prometheus metrics ([metrics]; its own token,
                                              or none: see `runtime.observe.metrics_http`)
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Callable, Coroutine
from typing import Annotated, Any
from urllib.parse import unquote

import msgspec

from edgefn_core.errors import EdgefnError, Failure, InvalidConfig, NotOwner
from runtime.bindings import kv as kv_binding
from runtime.bindings import operate
from runtime.bindings.owners import WHAT, denied
from runtime.cache.stats import merged
from runtime.functions import deploys
from runtime.functions.registry import Deployment
from runtime.net.message import Request, Response, fetched, json_response, loopback
from runtime.observe import stream
from runtime.observe.dashboard import serve as dashboard
from runtime.observe.dashboard.login import Logins
from runtime.observe.ring import Query
from runtime.pop import PoP
from runtime.security.keys import is_well_formed
from runtime.security.principal import Principal
from runtime.workers import starting
from runtime.workers.control import Fanout

JSON = (b"content-type", b"application/json")
SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class RollbackBody(msgspec.Struct, forbid_unknown_fields=True):
    version: str | None = None


class VersionBody(msgspec.Struct, forbid_unknown_fields=True):
    version: str


class StartingBody(msgspec.Struct, forbid_unknown_fields=True):
    why: Annotated[str, msgspec.Meta(min_length=1, max_length=1000)] | None = None


class ActivateBody(msgspec.Struct, forbid_unknown_fields=True):
    version: str
    canary: float | None = None  # percent of request keys


class LoraBody(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    path: str
    base: str | None = None
    scale: Annotated[float, msgspec.Meta(gt=0, le=100)] = 1.0


class PurgeBody(msgspec.Struct, forbid_unknown_fields=True):
    key: str | None = None  # a URL: http://host/path?query, or /path?query on any host
    prefix: str | None = None  # a path prefix
    tag: str | None = None  # a Cache-Tag
    function: str | None = None  # every version of a function


class AIPurgeBody(msgspec.Struct, forbid_unknown_fields=True):
    model: str | None = None  # a model id (a LoRA adapter is its own)
    tenant: str | None = None  # a tenant; "" is the anonymous caller
    all: bool = False  # every entry (of the key's tenant, for a key)


class AdminApp:
    """Serves the admin API on its own loop (see `runtime.admin.thread`); `pop_loop`,
    the loop that serves the PoP's requests, runs what changes routing or talks to
    the model worker. None: the same loop as the admin API's (tests)."""

    def __init__(self, pop: PoP, token: str,
                 pop_loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.pop = pop
        self.token = f"Bearer {token}".encode()
        self.pop_loop = pop_loop
        self.heartbeat = stream.HEARTBEAT  # seconds between SSE heartbeats of /v1/events/stream
        metrics = getattr(pop, "metrics", None)  # None: a socket-free test's stand-in PoP
        observers = getattr(pop, "observers", None)
        self.metrics = metrics.endpoint(pop_loop, token, observers.flush if observers is not None
                                        else None) if metrics is not None else None
        self.logins = Logins()
        self.dashboard_period = dashboard.PERIOD
        self.workers: Fanout | None = None  # ``workers = N``: the others, told each change

    async def on_pop[T](self, coro: Coroutine[Any, Any, T]) -> T:
        """The result of `coro`, run to the end on the PoP's loop even if this
        request goes away (a deploy must not stop half-way)."""
        if self.pop_loop is None or self.pop_loop is asyncio.get_running_loop():
            return await asyncio.shield(coro)
        done = asyncio.run_coroutine_threadsafe(_shielded(coro), self.pop_loop)
        return await asyncio.wrap_future(done)

    def __call__(self, request: Request) -> Response | object:
        if not loopback(request.client):
            return _error(403, "forbidden", "the admin API only answers loopback clients")
        if fetched(request):  # loopback, but a function's subrequest: none of its business
            return _error(403, "forbidden", "the admin API does not answer a function's fetch")
        if request.path == b"/metrics" and self.metrics is not None:
            return self.metrics(request)  # a scraper's token, not an admin credential
        if dashboard.is_dashboard(request.path) and getattr(self.pop, "dashboard", None):
            return self._dashboard(request)  # a dashboard session, not an admin credential
        auth = request.header(b"authorization") or b""
        if hmac.compare_digest(auth, self.token):
            return self._routed(request, None)
        key = request.header(b"x-api-key") or auth.removeprefix(b"Bearer ")
        record = self.pop.keys.lookup(key.decode("latin-1")) if is_well_formed(
            key.decode("latin-1")) else None
        if record is None or record.state(time.time()) != "active":
            return _error(401, "unauthorized", "missing or wrong admin token or API key")
        who = record.principal()
        op = operation(request.method, path_parts(request.path))
        if not who.allows("admin", op):
            return _error(403, "forbidden", f"API key {record.id} has no scope admin:{op}")
        return self._routed(request, who)

    async def _routed(self, request: Request, who: Principal | None) -> Response:
        """`_route`, then, with ``workers = N``, every other worker told of a change
        it made (the call returns once all switched: see `runtime.workers.control`)."""
        parts = path_parts(request.path)
        response = await self._route(request, who, parts)
        if self.workers is not None and response.status < 400 and _changes_routing(
                request.method, parts):
            await asyncio.shield(self.workers.tell({"op": "sync"}))
        return response

    async def _route(self, request: Request, who: Principal | None,
                     parts: list[str]) -> Response:
        """`who`: the key's principal (None: the admin token, which may do anything);
        `parts`: the path's decoded segments, as the scope was chosen from. A HEAD
        is answered as its GET (the front sends no body)."""
        method = b"GET" if request.method == b"HEAD" else request.method
        try:
            if who is not None:
                self._check_tenant(parts, who)
            match parts:
                case ["v1", "functions"] if method == b"GET":
                    listing = self.pop.registry.listing()
                    if who is not None:  # a key lists its own tenant's functions
                        listing = [f for f in listing if self._owner_of(str(f["name"]))
                                   == who.tenant]
                    return json_response({"functions": listing})
                case ["v1", "deploy"] if method == b"POST":
                    source = (request.header(b"x-edgefn-source") or b"").decode("utf-8", "replace")
                    # off the loop: unpacking up to the package limits takes a while
                    files = await asyncio.to_thread(deploys.from_tar, request.body)
                    # shielded: a client that goes away mid-deploy must not leave a
                    # half-loaded version (and its processes) behind
                    tenant = who.tenant if who is not None else None
                    replaces = _replaces(request, who)
                    result = await self.on_pop(self.pop.registry.deploy(files, source, tenant,
                                                                        replaces))
                    return json_response(msgspec.to_builtins(result))
                case ["v1", "stage"] if method == b"POST":
                    return await self._stage(request, who)
                case ["v1", "functions", name, ("stage" | "activate" | "abort" | "promote") as op
                      ] if method == b"POST":
                    return json_response(await self.on_pop(self._phase(name, op, request.body)))
                case ["v1", "functions", name, "versions"] if method == b"GET":
                    return json_response(self._versions(name))
                case ["v1", "functions", name, "rollback"] if method == b"POST":
                    body = msgspec.json.decode(request.body or b"{}", type=RollbackBody)
                    result = await self.on_pop(self.pop.registry.rollback(name, body.version))
                    return json_response(msgspec.to_builtins(result))
                case ["v1", ("kv" | "vectors") as kind, target, op] if method == b"POST":
                    args = msgspec.json.decode(request.body or b"{}")
                    if not isinstance(args, dict):
                        return _error(400, "bad_request", "body must be a JSON object")
                    if who is not None:
                        self._check_store(kind, target, op, who)
                    result = await asyncio.to_thread(operate, self.pop.stores, kind, target, op,
                                                     args, None if who is None else who.tenant)
                    return json_response({"result": result})
                case ["v1", "dev", "starting"] if method == b"PUT":
                    why = msgspec.json.decode(request.body or b"{}", type=StartingBody).why
                    self.pop.registry.starting = why
                    if self.workers is not None:  # what a worker started again reads
                        starting.save(self.pop.config.data_dir, why)
                    await self._tell({"op": "starting", "why": why})
                    return json_response({"starting": why})
                case ["v1", "keys", "reload"] if method == b"POST":
                    self.pop.keys.reload()  # `edgefn keys` changed DATA/keys.json
                    await self._tell({"op": "keys"})
                    return json_response({"keys": len(self.pop.keys)})
                case ["v1", "ai", *rest]:
                    return await self._ai(rest, method, request.body)
                case ["v1", "cache", "purge"] if method == b"POST":
                    return await self._purge(request.body, who)
                case ["v1", "cache", "ai", "purge"] if method == b"POST":
                    return await self._purge_ai(request.body, who)
                case ["v1", "limits"] if method == b"GET":
                    return json_response(self._limits(who))
                case ["v1", "cache", "stats"] if method == b"GET":
                    await self.on_pop(_call(self.pop.observers.flush))  # what is sent counts
                    rows = self.pop.stores.cache_stats.snapshot()
                    if self.workers is not None:  # every worker's counts, summed
                        got, _ = await self.workers.ask({"op": "cache_stats"}, 5.0)
                        rows = merged([rows, *(r for r in got if isinstance(r, list))])
                    if who is not None:  # a key sees its own tenant's rows only
                        rows = [r for r in rows if self._owns(who, r)]
                    return json_response({"stats": rows})
                case ["v1", "events"] if method == b"GET":
                    await self.on_pop(_call(self.pop.observers.flush))  # what is sent is listed
                    return Response(200, [JSON], stream.listing(
                        self.pop.ring, self._visible(stream.parse(request.query), who)))
                case ["v1", "events", "stream"] if method == b"GET":
                    return Response(200, list(SSE), stream.follow(
                        self.pop.ring, self._visible(stream.parse(request.query), who),
                        self.pop.config.events.subscriber_queue, self.heartbeat))
                case ["v1", "dashboard", "login"] if method == b"POST" and \
                        getattr(self.pop, "dashboard", None) is not None:
                    if who is not None:
                        raise NotOwner("the dashboard shows every tenant's traffic and "
                                       "functions: log in with the admin token")
                    await self.on_pop(_call(self.pop.watch_dashboard))
                    token = self.logins.issue()
                    return json_response({"token": token, "path": f"/dashboard?token={token}",
                                          "expires_in": self.logins.token_ttl})
                case ["v1", "functions", name] if method == b"DELETE":
                    await self.on_pop(self.pop.registry.delete(name))
                    return json_response({"deleted": name})
            return _unrouted(method, request.path, parts)
        except (msgspec.ValidationError, msgspec.DecodeError) as e:
            return _error(400, "bad_request", f"invalid request body: {e}")
        except InvalidConfig as e:
            return _error(e.status, e.code, str(e), field=e.field)
        except EdgefnError as e:
            return _error(e.status, e.code, str(e))

    async def _stage(self, request: Request, who: Principal | None) -> Response:
        """``POST /v1/stage``. Raises what `Registry.stage` raises."""
        source = (request.header(b"x-edgefn-source") or b"").decode("utf-8", "replace")
        files = await asyncio.to_thread(deploys.from_tar, request.body)
        tenant = who.tenant if who is not None else None
        result = await self.on_pop(self.pop.registry.stage(files, source, tenant))
        return json_response(msgspec.to_builtins(result))

    async def _phase(self, name: str, op: str, body: bytes) -> Any:
        """A step of a two-phase deploy or a canary, as JSON-able data (runs on the
        PoP's loop). Raises msgspec errors for a bad body, and what the registry
        raises."""
        registry = self.pop.registry
        if op == "promote":
            return msgspec.to_builtins(await registry.promote(name))
        if op == "activate":
            act = msgspec.json.decode(body or b"{}", type=ActivateBody)
            return msgspec.to_builtins(await registry.activate(name, act.version, act.canary))
        version = msgspec.json.decode(body or b"{}", type=VersionBody).version
        if op == "abort":
            return {"name": name, "version": version,
                    "aborted": await registry.abort(name, version)}
        return msgspec.to_builtins(await registry.stage_stored(name, version))

    def _dashboard(self, request: Request) -> Response:
        if request.path not in dashboard.STREAMS:
            return dashboard.page(request, self.logins)
        refused = dashboard.allowed(request, self.logins)
        if refused is not None:
            return refused
        pop, ai = self.pop, self.pop.ai
        assert pop.dashboard is not None  # `__call__` checked
        figures = dashboard.Figures(pop.dashboard, pop.stores.cache_stats.snapshot,
                                    pop.registry.listing,
                                    ai.client.metrics if ai is not None else None)
        return Response(200, list(SSE), dashboard.follow(
            pop.ring, lambda: self.on_pop(figures()), self.dashboard_period))

    async def _tell(self, msg: dict[str, Any]) -> list[Any]:
        """With ``workers = N``: tell the other workers and wait (see `_routed`);
        what each answered (`Fanout.tell`)."""
        if self.workers is None:
            return []
        return await asyncio.shield(self.workers.tell(msg))

    async def _purge(self, body: bytes, who: Principal | None) -> Response:
        """Raises msgspec errors for a body that does not decode, `NotOwner` when a
        key purges another tenant's function."""
        purge = msgspec.json.decode(body or b"{}", type=PurgeBody)
        given = {k: v for k, v in msgspec.structs.asdict(purge).items() if v is not None}
        if len(given) != 1:
            return _error(400, "bad_request", "give exactly one of key, prefix, tag, function; "
                          f"got {', '.join(given) or 'none'}", field=",".join(given) or None)
        (name, value), = given.items()
        problem = _purge_problem(name, value)
        if problem:
            return _error(400, "bad_request", f"field `{name}`: {problem}", field=name)
        cache = self.pop.http_cache
        only = None
        if who is not None:  # a key purges its own tenant's functions only
            if name == "function":
                self._check_tenant(["v1", "functions", value], who)
            only = frozenset(n for n, fn in self.pop.registry.functions.items()
                             if fn.tenant == who.tenant)
        purged = cache.purge(**given, only=only) if cache is not None else 0
        others = await self._tell({"op": "purge", "args": given,
                                   "only": sorted(only) if only is not None else None})
        purged += sum(n for n in others if isinstance(n, int))  # every worker's entries
        return json_response({"purged": purged, name: value})

    async def _purge_ai(self, body: bytes, who: Principal | None) -> Response:
        """Raises msgspec errors for a body that does not decode, `NotOwner` when a
        key names another tenant."""
        purge = msgspec.json.decode(body or b"{}", type=AIPurgeBody)
        problem = _ai_purge_problem(purge)
        if problem:
            return _error(400, "bad_request", problem)
        tenant = purge.tenant
        if who is not None:  # a key purges its own tenant's entries only
            if tenant is not None and tenant != who.tenant:
                raise NotOwner(f"tenant {tenant!r} is not this key's tenant {who.tenant!r}")
            tenant = who.tenant
        purged = await self._purged_ai(purge.model, tenant)
        return json_response({"purged": purged, "model": purge.model, "tenant": tenant})

    async def _purged_ai(self, model: str | None, tenant: str | None) -> int:
        """Purge the AI cache entries of `model` and `tenant` (None: any) on every
        worker of this PoP; returns how many went."""
        cache = self.pop.stores.ai_cache
        purged = 0 if cache is None else await self.on_pop(
            _value(lambda: cache.purge(model=model, tenant=tenant)))
        # each worker has its own AI cache: the purge answers once every one purged (a
        # worker that does not answer is killed: it restarts with an empty cache)
        counts = await self._tell({"op": "ai_purge", "model": model, "tenant": tenant})
        return purged + sum(n for n in counts if isinstance(n, int))

    def _visible(self, query: Query, who: Principal | None) -> Query:
        """`query`, for a tenant's key narrowed to its tenant's events: those it made
        and those its functions served (by the owner each event recorded, so a name
        another tenant used before shows none of theirs)."""
        if who is None:
            return query
        return msgspec.structs.replace(query, viewer=who.tenant)

    def _owns(self, who: Principal, row: dict[str, Any]) -> bool:
        """Whether a cache stats row is `who`'s tenant's: its function's owner, or (the
        AI cache, no function) the tenant it was asked for."""
        fn = self.pop.registry.functions.get(row.get("function") or "")
        if fn is not None:
            return fn.tenant == who.tenant
        return not row.get("function") and row.get("tenant") == who.tenant

    def _check_tenant(self, parts: list[str], who: Principal) -> None:
        """Raises `NotOwner` when a key reads or changes a function of another tenant."""
        if len(parts) >= 3 and parts[:2] == ["v1", "functions"]:
            owner = self._owner_of(parts[2])
            if owner is not None and owner != who.tenant:
                raise NotOwner(f"function {parts[2]!r} belongs to {owner!r}, not to this "
                               f"key's tenant {who.tenant!r}")

    def _limits(self, who: Principal | None) -> dict[str, Any]:
        """What this PoP enforces (`edgefn limits show`); for a tenant's key, of its
        tenant's keys, budget and functions only. Raises `InvalidConfig` for a key
        file that does not read."""
        from runtime.security.ratelimit.in_force import in_force

        cfg = self.pop.config
        out = in_force(cfg.ratelimit, cfg.bots, self.pop.keys.store,
                       ((n, fn.manifest.rate_limits)
                        for n, fn in sorted(self.pop.registry.functions.items())
                        if who is None or fn.tenant == who.tenant))
        if who is not None:
            out["keys"] = [k for k in out["keys"] if k["tenant"] == who.tenant]
            out["tenants"] = {t: v for t, v in out["tenants"].items() if t == who.tenant}
        return out

    def _owner_of(self, name: str) -> str | None:
        """The tenant of function `name` (live or staged), or None if none is."""
        fn = self.pop.registry.functions.get(name) or self._staged(name)
        return fn.tenant if fn is not None else None

    def _check_store(self, kind: str, name: str, op: str, who: Principal) -> None:
        """Raises `NotOwner` unless `who`'s tenant owns the namespace or index `name`
        (claimed by a deploy of its functions), or is granted it (reads: read or
        write; anything else: write)."""
        owners = self.pop.stores.owners
        access = owners.access(kind, name, who.tenant)
        if owners.owner(kind, name) is None:
            raise NotOwner(f"{WHAT[kind]} {name!r} is not claimed: a tenant's key reaches "
                           f"the names its functions bind once one of them is deployed "
                           f"(owner {who.tenant!r})")
        if access == "write" or (access == "read" and op in READS[kind]):
            return
        raise NotOwner(denied(owners, kind, name, who.tenant, True) if access is None else
                       f"{WHAT[kind]} {name!r} is shared with {who.tenant!r} read-only; "
                       f"{op} is not a read")

    def _versions(self, name: str) -> dict[str, Any]:
        """`name`'s record, with ``serving``: the version this PoP routes to (null when
        it serves none: its recorded version did not load at start, say tampered)."""
        out: dict[str, Any] = msgspec.to_builtins(self.pop.registry.versions(name))
        live = self.pop.registry.functions.get(name)
        out["serving"] = live.version if live is not None else None
        return out

    def _staged(self, name: str) -> Deployment | None:
        """A staged version of `name` (a function not live yet has its owner there)."""
        return next((s.fn for (n, _), s in self.pop.registry.staged.items() if n == name), None)

    async def _ai(self, rest: list[str], method: bytes, body: bytes) -> Response:
        """Raises `WorkerError` and msgspec errors."""
        ai = self.pop.ai
        if ai is None:
            return _error(404, "not_found", "this PoP runs no model worker")
        match rest:
            case ["models"] if method == b"GET":
                return json_response({"models": await self.on_pop(ai.client.models())})
            case ["metrics"] if method == b"GET":
                return json_response(await self.on_pop(ai.client.metrics()))
            # an adapter's answers go with it: none is served once it is removed, nor
            # for another adapter added under its name later
            case ["loras", name] if method == b"DELETE":
                info = await self.on_pop(ai.remove_lora(name))
                return json_response({**info, "purged": await self._purged_ai(name, None)})
            case ["loras"] if method == b"POST":
                lora = msgspec.json.decode(body or b"{}", type=LoraBody)
                info = await self.on_pop(ai.add_lora(lora.name, lora.path, lora.base,
                                                     lora.scale))
                await self._purged_ai(lora.name, None)
                return json_response(info)
        return _unrouted(method, b"/v1/ai/" + "/".join(rest).encode(), ["v1", "ai", *rest])


async def _call(fn: Callable[[], None]) -> None:
    fn()


async def _value[T](fn: Callable[[], T]) -> T:
    return fn()  # on the PoP's loop, which owns what `fn` changes


async def _shielded[T](coro: Coroutine[Any, Any, T]) -> T:
    return await asyncio.shield(coro)


# what a tenant's key may do with a namespace or index it is granted read-only
READS = {"kv": kv_binding.OPS - kv_binding.WRITES,
         "vectors": frozenset({"query", "stats"})}


def path_parts(path: bytes) -> list[str]:
    """The path's segments, percent-decoded: what a request is routed on, and so
    what its scope is chosen from (``/v1/%6bv/...`` is the KV endpoint)."""
    return [unquote(p) for p in path.decode("latin-1").strip("/").split("/")]


def _changes_routing(method: bytes, parts: list[str]) -> bool:
    """A call that changes which version of a function serves (a deploy, rollback,
    activation, promotion or delete), after which the other workers follow."""
    if method == b"DELETE":
        return len(parts) == 3 and parts[:2] == ["v1", "functions"]
    return method == b"POST" and (parts == ["v1", "deploy"] or (
        len(parts) == 4 and parts[:2] == ["v1", "functions"]
        and parts[3] in ("rollback", "activate", "promote")))


def _replaces(request: Request, who: Principal | None) -> str | None:
    """A deploy's ``x-edgefn-replaces: NAME`` (the function it takes over from, which
    goes: a key needs ``admin:delete`` too). Raises `Failure` (403)."""
    value = request.header(b"x-edgefn-replaces")
    if value is None:
        return None
    if who is not None and not who.allows("admin", "delete"):
        raise Failure("forbidden", 403, f"API key {who.key_id} has no scope admin:delete, "
                      "which a deploy that replaces a function needs")
    return value.decode("utf-8", "replace")


def operation(method: bytes, parts: list[str]) -> str:
    """The admin scope a request with these (decoded) path `parts` needs:
    ``admin:<this>``."""
    section = parts[1] if len(parts) > 1 else ""
    if section in ("deploy", "stage", "dev"):
        return "deploy"
    if section == "functions":
        if method == b"DELETE":
            return "delete"
        if len(parts) > 3 and parts[-1] in ("activate", "abort", "promote", "stage"):
            return "deploy"
        return "rollback" if parts[-1] == "rollback" else "read"
    return section if section in ("kv", "vectors", "ai", "keys", "cache", "dashboard") \
        else "read"


def _purge_problem(name: str, value: str) -> str | None:
    """What is wrong with a purge's value, or None."""
    if not value.strip() or len(value) > 2048:
        return "expected a non-empty string of at most 2048 characters"
    if name == "prefix" and not value.startswith("/"):
        return f"expected a path starting with /, got {value!r}"
    if name == "key" and not (value.startswith("/") or value.startswith(("http://",
                                                                          "https://"))):
        return f"expected http://host/path?query or /path?query, got {value!r}"
    return None


def _ai_purge_problem(purge: AIPurgeBody) -> str | None:
    """What is wrong with an AI cache purge, or None."""
    named = [n for n in ("model", "tenant") if getattr(purge, n) is not None]
    if purge.all == bool(named):
        return ('give "all": true, or "model" and/or "tenant"' if not named else
                f'"all" purges everything: leave out {", ".join(named)}')
    if purge.model is not None and not 0 < len(purge.model) <= 256:
        return "field `model`: expected a model id of 1 to 256 characters"
    if purge.tenant is not None and len(purge.tenant) > 256:
        return "field `tenant`: expected at most 256 characters"
    return None


def allowed_methods(parts: list[str]) -> str:
    """The methods `_route` answers on the path of `parts` ("": none, no such
    endpoint), for a 405's ``Allow``; tests/test_admin.py walks it against `_route`."""
    match parts:
        case (["v1", "functions"] | ["v1", "functions", _, "versions"] | ["v1", "limits"]
              | ["v1", "cache", "stats"] | ["v1", "events"] | ["v1", "events", "stream"]
              | ["v1", "ai", "models" | "metrics"]):
            return "GET, HEAD"
        case (["v1", "deploy" | "stage"] | ["v1", "keys", "reload"] | ["v1", "cache", "purge"]
              | ["v1", "cache", "ai", "purge"] | ["v1", "dashboard", "login"]
              | ["v1", "functions", _, "stage" | "activate" | "abort" | "promote" | "rollback"]
              | ["v1", "kv" | "vectors", _, _] | ["v1", "ai", "loras"]):
            return "POST"
        case ["v1", "functions", _] | ["v1", "ai", "loras", _]:
            return "DELETE"
        case ["v1", "dev", "starting"]:
            return "PUT"
    return ""


def _unrouted(method: bytes, path: bytes, parts: list[str]) -> Response:
    """No endpoint answered: 405 with ``Allow`` where the path is one's (RFC 9110
    15.5.6; it was a 404 "no admin endpoint"), else 404."""
    where = f"{method.decode()} {path.decode('latin-1')}"
    allowed = allowed_methods(parts)
    if allowed and method.decode() not in allowed.split(", "):  # (else: a part it lacks)
        response = _error(405, "method_not_allowed", f"{where}: this endpoint takes "
                          f"{allowed}")
        response.headers.append((b"allow", allowed.encode()))
        return response
    return _error(404, "not_found", f"no admin endpoint {where}")


def _error(status: int, kind: str, message: str, **extra: object) -> Response:
    return json_response({"error": {"kind": kind, "message": message, **extra}}, status)


