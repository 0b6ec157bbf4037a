"""Consistent rollouts across the PoPs of a running topology (or one PoP).

A deploy is two-phase: every PoP stages the version (validate, store, compile,
pre-warm, check routes: everything but the switch) in parallel; only if all
staged does any PoP switch. If one fails to stage, the others abort: no PoP
changed. The switch is sent to every PoP at once; each PoP's switch is one
assignment, so the versions differ between PoPs only in the window between the
first and the last switch (`Rollout.window_ms`, from the PoPs' own clocks). If a
PoP fails to switch, those that switched go back to what they served before: their
previous version and the canary that ran beside it. A rollback stages a stored
version the same way (and removes the function where no version served before);
a promote switches every PoP whose canary is the same version, after checking
they all have it.

Errors are `RolloutError`s naming each PoP that failed and why.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from edgefn_core.errors import EdgefnError, InvalidConfig, RolloutError
from runtime.admin.client import AdminClient
from runtime.functions.deploys import CanaryInfo, FunctionRecord
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
    removed: list[str] = []  # a rollback's PoPs where no version served before: removed


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
    `RolloutError` if a PoP fails to (the PoPs that switched are undone first), or
    cannot say what it serves just before (aborted everywhere: no PoP changed)."""
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
    before = _records_before(pops, name, staged)
    body = json.dumps({"version": version, "canary": canary}).encode()
    done = each(pops, lambda _, c: c.request("POST", f"/v1/functions/{name}/activate", body))
    failed = [o for o in done if o.error is not None]
    if failed:
        undone = undo(pops, name, [o for o in done if o.error is None], before,
                      canary is None)
        abort(pops, [o for o in staged if o.pop in {f.pop for f in failed}])
        raise RolloutError(f"{_failures('activate', failed)}; {undone}")
    times = [o.value["switched_at"] for o in done if o.value["changed"]]
    window = (max(times) - min(times)) * 1000 if times else 0.0
    return Rollout(name, version, previous, True, canary, round(window, 3))


def _records_before(pops: Pops, name: str, staged: list[Outcome]
                    ) -> dict[str, FunctionRecord | None]:
    """`name`'s record on each PoP (None where it has none), read just before a
    switch: what `undo` puts back. Raises `RolloutError` if a PoP cannot say, after
    aborting what was staged everywhere."""
    got = _read(pops, name)
    failed = [o for o in got if o.error is not None and o.code != "not_found"]
    if failed:
        abort(pops, staged)
        raise RolloutError(f"{_failures('reading versions', failed)}; aborted everywhere: "
                           "no PoP changed")
    return {o.pop: None if o.error is not None else msgspec.convert(o.value, FunctionRecord)
            for o in got}


def undo(pops: Pops, name: str, switched: list[Outcome],
         before: dict[str, FunctionRecord | None], live: bool) -> str:
    """Put the PoPs that switched back as they were (`before`: each one's record
    then, None where it did not serve `name`): the live version, if the switch
    changed it (`live`; else it started a canary), and the canary that ran beside
    it (the switch ended it, or replaced it with its own). Says what it did."""
    back = {o.pop for o in switched if o.value["changed"]}

    def revert(pop: str, c: AdminClient) -> Any:
        was = before[pop]
        if was is None:
            return c.request("DELETE", f"/v1/functions/{name}")
        if live:
            c.request("POST", f"/v1/functions/{name}/rollback",
                      json.dumps({"version": was.current}).encode())
        elif was.canary is None:
            return c.request("POST", f"/v1/functions/{name}/rollback", b"{}")  # drops it
        return _restart_canary(c, name, was.canary) if was.canary is not None else None

    results = each([p for p in pops if p[0] in back], revert)
    bad = [o for o in results if o.error is not None]
    said = f"put back on {', '.join(sorted(back)) or 'no PoP'}"
    return said + (f"; {_failures('undo', bad)}" if bad else "")


