"""Per-target plans: the stages a request for a given target goes through.

A stage may declare, next to its code, that as configured now it does nothing for
a target: ``idle_for(target) -> bool`` is True only when the stage would hand
every request for that target (None: a path nothing serves) to the next stage
unchanged, set nothing on the context and record nothing. A declaring stage looks
the target up before it changes the request or the context. A stage that does not
declare it is never skipped. One whose answer can change while the PoP runs says
when (``plan_stamp()``: a value that changes with it; auth's, with the key file).

The `Planner` stands where the first declaring stage stood. It looks the target
up there (where that stage would have, first thing) and hands the request to the
target's plan: the rest of the chain without the stages idle for it, linked once
and kept per target object. Plans are made again when the routes change (a
deploy, rollback or removal replaces ``registry.router``) or a stamp does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from runtime.net.message import Request
from runtime.pipeline.contain import contain
from runtime.pipeline.links import Link, linked
from runtime.pipeline.stage import Context, Next, Result, Stage, Target
from runtime.pipeline.targets import Targets

MAX_PLANS = 4096  # targets planned (deployments long replaced are dropped with the rest)


def planned(stages: Sequence[Stage], link: Link, last: Next, targets: Targets
            ) -> tuple[Next, Planner | None]:
    """`stages` linked as `linked` does, a `Planner` in place of the first one that
    declares ``idle_for`` and those after it; and that planner (None: no stage
    declares it)."""
    first = next((i for i, s in enumerate(stages) if _declares(s)), None)
    if first is None:
        return linked(stages, link, last), None
    planner = Planner(stages[first:], link, last, targets)
    return linked(stages[:first], link, planner), planner


class Planner:
    """``planner(request, ctx)``: the request through its target's plan."""

    def __init__(self, stages: Sequence[Stage], link: Link, last: Next,
                 targets: Targets) -> None:
        self.stages = list(stages)
        self.link = link
        self.last = last
        self.targets = targets
        self.registry = targets.registry
        self._stamp = _stamp([s.plan_stamp for s in stages if hasattr(s, "plan_stamp")])
        self._plans: dict[int, tuple[Target | None, Next]] = {}
        self._router: object = None  # the routes the plans were made for
        self._stamped: object = None  # and the stages' stamp

    def __call__(self, request: Request, ctx: Context) -> Result:
        try:
            target = self.targets.resolve(request, ctx)
        except Exception as e:  # what the first declaring stage's link would contain
            return contain(ctx, e)
        stamp = self._stamp() if self._stamp is not None else None
        if self.registry.router is not self._router or stamp != self._stamped:
            self._plans.clear()
            self._router, self._stamped = self.registry.router, stamp
        hit = self._plans.get(id(target))
        if hit is None or hit[0] is not target:
            hit = self._plan(target)
        return hit[1](request, ctx)

    @property
    def stamp(self) -> Callable[[], object] | None:
        """The stages' stamp: plans are made again when it (or the routes) change."""
        return self._stamp

    def kept(self, target: Target | None) -> list[Stage]:
        """The stages a request for `target` goes through, from the planner on."""
        return [s for s in self.stages if not _idle(s, target)]

    def skipped(self, target: Target | None) -> list[str]:
        """The names of the stages a request for `target` skips."""
        return [s.name for s in self.stages if _idle(s, target)]

    def _plan(self, target: Target | None) -> tuple[Target | None, Next]:
        kept = [s for s in self.stages if not _idle(s, target)]
        if len(self._plans) >= MAX_PLANS:
            self._plans.clear()
        hit = self._plans[id(target)] = (target, linked(kept, self.link, self.last))
        return hit



def _stamp(stamps: list[Callable[[], object]]) -> Callable[[], object] | None:
    """One call that changes when any of `stamps` does (the common case: auth's alone)."""
    if len(stamps) <= 1:
        return stamps[0] if stamps else None
    return lambda: tuple([stamp() for stamp in stamps])


def _declares(stage: Stage) -> bool:
    return callable(getattr(stage, "idle_for", None))


def _idle(stage: Stage, target: Target | None) -> bool:
    """What `stage` declares for `target`; False when it declares nothing, or when
    its declaration fails (it runs, and fails where it always did)."""
    idle_for = getattr(stage, "idle_for", None)
    if idle_for is None:
        return False
    try:
        return bool(idle_for(target))
    except Exception:
        return False
