"""The WAF: the OWASP Core Rule Set run by libmodsecurity.

    crs.py      which rules a `Profile` (paranoia, threshold, exclusions) runs, in
                SecLanguage; whether the engine and the rules are here (`missing`)
    engine.py   `WafEngine`: one compiled rules set; `inspect(request)` -> `Verdict`
    engines.py  `Engines`: one engine per profile, compiled once, off the event loop

The stage that uses them is `runtime.pipeline.stages.waf`.
"""

from __future__ import annotations

from edgefn_core.errors import DeployError
from runtime.security.settings import WafSettings
from runtime.security.waf.crs import Profile, missing

__all__ = ["Profile", "check_available", "missing"]


def check_available(settings: WafSettings, function: str = "this function") -> None:
    """For a deploy: `settings` are the PoP's ``[waf]`` merged with the function's.
    Raises `DeployError` when they ask for ``mode = "block"`` and this PoP has no
    WAF engine or no CRS rules (a function that asks to be protected is refused
    rather than served unprotected)."""
    if settings.mode != "block":
        return
    reason = missing(settings)
    if reason is not None:
        raise DeployError(f'{function}: [waf] mode = "block" needs the WAF, which this PoP '
                          f"cannot run: {reason}")
