"""The links that join stages into a chain: each calls its stage with the next
link as ``call_next`` and contains what the stage raises, so the stages before it
always get a `Response` back and can still add their headers or log it. A timed
link also marks when its stage started (for `Context.timings`)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

from edgefn_core.errors import NotFound
from runtime.net.message import Request, Response
from runtime.pipeline.contain import contain, plain_error
from runtime.pipeline.stage import Context, Next, Result, Stage

type Link = Callable[[Stage, Next], Next]


def linked(stages: Sequence[Stage], link: Link, last: Next) -> Next:
    """`stages` in order, each with a `link`, the last one's ``call_next`` being `last`."""
    first = last
    for stage in reversed(stages):
        first = link(stage, first)
    return first


def link(stage: Stage, nxt: Next) -> Next:
    def handler(request: Request, ctx: Context) -> Result:
        try:
            result = stage(request, ctx, nxt)
        except Exception as e:
            return contain(ctx, e)
        if isinstance(result, Response):
            return result
        return guard(result, ctx)

    return handler


def timed_link(stage: Stage, nxt: Next) -> Next:
    name = stage.name
    clock = time.perf_counter
    untimed = link(stage, nxt)

    def handler(request: Request, ctx: Context) -> Result:
        if ctx.timing:
            ctx.marks.append((name, clock()))
        return untimed(request, ctx)

    return handler


async def guard(pending: Awaitable[Response], ctx: Context) -> Response:
    """`pending`'s response, or what `contain` makes of what it raises."""
    try:
        return await pending
    except Exception as e:
        return contain(ctx, e)


def end(request: Request, ctx: Context) -> Response:
    """Past the last stage: nothing answered."""
    path = request.path.decode("latin-1")
    return plain_error(NotFound(f"nothing serves {path} (the pipeline has no stage for it)"))
