"""`route`: find the deployed function that serves (host, path) and what its route
captured (``ctx.route``, ``ctx.params``); 404 when none does."""

from __future__ import annotations

from edgefn_core.errors import NoRoute
from runtime.functions.registry import Registry
from runtime.net.message import Request
from runtime.pipeline.contain import plain_error
from runtime.pipeline.stage import Context, Next, Result


class Route:
    name = "route"

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        hit = self.registry.router.match(request.host, request.path)
        if hit is None:
            path = request.path.decode("latin-1")
            return plain_error(NoRoute(f"no function serves {path}"))
        ctx.target, ctx.route, params = hit
        if params:  # a plain prefix's hit carries the shared, read-only NO_PARAMS
            ctx.params = dict(params)
        return call_next(request, ctx)
