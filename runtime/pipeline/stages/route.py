"""`route`: find the deployed function that serves (host, path) and what its route
captured (``ctx.route``, ``ctx.params``), unless an earlier stage already
resolved it; 404 when none does, or 503 ``starting`` (``Retry-After: 1``) while one
may soon (`Registry.starting`: `edgefn dev` still deploying its folders)."""

from __future__ import annotations

from edgefn_core.errors import NoRoute, Starting
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
            starting = self.targets.registry.starting
            if starting is None:
                return plain_error(NoRoute(f"no function serves {path}"))
            response = plain_error(Starting(f"no function serves {path} yet: {starting}; "
                                            "retry"))
            response.headers.append((b"retry-after", b"1"))
            return response
        return call_next(request, ctx)