def _restart_canary(c: AdminClient, name: str, canary: CanaryInfo) -> Any:
    """Run `canary` beside the live version again (it replaces any canary there).
    Raises `EdgefnError`; then nothing stays staged."""
    version = json.dumps({"version": canary.version}).encode()
    c.request("POST", f"/v1/functions/{name}/stage", version)
    try:
        return c.request("POST", f"/v1/functions/{name}/activate", json.dumps(
            {"version": canary.version, "canary": canary.percent}).encode())
    except EdgefnError:
        with contextlib.suppress(EdgefnError):  # the activate's error says what went wrong
            c.request("POST", f"/v1/functions/{name}/abort", version)
        raise


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
    stage version `to` (which every PoP must hold) everywhere, then switch; without
    `to`, the version that served before the current one (the same everywhere)
    where one did, and once those switched, `name` is removed where none did
    (`Rollout.removed`). PoPs without the function are left as they are
    (`Rollout.skipped`). Raises `RolloutError`."""
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
    targets = _holding(name, to, recs) if to else _previous(name, recs)
    target = next(v for v in targets.values() if v is not None)
    back = [p for p in pops if targets[p[0]] is not None]
    staged = stage(back, lambda _, c: c.request("POST", f"/v1/functions/{name}/stage",
                                             json.dumps({"version": target}).encode()))
    done = activate(back, staged)
    gone = [p for p in pops if targets[p[0]] is None]
    if gone:
        done.previous = {**done.previous, **{p[0]: recs[p[0]]["current"] for p in gone}}
        _remove(gone, name, done)
    return done


def _holding(name: str, to: str, recs: dict[str, dict[str, Any]]) -> dict[str, str | None]:
    """`to` for every PoP, each of which must hold it. Raises `RolloutError` naming
    those that do not."""
    lacking = sorted(pop for pop, r in recs.items()
                     if to not in {v["version"] for v in r["versions"]})
    if lacking:
        holding = sorted(set(recs) - set(lacking))
        raise RolloutError(f"{name}: version {to} is not stored on {', '.join(lacking)} "
                           f"(only on {', '.join(holding) or 'no PoP'}); roll back without a "
                           "version to go back to what served before on each PoP, or deploy "
                           "it again; no PoP changed")
    return dict.fromkeys(recs, to)


def _previous(name: str, recs: dict[str, dict[str, Any]]) -> dict[str, str | None]:
    """Per PoP the version before the current one: the same on every PoP where one
    served before it, None where none did. Raises `RolloutError` if the current
    versions differ, the previous ones do, or no PoP had one."""
    currents = {pop: r["current"] for pop, r in recs.items()}
    if len(set(currents.values())) > 1:
        raise RolloutError(f"PoPs serve different versions of {name!r} ({_listed(currents)}): "
                           "name the version to go back to")
    before = {pop: _before(r) for pop, r in recs.items()}
    current = next(iter(currents.values()))
    had = {pop: v for pop, v in before.items() if v is not None}
    if not had:
        where = "any PoP" if len(before) > 1 else next(iter(before))
        raise RolloutError(f"{name}: {current} is the oldest version that served on {where}, "
                           f"none before it to roll back to (`edgefn rollback {name} VERSION` "
                           "serves a stored one); no PoP changed")
    if len(set(had.values())) > 1:
        raise RolloutError(f"PoPs served different versions of {name!r} before {current} "
                           f"({_listed(had)}): name the version to go back to")
    return before


def _remove(pops: Pops, name: str, done: Rollout) -> None:
    """Remove `name` from `pops` (no version served there before the current one),
    once the others went back: a removal cannot be undone. Records them in `done`.
    Raises `RolloutError` naming each PoP where it failed."""
    deleted = each(pops, lambda _, c: c.request("DELETE", f"/v1/functions/{name}"))
    done.removed = sorted(o.pop for o in deleted if o.error is None)
    failed = [o for o in deleted if o.error is not None]
    if failed:
        dirs = {p[0]: p[1] for p in pops}
        again = "; ".join(f"`edgefn delete {name} --data {dirs[o.pop]}`" for o in failed)
        also = f", and was removed from {', '.join(done.removed)}" if done.removed else ""
        raise RolloutError(f"{name} went back to {done.version} where a version served before"
                           f"{also}; {_failures('removing it', failed)}: it still serves "
                           f"there; once the PoP is back, remove it with {again}")


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
    PoP fails to switch, those that did go back to their previous live version and
    its canary."""
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
        before: dict[str, FunctionRecord | None] = {
            pop: msgspec.convert(r, FunctionRecord) for pop, r in recs.items()}
        raise RolloutError(f"{_failures('promote', failed)}; "
                           f"{undo(pops, name, ok, before, True)}")
    version = next(iter(canaries.values()))
    return Rollout(name, str(version), dict(previous), True, skipped=skipped)
