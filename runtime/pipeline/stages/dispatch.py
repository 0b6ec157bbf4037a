"""`dispatch`: run the function `route` chose, with what its route captured; its
response is tagged with ``x-edgefn-function: NAME@VERSION``. What the function
does wrong is raised as `FunctionError` and contained by the chain."""

from __future__ import annotations

from runtime.functions.registry import Deployment
from runtime.net.message import Request, Response
from runtime.pipeline.stage import Context, Next, Result, then


class Dispatch:
    name = "dispatch"

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        fn = ctx.target
        assert isinstance(fn, Deployment), "dispatch runs after route"
        result = fn.executor.handle(request, ctx.route, ctx.params)
        if isinstance(result, Response):
            result.headers.append(fn.tag)
            return result
        return then(result, _tagged, fn.tag)


def _tagged(response: Response, tag: tuple[bytes, bytes]) -> Response:
    response.headers.append(tag)
    return response
