"""Consistent rollouts across the PoPs of a running topology (or one PoP).

A deploy is two-phase: every PoP stages the version (validate, store, compile,
pre-warm, check routes: everything but the switch) in parallel; only if all
staged does any PoP switch. If one fails to stage, the others abort: no PoP
changed. The switch is sent to every PoP at once; each PoP's switch is one
assignment, so the versions differ between PoPs only in the window between the
first and the last switch (`Rollout.window_ms`, from the PoPs' own clocks). If a
PoP fails to switch, those that switched go back to their previous version.
A rollback stages a stored version the same way; a promote switches every PoP
whose canary is the same version, after checking they all have it.

Errors are `RolloutError`s naming each PoP that failed and why.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from edgefn_core.errors import EdgefnError, InvalidConfig, RolloutError
from runtime.admin.client import AdminClient
from runtime.functions.deploys import FunctionRecord
from runtime.topology import rundir

Pops = list[tuple[str, Path]]  # (PoP name, its data dir), in the topology's order
Call = Callable[[str, AdminClient], Any]  # (PoP name, its admin client)


class Outcome(msgspec.Struct):
    pop: str
    value: Any = None
    error: str | None = None  # what the PoP (or reaching it) said
    code: str | None = None  # its error code (``pop_unreachable``, ``residency_violation``)


class Rollout(msgspec.Struct):
    name: str
    version: str
    previous: dict[str, str | None]  # per PoP: the live version before (None: not deployed)
    changed: bool
    canary: float | None = None
    window_ms: float = 0.0  # first to last PoP switch
    skipped: dict[str, str] = {}  # PoP -> why the rollout left it as it was
    # per PoP the live version after, where they differ (`version` is then ""): a
    # canary dropped where the PoPs' live versions had drifted apart
    serving: dict[str, str] = {}


def pops_of(run: str | Path) -> Pops:
    """The PoPs of the topology running in `run`. Raises `InvalidConfig` if `run`
    has no ``topology.json`` or it names no PoP, `Failure` if it is unreadable."""
    path = Path(run) / rundir.STATE
    state = rundir.read_state(run)  # Failure for a file that is not a topology's state
    if state is None:
        raise InvalidConfig(str(path), "no such file: no topology runs in this folder (start "
                            "one with `edgefn topology up`, or pass its run dir)")
    if not state.pops:
        raise InvalidConfig(str(path), "names no PoP", "pops")
    return [(p.name, rundir.pop_dir(run, p.name)) for p in state.pops]


def each(pops: Pops, call: Call, timeout: float = 120.0) -> list[Outcome]:
    """`call` on every PoP's admin client at once; one `Outcome` per PoP, in order."""
    with ThreadPoolExecutor(max(1, len(pops))) as pool:
        return list(pool.map(lambda p: _one(p[0], p[1], call, timeout), pops))


def _one(name: str, data: Path, call: Call, timeout: float) -> Outcome:
    try:
        return Outcome(name, call(name, AdminClient(data, timeout)))
    except EdgefnError as e:
        return Outcome(name, error=str(e), code=e.code)


def _failures(phase: str, failed: list[Outcome]) -> str:
    """Each failure once: PoPs that said the same thing are named together (a bad
    package fails alike on every PoP)."""
    by_error: dict[str | None, list[str]] = {}
    for o in failed:
        by_error.setdefault(o.error, []).append(o.pop)
    return "; ".join(f"{phase} failed on PoP{'s' if len(names) > 1 else ''} "
                     f"{', '.join(sorted(names))}: {error}" for error, names in by_error.items())


def _only(pops: Pops, outcomes: list[Outcome]) -> Pops:
    """The PoPs of `outcomes`, in `pops`' order."""
    names = {o.pop for o in outcomes}
    return [p for p in pops if p[0] in names]


