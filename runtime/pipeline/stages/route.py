"""`route`: find the deployed function that serves (host, path) and what its route
captured (``ctx.route``, ``ctx.params``), unless an earlier stage already
resolved it; 404 when none does."""

from __future__ import annotations

from edgefn_core.errors import NoRoute
from runtime.functions.registry import Deployment
from runtime.net.message import Request
from runtime.pipeline.contain import plain_error
from runtime.pipeline.stage import Context, Next, Result, Target
from runtime.pipeline.targets import Targets


class Route:
    name = "route"

    def __init__(self, targets: Targets) -> None:
        self.targets = targets

    def idle_for(self, target: Target | None) -> bool:
        """Whether requests for `target` go on untouched (`runtime.pipeline.plan`):
        a deployed function's."""
        return isinstance(target, Deployment)

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        target = self.targets.resolve(request, ctx)
        if not isinstance(target, Deployment):
            path = request.path.decode("latin-1")
            return plain_error(NoRoute(f"no function serves {path}"))
        return call_next(request, ctx)
