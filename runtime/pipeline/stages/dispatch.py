"""`dispatch`: run the function `route` chose, with what its route captured; its
response is tagged with ``x-edgefn-function: NAME@VERSION``, and loses its
``Cache-Tag`` where no ``http_cache`` stage runs to read and drop it (a tag is the
cache's, on or off, never the client's: `client_view`). What the function
does wrong is raised as `FunctionError` and contained by the chain.

A function has at most `limits.concurrency` requests in flight (counted per
deployed version, on the public loop's thread): past it the request is refused
at once with 503 ``concurrency_limit`` and ``Retry-After``, so one function
cannot queue up the PoP's worker threads or isolates for everyone.
"""

from __future__ import annotations

import binascii
import re
from collections.abc import Awaitable

from edgefn_core.errors import FunctionError
from runtime.cache.http.cache import client_view
from runtime.executors.base import Caller
from runtime.functions.registry import Deployment
from runtime.functions.warmup import unmetered
from runtime.net.message import Request, Response
from runtime.pipeline.stage import Context, Next, Result, then

MAX_CALLERS = 4096  # distinct callers whose principal section is kept encoded


class Dispatch:
    name = "dispatch"

    def __init__(self, drops_cache_tag: bool = False) -> None:
        """`drops_cache_tag`: no http_cache stage comes before (`build`)."""
        self.callers: dict[tuple[object, ...], Caller] = {}
        self.tagged = client_tagged if drops_cache_tag else tagged

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        fn = ctx.target
        assert isinstance(fn, Deployment), "dispatch runs after route"
        if ctx.quiet:
            return _quiet(fn, request, ctx, self._caller(ctx))
        if fn.inflight >= fn.concurrency:
            raise FunctionError("concurrency_limit", 503, f"has {fn.inflight} requests in "
                                f"flight, its limit (limits.concurrency = {fn.concurrency})")
        caller = self._caller(ctx)
        request = _without_keys(request)
        if caller is None:
            result = fn.executor.handle(request, ctx.route, ctx.params)
        else:
            result = fn.executor.handle(request, ctx.route, ctx.params, caller)
        if isinstance(result, Response):
            return self.tagged(result, fn.tag)
        fn.inflight += 1
        return then(counted(result, fn), self.tagged, fn.tag)

    def _caller(self, ctx: Context) -> Caller | None:
        """`ctx`'s caller (None: anonymous and not classed), its principal section
        encoded once per distinct (principal, bot class, agent). A quiet request's
        is kept too: it carries no credential, so its key is the one a client of
        its bot class gets, and that client then finds the encoding made (making
        it cost the first client 20-30 us; README "Cold starts"). It holds no
        count and nothing a client or an operator can see."""
        if ctx.principal is None and ctx.bot is None:
            return None
        key = (ctx.principal, ctx.bot, ctx.agent)
        caller = self.callers.get(key)
        if caller is None:
            if len(self.callers) >= MAX_CALLERS:
                self.callers.clear()
            caller = self.callers[key] = Caller(_principal(ctx))
        return caller


def _quiet(fn: Deployment, request: Request, ctx: Context, caller: Caller | None) -> Result:
    """A warm-up request (`runtime.pipeline.warm`): a dry one is answered here; else
    the function runs with `caller` (as a client's request does) without taking a
    concurrency slot, and a synchronous call's instantiation is not counted in
    edgefn_wasm_instantiate_seconds."""
    if ctx.dry:
        return Response(204, [fn.tag])
    request = _without_keys(request)
    # a WASM reactor's: within its inline slice (one cut there is not run again)
    handle = getattr(fn.executor, "handle_quiet", fn.executor.handle)
    with unmetered(fn.executor):
        if caller is None:
            result = handle(request, ctx.route, ctx.params)
        else:
            result = handle(request, ctx.route, ctx.params, caller)
    return then(result, tagged, fn.tag)


def _principal(ctx: Context) -> dict[str, str]:
    """The ABI's principal section: who is calling and what kind of client it is."""
    out: dict[str, str] = {}
    p = ctx.principal
    if p is not None:
        out = {"kind": p.kind, "tenant": p.tenant, "scopes": " ".join(p.scopes)}
        if p.key_id:
            out["key_id"] = p.key_id
        if p.subject:
            out["subject"] = p.subject
    if ctx.bot is not None:
        out["bot"] = ctx.bot
    if ctx.agent is not None:
        out["agent"] = ctx.agent
    return out


