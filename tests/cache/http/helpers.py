"""A socket-free harness for the http_cache stage: a controlled clock, an origin
that answers what a test tells it and counts its calls, and a function target."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from edgefn_core.errors import EdgefnError, FunctionError
from runtime.cache.http.cache import HttpCache
from runtime.cache.settings import CacheOverride, HttpCacheOverride, HttpCacheSettings
from runtime.cache.stats import CacheStats
from runtime.functions.manifest import Route
from runtime.functions.router import Router
from runtime.net.message import Request, Response
from runtime.pipeline.stage import Context
from runtime.pipeline.stages.http_cache import HttpCacheStage
from runtime.pipeline.targets import Targets
from runtime.security.principal import Principal
from runtime.security.settings import TargetPolicy


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Function:
    """A function target as the registry's deployments are one."""

    kind, name, tenant = "function", "shop", None

    def __init__(self, version: str = "v1", http: HttpCacheOverride | None = None) -> None:
        self.version = version
        self.label = f"shop@{version}"
        self.policy = TargetPolicy()
        self.cache = CacheOverride(http=http)

    def error_response(self, err: EdgefnError) -> Response:
        return Response(err.status)

    def crashed(self, exc: Exception) -> EdgefnError:
        return FunctionError("crash", 502, repr(exc))


Answer = Callable[[Request], Response]


class Origin:
    """The next stage: answers with `answer(request)`, synchronously or (`slow`)
    after yielding to the loop; records each request it saw."""

    def __init__(self, answer: Answer | None = None) -> None:
        self.answer: Answer = answer or (lambda r: ok())
        self.seen: list[Request] = []
        self.slow = False
        self.inflight = 0
        self.max_inflight = 0

    def __call__(self, request: Request, ctx: Context) -> Response | Awaitable[Response]:
        self.seen.append(request)
        if not self.slow:
            return self.answer(request)
        return self._later(request)

    async def _later(self, request: Request) -> Response:
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            for _ in range(3):
                await asyncio.sleep(0)
            return self.answer(request)
        finally:
            self.inflight -= 1

    @property
    def calls(self) -> int:
        return len(self.seen)


def ok(cc: str | None = "max-age=60", body: bytes = b"hello", status: int = 200,
       **headers: str) -> Response:
    h = [(b"content-type", b"text/plain")]
    if cc is not None:
        h.append((b"cache-control", cc.encode()))
    h += [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return Response(status, h, body)


class Harness:
    def __init__(self, settings: HttpCacheSettings | None = None, data: Path | None = None,
                 fn: Function | None = None) -> None:
        self.clock = Clock()
        self.cache = HttpCache(settings or HttpCacheSettings(disk_bytes=0), data, self.clock)
        self.fn = fn or Function()
        self.router = Router([(Route("/shop"), "shop", self.fn)])
        self.targets = Targets(SimpleNamespace(router=self.router, canaries={}))  # type: ignore[arg-type]
        self.stats = CacheStats()
        self.stage = HttpCacheStage(self.cache, self.targets, self.stats)
        self.origin = Origin()

    def deploy(self, fn: Function) -> None:
        self.fn = fn
        self.router = Router([(Route("/shop"), "shop", fn)])
        self.targets.registry = SimpleNamespace(router=self.router, canaries={})  # type: ignore[assignment]

    def call(self, req: Request, principal: Principal | None = None) -> tuple[Response, Context]:
        """One request through the stage, run to its end (a loop only when needed)."""
        ctx = Context(req.client)
        ctx.principal = principal
        return asyncio.run(self._call(req, ctx)), ctx

    async def _call(self, req: Request, ctx: Context) -> Response:
        result: Any = self.stage(req, ctx, self.origin)
        response = result if isinstance(result, Response) else await result
        while self.stage.tasks:  # background revalidations, before the loop goes
            await asyncio.sleep(0)
        return response

    def close(self) -> None:
        self.cache.close()


def request(path: bytes = b"/shop/item", method: bytes = b"GET", query: bytes = b"",
            **headers: str) -> Request:
    h = [(b"host", b"example.com")]
    h += [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return Request(method, path, query, h, b"example.com", "1.1", True, "192.0.2.7:50000")


def header(response: Response, name: bytes) -> bytes | None:
    for k, v in response.headers:
        if k == name:
            return v
    return None


def outcome(r: Response) -> str:
    """What the cache says it did (``x-edgefn-cache``)."""
    return (header(r, b"x-edgefn-cache") or b"").decode()