# -- deploy --------------------------------------------------------------------------------
def deploy(pops: Pops, package: bytes, source: str = "", canary: float | None = None
           ) -> Rollout:
    """Stage `package` (a tar.gz) on every PoP, then switch every PoP to it (as the
    live version, or as a canary for `canary` percent of request keys). Two kinds of
    PoP are left as they were, named in `Rollout.skipped`: one outside the region
    its owner is pinned to (it refuses the function: ``residency_violation``), and
    for a canary one that does not serve the function (a canary splits a live
    version's traffic). Raises `RolloutError`: nothing changed on any PoP if
    staging failed; if switching failed, the PoPs that switched went back (the
    message says which)."""
    staged = stage(pops, lambda _, c: c.request("POST", "/v1/stage", package,
                                             {"x-edgefn-source": source}),
                   skip={"residency_violation"})
    skipped = {o.pop: str(o.error) for o in staged if o.error is not None}
    staged = [o for o in staged if o.error is None]
    if canary is not None:
        idle = [o for o in staged if o.value["previous"] is None]
        if len(idle) == len(staged):
            abort(pops, staged)
            raise RolloutError(f"{staged[0].value['name']} is not live on any PoP: a canary "
                               "splits a live version's traffic (deploy it first); no PoP "
                               "changed")
        abort(pops, idle)
        skipped |= {o.pop: "does not serve the function (no live version to split)"
                    for o in idle}
        staged = [o for o in staged if o.value["previous"] is not None]
    done = activate(_only(pops, staged), staged, canary)
    done.skipped = skipped
    return done


def stage(pops: Pops, call: Call, skip: frozenset[str] | set[str] = frozenset()
          ) -> list[Outcome]:
    """Run a stage `call` on every PoP; all staged the same version, or raises
    `RolloutError` after aborting it on every PoP that staged it. A PoP that refused
    with a code in `skip` is no failure (its outcome keeps the error) as long as
    another PoP staged."""
    staged = each(pops, call)
    failed = [o for o in staged if o.error is not None and o.code not in skip]
    ok = [o for o in staged if o.error is None]
    if not ok:
        failed = [o for o in staged if o.error is not None]
    versions = {(o.value["name"], o.value["version"]) for o in ok}
    if failed or len(versions) > 1:
        abort(pops, staged)
        why = _failures("stage", failed) or f"PoPs staged different versions: {versions}"
        raise RolloutError(f"{why}; aborted everywhere: no PoP changed")
    return staged


def abort(pops: Pops, staged: list[Outcome]) -> list[Outcome]:
    """Drop what each PoP staged (those where staging succeeded)."""
    done = {o.pop: o.value for o in staged if o.error is None and o.value["changed"]}
    return each([p for p in pops if p[0] in done], lambda pop, c: c.request(
        "POST", f"/v1/functions/{done[pop]['name']}/abort",
        json.dumps({"version": done[pop]["version"]}).encode()))


def activate(pops: Pops, staged: list[Outcome], canary: float | None = None) -> Rollout:
    """Switch every PoP to what it staged (the same version everywhere). Raises
    `RolloutError` if a PoP fails to: the PoPs that switched are undone first."""
    name, version = staged[0].value["name"], staged[0].value["version"]
    previous = {o.pop: o.value["previous"] for o in staged}
    if canary is None and not any(o.value["changed"] for o in staged):
        return Rollout(name, version, previous, False)
    live = sorted(o.pop for o in staged if not o.value["changed"])
    if canary is not None and live:  # nothing was staged there: it has no canary to run
        abort(pops, staged)
        raise RolloutError(f"{name}@{version} is already the live version on "
                           f"{', '.join(live)}: a canary must differ from the live version; "
                           "no PoP changed")
    body = json.dumps({"version": version, "canary": canary}).encode()
    done = each(pops, lambda _, c: c.request("POST", f"/v1/functions/{name}/activate", body))
    failed = [o for o in done if o.error is not None]
    if failed:
        undone = undo(pops, name, [o for o in done if o.error is None], previous, canary)
        abort(pops, [o for o in staged if o.pop in {f.pop for f in failed}])
        raise RolloutError(f"{_failures('activate', failed)}; {undone}")
    times = [o.value["switched_at"] for o in done if o.value["changed"]]
    window = (max(times) - min(times)) * 1000 if times else 0.0
    return Rollout(name, version, previous, True, canary, round(window, 3))