KEY_HEADERS = (b"authorization", b"x-api-key")
# the dashboard's session (runtime.observe.dashboard.serve.COOKIE): its path is
# /dashboard, and a function routed under it on the public port got it
OPERATOR_COOKIE = b"edgefn_dash"


def _without_keys(request: Request) -> Request:
    """`request` as a function gets it: with no edgefn API key in it (``efn_...`` in
    `KEY_HEADERS`, verified or not) and no operator's dashboard session
    (`OPERATOR_COOKIE` out of its ``Cookie`` headers). A function knows its caller
    from the principal section; a third party's function collected its callers'
    keys, scopes wider than its own included. A copy, so the stages before keep what
    they read (the HTTP cache's ``Vary: Authorization``); JWTs and other credentials
    stay."""
    for name, value in request.headers:
        if ((name in KEY_HEADERS and _is_key(value))
                or (name == b"cookie" and OPERATOR_COOKIE in value)):
            break
    else:
        return request
    headers = []
    for k, v in request.headers:
        if k in KEY_HEADERS and _is_key(v):
            continue
        if k == b"cookie" and OPERATOR_COOKIE in v:
            v = _without_operator(v)
            if not v:
                continue
        headers.append((k, v))
    copy = Request(request.method, request.path, request.query, headers,
                   request.host, request.http_version, request.keep_alive, request.client)
    copy.body = request.body
    return copy


def _without_operator(cookie: bytes) -> bytes:
    """A ``Cookie`` header's value without the pairs named `OPERATOR_COOKIE`."""
    return b"; ".join(pair.strip() for pair in cookie.split(b";")
                      if pair.strip() and pair.partition(b"=")[0].strip() != OPERATOR_COOKIE)


# where a key starts: the value's start, or after a separator (`Token token="efn_...`,
# `ApiKey key=efn_...`, `user:efn_...`), not inside a token (a JWT's base64url)
KEY_AT = re.compile(rb"(?:^|[^A-Za-z0-9_.\-])efn_")
URLSAFE = bytes.maketrans(b"-_", b"+/")


def _is_key(value: bytes) -> bool:
    """Whether header `value` holds an edgefn API key (``efn_...``) in any form: a
    Bearer or any other scheme's token or parameter (``Token``, ``ApiKey``, a tab
    after the scheme, quoted), the bare key, or either half of a Basic credential,
    padded or not (a key sent in the wrong form reached the function: only
    ``Bearer efn_`` and the bare key were dropped)."""
    if b"efn_" in value:
        return KEY_AT.search(value) is not None
    if value[:6].lower() not in (b"basic ", b"basic\t"):
        return False
    try:  # padding added (a2b_base64 ignores what is too much), base64url read too
        pair = binascii.a2b_base64(value[6:].strip().translate(URLSAFE) + b"==")
    except binascii.Error:
        return False
    return KEY_AT.search(pair) is not None


async def counted(pending: Awaitable[Response], fn: Deployment) -> Response:
    """`pending`'s response; `fn`'s concurrency slot (taken by the caller) given back
    once it ends, however it ends (the native lane's WASI commands use it too)."""
    try:
        return await pending
    finally:
        fn.inflight -= 1


# the PoP's to set: a function's own (a forged `x-edgefn-function: other@v1` reached the
# client before the real one; `x-edgefn-error: trap` on a 200 made its event an error)
# is dropped
RESERVED = b"x-edgefn-"


def tagged(response: Response, tag: tuple[bytes, bytes]) -> Response:
    """`response` tagged with its function's `tag` (``x-edgefn-function``), any
    reserved header the function set dropped: dispatch's, and the native lane's."""
    headers = response.headers
    for name, _ in headers:
        if name.startswith(RESERVED):
            headers[:] = [h for h in headers if not h[0].startswith(RESERVED)]
            break
    headers.append(tag)
    return response


def client_tagged(response: Response, tag: tuple[bytes, bytes]) -> Response:
    """`tagged`, and without a ``Cache-Tag`` (no http_cache stage drops it)."""
    return client_view(tagged(response, tag))
