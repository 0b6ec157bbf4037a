"""A request a stage refuses (auth's 401, the WAF's 403, bots' 403 or 429) still
counts against the PoP's ``by = "ip"`` rate limits of a ``ratelimit`` stage after
it (`runtime.pipeline.build` wires `RateLimit.refused` in as each one's counter):
a flood of refused requests was never counted, 401 or 403 after 403, never a 429,
each costing the PoP its check (a WAF inspection is 1-2 ms)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from edgefn_core.errors import Rejected
from runtime.net.message import Request, Response
from runtime.pipeline.stage import Context

# what counting a refused request says: the 429 instead, or nothing (or that, later)
type Refusal = Rejected | Awaitable[Rejected | None] | None
type Counter = Callable[[Request, Context], Refusal]


def refuse(counter: Counter | None, request: Request, ctx: Context,
           refusal: Rejected) -> Awaitable[Response]:
    """Count `refusal` of `request` with `counter`, then raise the 429 it comes to,
    else `refusal`; where it counts remotely, an awaitable that raises either."""
    over = counter(request, ctx) if counter is not None else None
    if over is None:
        raise refusal
    if isinstance(over, Rejected):
        raise over from None
    return _later(over, refusal)


async def _later(over: Awaitable[Rejected | None], refusal: Rejected) -> Response:
    raise (await over) or refusal
