"""Which version of each function every PoP of a topology serves, and drift: a
function whose served version (or canary) is not the same on every PoP that
should serve it, or that one of those does not serve.

Which PoPs should: those the topology file gave it (`topology up` deployed it
there), as long as no other PoP serves it; once one does (a `deploy --topology`
rolls out to every PoP, or a deploy out of band), every PoP. So the default
topology's edges-only function is not drift, and a PoP a rollout missed is. A
function whose owner is pinned to a region (``[[tenant]] residency``) is never
expected outside it: those PoPs refuse it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from edgefn_core.errors import InvalidConfig
from runtime.topology import rollout
from runtime.topology.rundir import pop_dir, read_state

ABSENT = "-"  # a PoP that does not serve the function


class Served(msgspec.Struct):
    version: str
    canary: str | None = None  # "VERSION@PERCENT%" while a canary runs beside it

    def label(self) -> str:
        return self.version + (f" (+canary {self.canary})" if self.canary else "")


class Versions(msgspec.Struct):
    pops: dict[str, dict[str, Served]]  # PoP -> function -> what it serves
    unreachable: dict[str, str] = {}  # PoP -> why it did not answer
    declared: dict[str, list[str]] = {}  # PoP -> the functions `topology up` deployed there
    regions: dict[str, str] = {}  # PoP -> its region ("" for none)
    pins: dict[str, str] = {}  # tenant -> the region it is pinned to
    owners: dict[str, str] = {}  # function -> its manifest's owner, where it names one

    def drift(self) -> dict[str, dict[str, str]]:
        """`drift` of these PoPs, a pinned owner's functions expected in its region."""
        allowed = {name: {p for p, r in self.regions.items() if r == self.pins[owner]}
                   for name, owner in self.owners.items() if owner in self.pins}
        return drift(self.pops, self.declared, allowed)


def served_versions(run: str | Path) -> Versions:
    """Ask every PoP of the topology in `run` what it serves. Raises `InvalidConfig`
    if no topology runs there; a PoP that does not answer is listed as unreachable."""
    got = rollout.each(rollout.pops_of(run),
                       lambda _, c: c.request("GET", "/v1/functions")["functions"], 10.0)
    state = read_state(run)
    declared = {p.name: p.functions for p in state.pops} if state is not None else {}
    regions = {p.name: p.region for p in state.pops} if state is not None else {}
    owners = {str(f["name"]): str(f["owner"]) for o in got if o.error is None
              for f in o.value if f.get("owner")}
    return Versions({o.pop: _served(o.value) for o in got if o.error is None},
                    {o.pop: o.error for o in got if o.error is not None}, declared,
                    regions, _pins(run, list(regions)), owners)


def _pins(run: str | Path, pops: list[str]) -> dict[str, str]:
    """The tenants pinned to a region, as the PoPs' configs say (one is enough: the
    topology writes the same ``[residency] tenants`` in each); {} if none reads."""
    from runtime import config

    for name in pops:
        try:
            return dict(config.load(pop_dir(run, name) / "pop.toml").residency.tenants)
        except (OSError, InvalidConfig):
            continue
    return {}


def _served(functions: list[dict[str, Any]]) -> dict[str, Served]:
    out = {}
    for f in functions:
        c = f.get("canary")
        out[f["name"]] = Served(f["version"], f"{c['version']}@{c['percent']:g}%" if c else None)
    return out


def drift(pops: dict[str, dict[str, Served]], declared: dict[str, list[str]] | None = None,
          allowed: dict[str, set[str]] | None = None) -> dict[str, dict[str, str]]:
    """The functions not served the same on every PoP that should serve them (see the
    module docstring; without `declared`, every PoP should; `allowed`: function ->
    the only PoPs that may, a pinned owner's region): function -> PoP -> label
    (`ABSENT` where such a PoP does not serve it)."""
    declared = declared or {}
    allowed = allowed or {}
    names = sorted({name for served in pops.values() for name in served})
    out = {}
    for name in names:
        serving = {pop for pop, s in pops.items() if name in s}
        given = {pop for pop in pops if name in declared.get(pop, ())}
        should = given if given and serving <= given else set(pops)
        if name in allowed:
            should &= allowed[name] | serving
        labels = {pop: s[name].label() if name in s else ABSENT for pop, s in pops.items()
                  if pop in should}  # every PoP serving it is one of them
        if len(set(labels.values())) > 1:
            out[name] = labels
    return out
