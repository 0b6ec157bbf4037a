"""What limits a PoP enforces, as `edgefn limits show` prints them: the config's
rules, tenants' budgets, the active keys' limits, bot budgets, and each deployed
function's own ``[[rate_limits]]`` (the admin API's ``GET /v1/limits`` answers it
from the running PoP)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from runtime.security.keys import KeyStore
from runtime.security.settings import BotSettings, RateLimitSettings, RateRule


def in_force(rl: RateLimitSettings, bots: BotSettings, keys: KeyStore,
             functions: Iterable[tuple[str, list[RateRule]]] = ()) -> dict[str, Any]:
    """JSON-able: storage, rules, tenants, keys, bots, functions. Raises what reading
    the key file raises (`InvalidConfig`)."""
    active = [{"id": k.id, "tenant": k.tenant, "rpm": k.rpm, "tpm": k.tpm,
               "max_streams": k.max_streams} for k in keys.read()
              if k.state(time.time()) == "active"]
    return {"storage": rl.storage, "ip_aggregation": f"/{rl.ipv4_prefix} /{rl.ipv6_prefix}",
            "rules": [_rule(r) for r in rl.rules],
            "tenants": {t: {"rpm": v.rpm, "tpm": v.tpm, "max_streams": v.max_streams}
                        for t, v in rl.tenants.items()},
            "keys": active, "bots": dict(bots.budgets),
            "functions": {name: [_rule(r) for r in rules] for name, rules in functions
                          if rules}}


def _rule(r: RateRule) -> dict[str, str]:
    return {"by": r.by, "limit": r.limit, "algorithm": r.algorithm}
