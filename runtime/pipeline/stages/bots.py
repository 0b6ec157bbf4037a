"""The ``bots`` stage: classify every client and apply its class's policy.

Sets ``ctx.bot`` (the class) and ``ctx.agent`` (a verified agent's identity, for
the rate limits), records ``{"class", "agent", "signals", "action"}`` (and a
refused signature's ``reason``), and refuses the request when the policy of the
target (the PoP's ``[bots] policy`` with the function's ``[bots]`` merged over
it) says so. See `runtime.security.bots.manager` for the signals and actions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgefn_core.errors import Rejected
from runtime.net.message import Request
from runtime.pipeline.stage import Context, Next, Result
from runtime.pipeline.stages.refusals import Counter, refuse
from runtime.pipeline.targets import Targets
from runtime.security.bots.manager import BotManager
from runtime.security.settings import BotSettings


class Bots:
    name = "bots"

    def __init__(self, manager: BotManager, targets: Targets) -> None:
        self.manager = manager
        self.targets = targets
        self.on_refused: Counter | None = None  # a ratelimit after it counts its refusals

    @classmethod
    def from_settings(cls, settings: BotSettings, targets: Targets,
                      data_dir: Path | None = None, workers: int = 1,
                      table: str | None = None) -> Bots:
        """Raises `InvalidConfig` when the agents list or a key directory cannot be used
        (`BotManager.from_settings`: what of it the PoP's workers share, `table`
        included)."""
        return cls(BotManager.from_settings(settings, data_dir, workers, table), targets)

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        target = self.targets.resolve(request, ctx)
        policy = self.manager.policy(target.policy.bots if target is not None else None)
        verdict = self.manager.judge(request, ctx.client, count=not ctx.quiet)
        cls, agent, signals, reason = verdict
        action = getattr(policy, cls)
        ctx.bot, ctx.agent = cls, agent
        record: dict[str, Any] = {"class": cls, "agent": agent, "signals": signals,
                                  "action": action}
        if reason is not None:
            record["reason"] = reason
        ctx.decide("bots", record)
        if action != "allow" and not ctx.quiet:  # a warm-up is neither counted nor refused
            try:
                self.manager.enforce(action, verdict, ctx.client, request)
            except Rejected as e:
                return refuse(self.on_refused, request, ctx, e)
        return call_next(request, ctx)
