"""`Chain`: stages linked in order into one HTTP application.

Each link contains what its stage raises (`runtime.pipeline.links`); a timed
chain also marks when each stage started (for `Context.timings`). An untimed
chain given its `Targets` skips, per target, the stages that declare they do
nothing for it (`runtime.pipeline.plan`). A chain whose stages all answer
synchronously creates no task and no coroutine.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.net.message import Request
from runtime.pipeline.links import end, link, linked, timed_link
from runtime.pipeline.plan import Planner, planned
from runtime.pipeline.stage import Context, Result, Stage, Target
from runtime.pipeline.targets import Targets


class Chain:
    """``chain(request) -> Response | Awaitable[Response]``, the app the HTTP
    front serves."""

    def __init__(self, stages: Sequence[Stage], timed: bool = False,
                 targets: Targets | None = None) -> None:
        """`timed`: record per-stage timings (a few hundred ns per request), every
        stage run. `targets`: what the stages look targets up with; given it, an
        untimed chain runs each target's plan."""
        self.stages = list(stages)
        self.planner: Planner | None = None
        if timed:
            self._first = linked(self.stages, timed_link, end)
        elif targets is None:
            self._first = linked(self.stages, link, end)
        else:
            self._first, self.planner = planned(self.stages, link, end, targets)

    def __call__(self, request: Request) -> Result:
        return self._first(request, Context(request.client))

    def run(self, request: Request, ctx: Context) -> Result:
        """`request` through the chain with a context the caller made (a warm-up's)."""
        return self._first(request, ctx)

    def kept(self, target: Target | None) -> list[Stage] | None:
        """Every stage a request for `target` goes through; None when the chain has
        no per-target plans (a timed chain runs every stage for everyone)."""
        if self.planner is None:
            return None
        before = self.stages[:len(self.stages) - len(self.planner.stages)]
        return [*before, *self.planner.kept(target)]

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
