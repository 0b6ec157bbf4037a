"""`ratelimit`: request rates per client address (aggregated to /24, /64 when
configured), API key, tenant, verified agent, function and model.

The limits a request meets: the PoP's ``[ratelimit] rules``, its function's
``[[rate_limits]]`` (counted per function), its key's ``rpm`` and its tenant's
``rpm``. A full limit answers 429 ``rate_limited`` with ``Retry-After`` and the
``RateLimit-Policy`` / ``RateLimit`` fields, which also go on admitted responses
when ``headers = true``. A request no limit applies to costs a few attribute
reads. In memory the stage stays synchronous; on Redis it awaits only when a
limit applies, and while Redis cannot be reached ``on_storage_error`` decides
(`runtime.security.ratelimit.outage`: admitted uncounted, or 503). Token budgets
are the OpenAI API's (`runtime.security.ratelimit.admission`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec

from edgefn_core.errors import Rejected
from runtime.net.message import Request, Response
from runtime.pipeline.contain import rendered
from runtime.pipeline.stage import Context, Next, Result, then
from runtime.pipeline.targets import Targets
from runtime.security.ratelimit.addresses import Aggregator
from runtime.security.ratelimit.counters import Check as CounterCheck
from runtime.security.ratelimit.headers import fields, retry_after
from runtime.security.ratelimit.limiter import (
    Check,
    Limit,
    Limiter,
    Outcome,
    compile_rules,
    per_minute,
)
from runtime.security.ratelimit.outage import Outage, StorageDown
from runtime.security.settings import RateLimitSettings, TargetPolicy

if TYPE_CHECKING:
    from runtime.pipeline.stage import Target

log = logging.getLogger("edgefn.pop")
PASSED = {"limited": None}  # the decision of an admitted request (shared, never changed)


class _Model(msgspec.Struct):
    model: str


_model_decoder = msgspec.json.Decoder(_Model)


class RateLimit:
    name = "ratelimit"

    def __init__(self, settings: RateLimitSettings, targets: Targets,
                 limiter: Limiter | None = None, where: str = "<config>",
                 table: str | None = None) -> None:
        """`table`: the shared table of ``workers = N`` (`Limiter`). Raises
        `InvalidConfig` for a rule or storage the PoP cannot use, OSError or
        ValueError for a table it cannot map."""
        self.settings = settings
        self.targets = targets
        self.limiter = limiter if limiter is not None else Limiter(settings.storage, where,
                                                                   table)
        self.rules = compile_rules(settings.rules, "by", where, "ratelimit.rules")
        self.limiter.warn_moving(self.rules, "[ratelimit] rules")
        self.ip_rules = [limit for limit in self.rules if limit.by == "ip"]
        self.tenants = {t: per_minute("tenant-rpm", "tenant", lim.rpm)
                        for t, lim in settings.tenants.items() if lim.rpm is not None}
        self.address = Aggregator(settings.ipv4_prefix, settings.ipv6_prefix)
        self.rpm: dict[int, Limit] = {}  # a key's rpm -> its limit
        self.functions: dict[int, tuple[TargetPolicy, list[Limit]]] = {}
        self.outage = Outage(settings.on_storage_error, "rate limits")
        # the native lane's refusals, rendered (`lane_refusal`): by limit and seconds
        self.renders: dict[tuple[Limit, int, int, int], tuple[int, bytes, bytes, str, str]] = {}
        # whether a request for a target may have a principal here (its key's or
        # tenant's limits); `build` asks an `auth` stage before this one
        self.identifies: Callable[[Target | None], bool] = _anyone

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        target = self.targets.resolve(request, ctx)
        if not self.rules and ctx.principal is None and (
                target is None or not target.policy.rate_limits):
            return call_next(request, ctx)  # the fast path: nothing applies
        checks = self._checks(request, ctx, target)
        if not checks or ctx.quiet:  # a warm-up's checks are made (and cached), not counted
            return call_next(request, ctx)
        if self.limiter.remote:
            return self._remote(request, ctx, call_next, checks)
        return self._decided(self.limiter.hit(checks, self.settings.headers), request, ctx,
                             call_next)

    def untouched_anonymous(self, target: Target | None) -> bool:
        """Whether a request for `target` without a principal (none proved: no
        credential) goes on untouched: no PoP rule and none of its function's
        (`__call__`'s fast path)."""
        return not self.rules and (target is None or not target.policy.rate_limits)

    def anonymous(self, target: Target) -> list[tuple[Limit, tuple[str, ...], bool]] | None:
        """The limits a request without a principal for `target` meets, as `_checks`
        finds them, for the native lane (`lane_checks`): each with who it
        counts, and whether the client's address (a ``by = "ip"`` rule's) completes
        that; [] when none applies (nothing decided, as here); None when the lane
        cannot count them as this stage does: on Redis (a hit awaits), or with a
        ``by = "agent"`` rule (a verified agent's name is the bots stage's, in Python)."""
        if self.limiter.remote:
            return None
        out: list[tuple[Limit, tuple[str, ...], bool]] = []
        own = self._function_limits(target) if target.policy.rate_limits else []
        for scope, limits in ((("pop",), self.rules), (("fn", target.name), own)):
            for limit in limits:
                if limit.by == "agent":
                    return None
                if limit.by == "ip":
                    out.append((limit, (*scope, limit.name), True))
                elif limit.by == "function" and target.kind == "function":
                    out.append((limit, (*scope, limit.name, target.name), False))
                # key, tenant: no principal; model: no OpenAI API request
        return out

    def lane_checks(self, limits: list[tuple[Limit, tuple[str, ...], bool]], ip: str
                    ) -> tuple[list[CounterCheck], list[Check]]:
        """The checks a request from `ip` meeting `limits` (`anonymous`) makes, as the
        counters take them at once (the native lane's: `admits_all` before the
        function runs, `count` once it answered, with ``settings.headers``), keyed as
        `__call__` counts them; and as `__call__` hits them (`lane_refusal`'s)."""
        value = self.address(ip)
        checks = [(limit, (*ids, value) if by_ip else ids) for limit, ids, by_ip in limits]
        return self.limiter.prepare(checks), checks

    def lane_refusal(self, checks: list[Check], now: float
                     ) -> tuple[int, bytes, bytes, str, str] | None:
        """`checks` (`lane_checks`' second list) hit at `now` as `__call__` hits a
        request's (each counted up to the first full one): the response the stages
        answer its 429 with (`contain`'s of the `Rejected` `__call__` raises: a
        function's, in the PoP's own error shape) as its status, header lines and body,
        with the full limit's name (its decision's) and the error's code; None when
        every limit admitted it (then counted: the native lane asks only once
        `admits_all` said no at `now`, where one of them is full, and no two checks
        share a counter). Rendered once per limit and the seconds its fields and
        message say (`renders`): a flood of refusals renders one a second."""
        outcome = self.limiter.hit(checks, self.settings.headers, now)
        refused = outcome.refused
        if refused is None:
            return None
        last = outcome.quotas[-1]  # the refused limit's (`_refused`): what `_refusal` reads
        key = (refused, max(1, math.ceil(outcome.retry_after)), max(0, last[3]),
               max(0, math.ceil(last[4])))
        made = self.renders.get(key)
        if made is None:
            over = self._refusal(outcome)
            assert over is not None
            made = (*rendered(over), refused.name, over.code)
            if len(self.renders) >= 1024:
                self.renders.clear()
            self.renders[key] = made
        return made

    def idle_for(self, target: Target | None) -> bool:
        """Whether requests for `target` go on untouched (`runtime.pipeline.plan`):
        no PoP rule, none of its function's, and no principal (whose key or tenant
        may have a limit) possible (`identifies`)."""
        return self.untouched_anonymous(target) and not self.identifies(target)

    async def _remote(self, request: Request, ctx: Context, call_next: Next,
                      checks: list[Check]) -> Response:
        try:
            outcome = await self.limiter.hit_async(checks, self.settings.headers)
        except StorageDown as e:
            ctx.decide("ratelimit", {"limited": None, "storage": "unreachable"})
            self.outage.admit(e)  # raises Rejected (503) when closed
            return await _resolved(call_next(request, ctx))
        return await _resolved(self._decided(outcome, request, ctx, call_next))

    def refused(self, request: Request, ctx: Context
                ) -> Rejected | Awaitable[Rejected | None] | None:
        """Count a request an earlier stage refused (`auth`'s 401) against the PoP's
        ``by = "ip"`` rules: the 429 to answer instead when one of them is full, else
        None (an awaitable of either with remote storage; unreachable: None)."""
        if not self.ip_rules or ctx.quiet:
            return None
        checks = self.ip_checks(ctx.ip)
        if self.limiter.remote:
            return self._refused_remote(checks, ctx)
        return self._over(self.limiter.hit(checks, self.settings.headers), ctx)

    def ip_checks(self, ip: str) -> list[Check]:
        """The checks of the PoP's ``by = "ip"`` rules for a request from `ip`, keyed
        as `refused` counts an earlier stage's refusal (the native lane's too)."""
        value = self.address(ip)
        return [(limit, ("pop", limit.name, value)) for limit in self.ip_rules]

    async def _refused_remote(self, checks: list[Check], ctx: Context) -> Rejected | None:
        try:
            return self._over(await self.limiter.hit_async(checks, self.settings.headers), ctx)
        except StorageDown:
            return None  # the request is refused anyway

    def _over(self, outcome: Outcome, ctx: Context) -> Rejected | None:
        """The 429 for `outcome` (recorded), or None when no limit is full."""
        over = self._refusal(outcome)
        if over is not None and outcome.refused is not None:
            ctx.decide("ratelimit", {"limited": outcome.refused.name})
        return over

    def _refusal(self, outcome: Outcome) -> Rejected | None:
        """The 429 for `outcome`, or None when no limit is full."""
        refused = outcome.refused
        if refused is None:
            return None
        headers = [retry_after(outcome.retry_after)]
        if self.settings.headers:
            headers += fields(outcome.quotas[-1:])
        return Rejected("rate_limited", 429, f"rate limit {refused.name!r} reached: "
                        f"{refused.item.amount} requests per {refused.window} s; retry after "
                        f"{headers[0][1].decode()} s", headers=headers,
                        detail={"policy": refused.name})

    def _decided(self, outcome: Outcome, request: Request, ctx: Context, call_next: Next
                 ) -> Result:
        """Raises `Rejected` (429) when a limit is full."""
        over = self._over(outcome, ctx)
        if over is not None:
            raise over
        ctx.decide("ratelimit", PASSED)
        if not outcome.quotas:
            return call_next(request, ctx)
        return then(call_next(request, ctx), _add, fields(outcome.quotas))

    def _checks(self, request: Request, ctx: Context, target: Target | None) -> list[Check]:
        """The limits this request meets, each with who it counts."""
        checks: list[Check] = []
        for limit in self.rules:
            value = self._value(limit.by, request, ctx, target)
            if value is not None:
                checks.append((limit, ("pop", limit.name, value)))
        if target is not None and target.policy.rate_limits:
            for limit in self._function_limits(target):
                value = self._value(limit.by, request, ctx, target)
                if value is not None:
                    checks.append((limit, ("fn", target.name, limit.name, value)))
        principal = ctx.principal
        if principal is not None:
            if principal.rpm is not None:
                checks.append((self._rpm(principal.rpm), ("key", principal.identity)))
            tenant = self.tenants.get(principal.tenant)
            if tenant is not None:
                checks.append((tenant, ("tenant", principal.tenant)))
        return checks

    def _value(self, by: str, request: Request, ctx: Context, target: Target | None
               ) -> str | None:
        """Who `by` counts for this request; None where it does not apply (no key,
        not a verified agent, not a function, no model)."""
        match by:
            case "ip":
                return self.address(ctx.ip)
            case "key":
                return ctx.principal.identity if ctx.principal is not None else None
            case "tenant":
                return ctx.principal.tenant if ctx.principal is not None else None
            case "agent":
                return ctx.agent
            case "function":
                return target.name if target is not None and target.kind == "function" \
                    else None
            case "model":
                return _model(request) if target is not None and target.kind == "openai" \
                    else None
        return None

    def _function_limits(self, target: Target) -> list[Limit]:
        """A function's rules, compiled once per deployed policy. Raises
        `InvalidConfig` naming the function for a rate that does not parse."""
        policy = target.policy
        hit = self.functions.get(id(policy))
        if hit is None or hit[0] is not policy:
            if len(self.functions) >= 4096:  # policies of deployments long replaced
                self.functions.clear()
            limits = compile_rules(policy.rate_limits, "fn", f"function {target.name!r}",
                                   "rate_limits")
            self.limiter.warn_moving(limits, f"function {target.name!r} (rate_limits)")
            hit = self.functions[id(policy)] = (policy, limits)
        return hit[1]

    def _rpm(self, rpm: int) -> Limit:
        limit = self.rpm.get(rpm)
        if limit is None:
            limit = self.rpm[rpm] = per_minute("key-rpm", "key", rpm)
        return limit

    def close(self) -> None:
        """Stop the memory storage's timer (the sync part of `aclose`)."""
        self.limiter.close()

    async def aclose(self) -> None:
        """Close the limiter's storage (its Redis connections)."""
        await self.limiter.aclose()


def _anyone(target: Target | None) -> bool:
    return True


def _model(request: Request) -> str | None:
    """The ``model`` of an OpenAI API request; None for a body without one (the
    API answers that 400 itself)."""
    try:
        return _model_decoder.decode(request.body).model
    except msgspec.DecodeError:
        return None


def _add(response: Response, headers: list[tuple[bytes, bytes]]) -> Response:
    response.headers.extend(headers)
    return response


async def _resolved(result: Result) -> Response:
    return result if isinstance(result, Response) else await result
