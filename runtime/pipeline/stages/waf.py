"""`waf`: the OWASP Core Rule Set over each request whose target asks for it.

The settings are the PoP's ``[waf]`` with the target function's ``[waf]`` over
them (the OpenAI API, and paths no one serves, take the PoP's; the OpenAI API's
prompt fields are not matched, see `runtime.security.waf.crs`). ``off``: the
request goes on at once. ``detect``: the rules run and their verdict is
recorded (``ctx.decide("waf", ...)``). ``block``: the same, and a request the
rules block is refused with 403 ``waf_blocked`` naming the request id and the
rule ids.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from edgefn_core.errors import InvalidConfig, Rejected
from runtime.net.message import Request, Response
from runtime.pipeline.stage import Context, Next, Result, Target
from runtime.pipeline.stages.refusals import Counter, refuse
from runtime.pipeline.targets import Targets
from runtime.security.settings import WafOverride, WafSettings, merge
from runtime.security.waf.crs import Profile, missing
from runtime.security.waf.engine import Verdict, WafEngine
from runtime.security.waf.engines import Engines

log = logging.getLogger("edgefn.pop")
type Chosen = tuple[WafSettings, Profile]


class Waf:
    name = "waf"

    def __init__(self, settings: WafSettings, targets: Targets,
                 engines: Engines | None = None) -> None:
        """`settings`: the PoP's ``[waf]``. Unless its mode is ``off``, its engine is
        compiled now. Raises `InvalidConfig` (field ``waf.mode``) when the mode is
        ``block`` and the engine or the rules are absent; with ``detect`` that is a
        warning, and each request records the error."""
        self.targets = targets
        self.engines = engines or Engines()
        self.pop: Chosen = (settings, Profile.of(settings))
        self.openai: Chosen = (settings, Profile.of(settings, prompts=True))
        self._merged: dict[int, tuple[WafOverride, Chosen]] = {}  # id(override) -> ...
        self.on_refused: Counter | None = None  # a ratelimit after it counts its 403s
        if settings.mode != "off":
            self._start(settings)

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        settings, profile = self._for(self.targets.resolve(request, ctx))
        if settings.mode == "off":
            return call_next(request, ctx)
        try:
            engine = self.engines.get(profile)
        except InvalidConfig as e:
            return self._unavailable(e, settings, ctx, call_next, request)
        if engine is None:
            return self._after_build(request, ctx, call_next, settings, profile)
        refused = self._inspect(engine, request, ctx, settings)
        if refused is not None:
            return refuse(self.on_refused, request, ctx, refused)
        return call_next(request, ctx)

    def idle_for(self, target: Target | None) -> bool:
        """Whether requests for `target` go on untouched (`runtime.pipeline.plan`):
        its settings' mode is ``off``."""
        return self._for(target)[0].mode == "off"

    def _for(self, target: Target | None) -> Chosen:
        """The settings and rule profile `target`'s requests are inspected with."""
        if target is None:
            return self.pop
        if target.kind == "openai":
            return self.openai
        override = target.policy.waf
        return self.pop if override is None else self._chosen(override)

    def _start(self, settings: WafSettings) -> None:
        reason = missing(settings)
        if reason is None:
            engine = self.engines.build(self.pop[1], pin=True)
            if self.targets.builtin:  # the OpenAI API's own profile
                self.engines.build(self.openai[1], pin=True)
            log.info("stage waf: CRS compiled in %.0f ms (mode %s, paranoia %d)",
                     engine.load_ms, settings.mode, settings.paranoia)
        elif settings.mode == "block":
            raise InvalidConfig("pop.toml", f'mode = "block" needs the WAF: {reason}',
                                "waf.mode")
        else:
            log.warning("stage waf: mode = %r but the WAF cannot run: %s", settings.mode, reason)

    def _chosen(self, override: WafOverride) -> Chosen:
        hit = self._merged.get(id(override))
        if hit is not None and hit[0] is override:
            return hit[1]
        settings = merge(self.pop[0], override)
        chosen = (settings, Profile.of(settings))
        if len(self._merged) > 4096:  # ids of replaced deployments' policies
            self._merged.clear()
        self._merged[id(override)] = (override, chosen)
        return chosen

    def _inspect(self, engine: WafEngine, request: Request, ctx: Context,
                 settings: WafSettings) -> Rejected | None:
        """Record the verdict; the 403 when it blocks in block mode."""
        started = time.perf_counter()
        rid = ctx.request_id.decode()
        verdict = engine.inspect(request, ctx.client, settings.max_body_bytes, rid)
        block = verdict.blocked and settings.mode == "block"
        ctx.decide("waf", _record(settings, verdict, block, started))
        if not block:
            return None
        return Rejected("waf_blocked", 403, f"request blocked by the WAF (rules "
                        f"{verdict.rules}, request {rid})",
                        detail={"request_id": rid, "rules": verdict.rules})

    async def _after_build(self, request: Request, ctx: Context, call_next: Next,
                           settings: WafSettings, profile: Profile) -> Response:
        try:
            engine = await self.engines.built(profile)
        except InvalidConfig as e:
            result = self._unavailable(e, settings, ctx, call_next, request)
        else:
            refused = self._inspect(engine, request, ctx, settings)
            result = call_next(request, ctx) if refused is None else \
                refuse(self.on_refused, request, ctx, refused)
        return result if isinstance(result, Response) else await result

    def _unavailable(self, err: InvalidConfig, settings: WafSettings, ctx: Context,
                     call_next: Next, request: Request) -> Result:
        """No engine for these settings: block mode fails closed (503), detect
        records the error and lets the request through."""
        ctx.decide("waf", {"mode": settings.mode, "error": err.reason})
        if settings.mode == "block":
            raise Rejected("waf_unavailable", 503, f"the WAF cannot run: {err.reason}",
                           detail={"request_id": ctx.request_id.decode()})
        return call_next(request, ctx)


def _record(settings: WafSettings, verdict: Verdict, block: bool,
            started: float) -> dict[str, Any]:
    """`blocked`: refused here; `would_block`: in detect mode, what block would do."""
    record: dict[str, Any] = {"mode": settings.mode, "rules": verdict.rules,
                              "score": verdict.score, "blocked": block,
                              "ms": round((time.perf_counter() - started) * 1000, 3)}
    if settings.mode == "detect":
        record["would_block"] = verdict.blocked
    if verdict.truncated:
        record["truncated"] = True  # only the first max_body_bytes were inspected
    return record
