"""The stage interface and the per-request context.

A stage is ``stage(request, ctx, call_next) -> Response | Awaitable[Response]``. It
answers itself (a cache hit, a 401, a 404) or calls ``call_next(request, ctx)`` and
may change what comes back. A stage that answers synchronously keeps the
request task-free: the HTTP front writes a plain `Response` at once and only
creates a task for an awaitable. Use `then` to post-process whatever `call_next`
returned without giving that up.

A stage may raise: the chain contains it (see `runtime.pipeline.contain`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from edgefn_core.errors import EdgefnError
from runtime.cache.settings import CacheOverride
from runtime.net.message import Request, Response
from runtime.security.principal import Principal, model_client
from runtime.security.settings import TargetPolicy

type Result = Response | Awaitable[Response]
type Next = Callable[[Request, Context], Result]


class Target(Protocol):
    """What serves a request once routed: a deployed function or a built-in API.
    It decides how its errors look to a client, and what it asks of the security
    stages (`policy`)."""

    label: str  # "hello@1a2b3c" or "openai"
    kind: str  # "function" or "openai"
    name: str  # the function's name, or "openai"
    tenant: str | None  # who owns it (a function's owner); None for built-in APIs
    policy: TargetPolicy
    cache: CacheOverride  # what it asks of the caches (a function's [cache])

    def error_response(self, err: EdgefnError) -> Response: ...

    def crashed(self, exc: Exception) -> EdgefnError:
        """The error to show for an unexpected exception while serving it."""
        ...


class Stage(Protocol):
    name: str

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result: ...


NO_PARAMS: dict[str, str] = {}  # shared: stages replace `params`, never mutate it


class Context:
    """Per-request state the stages share."""

    __slots__ = ("agent", "bot", "client", "decisions", "dry", "embedding", "forwarded_client",
                 "marks", "params", "principal", "quiet", "request_id", "resolved", "route",
                 "started", "target", "timing")

    def __init__(self, client: str) -> None:
        self.client = client  # "address:port"
        self.request_id = b""
        self.principal: Principal | None = None  # who is calling, once `auth` has run
        # the model worker's fair share a lower tier of the topology signed for this call
        # (x-edgefn-client, checked by `auth`): its caller's, not the forwarding PoP's
        self.forwarded_client: str | None = None
        self.bot: str | None = None  # the client's class, once `bots` has run
        self.agent: str | None = None  # a verified agent's identity (Web Bot Auth)
        self.decisions: dict[str, Any] | None = None  # stage -> what it decided (`decide`)
        self.resolved = False  # `target` was looked up (see `runtime.pipeline.targets`)
        self.target: Target | None = None
        self.route = ""  # the route prefix that matched
        self.params: dict[str, str] = NO_PARAMS  # captures of a /:name route (a new dict)
        self.started = time.perf_counter()
        self.marks: list[tuple[str, float]] = []  # (stage, when it started), if timed
        self.timing = True  # a timed chain marks this request's stages (`tracing` may say no)
        # A warm-up (`runtime.pipeline.warm`): every stage runs, but nothing of it is
        # logged, counted, limited, cached or sent to events. Only the PoP sets it (in
        # process); no header or byte from a client can.
        self.quiet = False
        self.dry = False  # a quiet request that `dispatch` answers without the function
        # the signed query embedding `ai_cache` computed on a miss, for the tier the model
        # call goes to next (`runtime.cache.ai.forward`); kept out of `decisions` (events)
        self.embedding: str | None = None

    @property
    def ip(self) -> str:
        """The client's address without its port."""
        return self.client.rpartition(":")[0] or self.client

    def model_client(self) -> str | None:
        """Whose fair share of the model worker this request's model calls count in
        (the worker protocol's ``client``): the one a lower tier signed, else the
        principal's tenant's (`model_client`), else None (anonymous)."""
        return self.forwarded_client or model_client(self.principal)

    def decide(self, stage: str, record: Any) -> None:
        """Record what `stage` decided (for events and logs): a small JSON-able value.
        A record may be shared by every request that decided the same (ratelimit's
        `PASSED`, http_cache's `NOT_STORED`): what reads it copies, never changes it."""
        if self.decisions is None:
            self.decisions = {}
        self.decisions[stage] = record

    def timings(self) -> dict[str, float]:
        """Milliseconds from each stage's start to the next stage's start (the last
        one's to now): where the time of a request went. Empty unless the chain
        is timed."""
        if not self.marks:
            return {}
        now = time.perf_counter()
        ends = [t for _, t in self.marks[1:]] + [now]
        return {name: round((end - t) * 1000, 3) for (name, t), end in zip(self.marks, ends,
                                                                           strict=True)}

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000


def then(result: Result, after: Callable[..., Response], *args: Any) -> Result:
    """`after(response, *args)` applied to `result` now if it is a Response, else
    once it resolves: the synchronous path stays synchronous."""
    if isinstance(result, Response):
        return after(result, *args)
    return _then(result, after, args)


async def _then(pending: Awaitable[Response], after: Callable[..., Response],
                args: tuple[Any, ...]) -> Response:
    return after(await pending, *args)


async def counted(body: AsyncIterator[bytes], done: Callable[[int], None],
                  failed: list[Exception] | None = None) -> AsyncIterator[bytes]:
    """`body` relayed chunk by chunk; once it ends, fails or the client goes away,
    `body` is closed and ``done(bytes sent)`` is called (what observing stages log);
    what it failed with, if it did, is added to `failed` first."""
    sent = 0
    try:
        async for chunk in body:
            sent += len(chunk)
            yield chunk
    except Exception as e:
        if failed is not None:
            failed.append(e)
        raise
    finally:
        aclose = getattr(body, "aclose", None)
        if aclose is not None:
            await aclose()
        done(sent)
