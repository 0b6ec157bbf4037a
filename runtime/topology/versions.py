"""Which version of each function every PoP of a topology serves, and drift: a
function whose served version (or canary) is not the same on every PoP, or
that some PoPs do not serve at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from runtime.topology import rollout

ABSENT = "-"  # a PoP that does not serve the function


class Served(msgspec.Struct):
    version: str
    canary: str | None = None  # "VERSION@PERCENT%" while a canary runs beside it

    def label(self) -> str:
        return self.version + (f" (+canary {self.canary})" if self.canary else "")


class Versions(msgspec.Struct):
    pops: dict[str, dict[str, Served]]  # PoP -> function -> what it serves
    unreachable: dict[str, str] = {}  # PoP -> why it did not answer


def served_versions(run: str | Path) -> Versions:
    """Ask every PoP of the topology in `run` what it serves. Raises `InvalidConfig`
    if no topology runs there; a PoP that does not answer is listed as unreachable."""
    got = rollout.each(rollout.pops_of(run),
                       lambda _, c: c.request("GET", "/v1/functions")["functions"], 10.0)
    return Versions({o.pop: _served(o.value) for o in got if o.error is None},
                    {o.pop: o.error for o in got if o.error is not None})


def _served(functions: list[dict[str, Any]]) -> dict[str, Served]:
    out = {}
    for f in functions:
        c = f.get("canary")
        out[f["name"]] = Served(f["version"], f"{c['version']}@{c['percent']:g}%" if c else None)
    return out


def drift(pops: dict[str, dict[str, Served]]) -> dict[str, dict[str, str]]:
    """The functions not served the same on every PoP: function -> PoP -> label
    (`ABSENT` where that PoP does not serve it)."""
    names = sorted({name for served in pops.values() for name in served})
    out = {}
    for name in names:
        labels = {pop: s[name].label() if name in s else ABSENT for pop, s in pops.items()}
        if len(set(labels.values())) > 1:
            out[name] = labels
    return out
