"""`Chain`: stages linked in order into one HTTP application.

Each link contains what its stage raises, so the stages before it always get a
`Response` back and can still add their headers or log it; a timed chain also
marks when each stage started (for `Context.timings`). A chain whose stages all
answer synchronously creates no task and no coroutine.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Sequence

from edgefn_core.errors import NotFound
from runtime.net.message import Request, Response
from runtime.pipeline.contain import contain, plain_error
from runtime.pipeline.stage import Context, Next, Result, Stage


class Chain:
    """``chain(request) -> Response | Awaitable[Response]``, the app the HTTP
    front serves."""

    def __init__(self, stages: Sequence[Stage], timed: bool = False) -> None:
        """`timed`: record per-stage timings (a few hundred ns per request)."""
        self.stages = list(stages)
        self._first: Next = _end
        link = _timed_link if timed else _link
        for stage in reversed(self.stages):
            self._first = link(stage, self._first)

    def __call__(self, request: Request) -> Result:
        return self._first(request, Context(request.client))

    def run(self, request: Request, ctx: Context) -> Result:
        """`request` through the chain with a context the caller made (a warm-up's)."""
        return self._first(request, ctx)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.stages]

    async def aclose(self) -> None:
        """Release what stages hold on this loop (a Redis connection): each stage's
        ``aclose()``, if it has one, once the server has stopped."""
        for stage in self.stages:
            aclose = getattr(stage, "aclose", None)
            if aclose is not None:
                await aclose()


def _link(stage: Stage, nxt: Next) -> Next:
    def handler(request: Request, ctx: Context) -> Result:
        try:
            result = stage(request, ctx, nxt)
        except Exception as e:
            return contain(ctx, e)
        if isinstance(result, Response):
            return result
        return _guard(result, ctx)

    return handler


def _timed_link(stage: Stage, nxt: Next) -> Next:
    name = stage.name
    clock = time.perf_counter
    untimed = _link(stage, nxt)

    def handler(request: Request, ctx: Context) -> Result:
        if ctx.timing:
            ctx.marks.append((name, clock()))
        return untimed(request, ctx)

    return handler


async def _guard(pending: Awaitable[Response], ctx: Context) -> Response:
    try:
        return await pending
    except Exception as e:
        return contain(ctx, e)


def _end(request: Request, ctx: Context) -> Response:
    """Past the last stage: nothing answered."""
    path = request.path.decode("latin-1")
    return plain_error(NotFound(f"nothing serves {path} (the pipeline has no stage for it)"))