def undo(pops: Pops, name: str, switched: list[Outcome], previous: dict[str, str | None],
         canary: float | None) -> str:
    """Put the PoPs that switched back as they were; says what it did."""
    back = {o.pop for o in switched if o.value["changed"]}

    def revert(pop: str, c: AdminClient) -> Any:
        before = previous[pop]
        if canary is not None:
            return c.request("POST", f"/v1/functions/{name}/rollback", b"{}")  # drops it
        if before is None:
            return c.request("DELETE", f"/v1/functions/{name}")
        return c.request("POST", f"/v1/functions/{name}/rollback",
                         json.dumps({"version": before}).encode())

    results = each([p for p in pops if p[0] in back], revert)
    bad = [o for o in results if o.error is not None]
    said = f"put back on {', '.join(sorted(back)) or 'no PoP'}"
    return said + (f"; {_failures('undo', bad)}" if bad else "")


# -- rollback and promote ------------------------------------------------------------------
def _read(pops: Pops, name: str) -> list[Outcome]:
    """`name`'s deploy record as each PoP answers (or fails to)."""
    return each(pops, lambda _, c: c.request("GET", f"/v1/functions/{name}/versions"))


NOT_SERVED = "does not serve the function"


def _serving(pops: Pops, name: str) -> tuple[Pops, list[Outcome], dict[str, str]]:
    """The PoPs that have a record of `name`, what each said, and those that have
    none (left as they are, as a deploy leaves them: a canary went only where the
    function was live). Raises `RolloutError` if no PoP has one."""
    got = _read(pops, name)
    absent = {o.pop for o in got if o.code == "not_found"}
    if absent and len(absent) == len(got):
        raise RolloutError(f"no PoP of the topology serves {name!r}; no PoP changed")
    return ([p for p in pops if p[0] not in absent], [o for o in got if o.pop not in absent],
            dict.fromkeys(sorted(absent), NOT_SERVED))


def records(pops: Pops, name: str) -> dict[str, dict[str, Any]]:
    """`name`'s deploy record on every PoP that has one. Raises `RolloutError` if one
    cannot say, or none has one."""
    _, got, _ = _serving(pops, name)
    failed = [o for o in got if o.error is not None]
    if failed:
        raise RolloutError(f"{_failures('reading versions', failed)}; no PoP changed")
    return {o.pop: o.value for o in got}


def rollback(pops: Pops, name: str, to: str | None = None) -> Rollout:
    """During a canary (and without `to`): drop the canary everywhere. Otherwise
    stage version `to` (default: the one before the current, which must be the
    same on every PoP) everywhere, then switch. PoPs without the function are
    left as they are (`Rollout.skipped`). Raises `RolloutError`."""
    serving, got, skipped = _serving(pops, name)
    r = _rollback(serving, got, name, to)
    r.skipped = {**skipped, **r.skipped}
    return r


def _rollback(pops: Pops, got: list[Outcome], name: str, to: str | None) -> Rollout:
    unreachable = [o for o in got if o.code == "pop_unreachable"]
    recs = {o.pop: o.value for o in got if o.error is None}
    failed = [o for o in got if o.error is not None and o.code != "pop_unreachable"]
    if to is None and not failed and any(r.get("canary") for r in recs.values()):
        # an emergency: drop a bad canary wherever it can be reached, and say where not
        dropped = _drop_canaries(_only(pops, [o for o in got if o.error is None]), name, recs)
        if unreachable:
            raise RolloutError(f"dropped the canary of {name} on {', '.join(sorted(recs))}; "
                               f"{_failures('reaching', unreachable)}: its canary runs there "
                               "until the PoP is back; run the rollback again then")
        return dropped
    if failed or unreachable:
        raise RolloutError(f"{_failures('reading versions', failed + unreachable)}; "
                           "no PoP changed")
    target = to or _previous(name, recs)
    staged = stage(pops, lambda _, c: c.request("POST", f"/v1/functions/{name}/stage",
                                             json.dumps({"version": target}).encode()))
    return activate(pops, staged)


def _previous(name: str, recs: dict[str, dict[str, Any]]) -> str:
    """The version before the current one, the same on every PoP. Raises `RolloutError`."""
    currents = {pop: r["current"] for pop, r in recs.items()}
    if len(set(currents.values())) > 1:
        raise RolloutError(f"PoPs serve different versions of {name!r} ({_listed(currents)}): "
                           "name the version to go back to")
    before = {pop: _before(r) for pop, r in recs.items()}
    missing = sorted(pop for pop, v in before.items() if v is None)
    current = next(iter(currents.values()))
    if missing:
        others = sorted({v for v in before.values() if v is not None})
        had = f" (the others had {', '.join(others)})" if others else ""
        raise RolloutError(f"{name}: {', '.join(missing)} had no version before {current}"
                           f"{had}; no PoP changed")
    if len(set(before.values())) > 1:
        raise RolloutError(f"PoPs served different versions of {name!r} before {current} "
                           f"({_listed(before)}): name the version to go back to")
    return str(next(iter(before.values())))


def _before(record: dict[str, Any]) -> str | None:
    """The version that served before `record`'s current one on its PoP (as
    `FunctionRecord.previous` says), or None."""
    return msgspec.convert(record, FunctionRecord).previous()


def _listed(per_pop: dict[str, Any]) -> str:
    return ", ".join(f"{pop}: {v}" for pop, v in sorted(per_pop.items()))


def _drop_canaries(pops: Pops, name: str, recs: dict[str, dict[str, Any]]) -> Rollout:
    had = [p for p in pops if recs[p[0]].get("canary")]
    done = each(had, lambda _, c: c.request("POST", f"/v1/functions/{name}/rollback", b"{}"))
    failed = [o for o in done if o.error is not None]
    if failed:
        raise RolloutError(_failures("dropping the canary", failed))
    current = {pop: r["current"] for pop, r in recs.items()}
    if len(set(current.values())) == 1:
        return Rollout(name, next(iter(current.values())), current, bool(had))
    return Rollout(name, "", current, bool(had), serving=current)


def promote(pops: Pops, name: str) -> Rollout:
    """Make the canary the live version on every PoP that serves `name`. Raises
    `RolloutError` (no PoP changed) unless each of them runs the same canary; if a
    PoP fails to switch, those that did go back to their previous live version."""
    pops, got, skipped = _serving(pops, name)
    failed = [o for o in got if o.error is not None]
    if failed:
        raise RolloutError(f"{_failures('reading versions', failed)}; no PoP changed")
    recs = {o.pop: o.value for o in got}
    canaries = {pop: (r.get("canary") or {}).get("version") for pop, r in recs.items()}
    if set(canaries.values()) == {None}:
        where = "this PoP" if len(canaries) == 1 else "any PoP"
        raise RolloutError(f"{name} has no canary on {where} to promote (start one with "
                           f"`edgefn deploy DIR --canary 10%`); no PoP changed")
    if None in canaries.values() or len(set(canaries.values())) > 1:
        raise RolloutError(f"{name}: every PoP must run the same canary to promote it "
                           f"({_listed(canaries)}); no PoP changed")
    previous = {pop: r["current"] for pop, r in recs.items()}
    done = each(pops, lambda _, c: c.request("POST", f"/v1/functions/{name}/promote", b"{}"))
    failed = [o for o in done if o.error is not None]
    if failed:
        ok = [msgspec.structs.replace(o, value={"changed": True}) for o in done
              if o.error is None]
        raise RolloutError(f"{_failures('promote', failed)}; "
                           f"{undo(pops, name, ok, dict(previous), None)}")
    version = next(iter(canaries.values()))
    return Rollout(name, str(version), dict(previous), True, skipped=skipped)
