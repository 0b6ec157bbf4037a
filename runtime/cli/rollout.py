"""`deploy`, `rollback`, `promote` and `versions` across the PoPs of a running
topology (``--topology RUN_DIR``), and canaries (``--canary 10%``) on one PoP or
all; without those options they are the one-PoP commands of `runtime.cli.commands`.
Each raises `EdgefnError` for `main` to report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from edgefn_core.errors import Failure, NotFound
from runtime.cli import commands


def _pops(args: argparse.Namespace) -> Any:
    """The PoPs a command acts on: the topology's, or the one on ``--data``.
    Raises `InvalidConfig` for a run dir without a topology."""
    from runtime.topology import rollout

    if args.topology is not None:
        return rollout.pops_of(args.topology)
    return [(str(args.data), Path(args.data))]


def _where(pops: list[tuple[str, Path]]) -> str:
    return f"{len(pops)} PoPs ({', '.join(p[0] for p in pops)})" if len(pops) > 1 else pops[0][0]


def deploy(args: argparse.Namespace) -> None:
    """Stage everywhere, then switch everywhere (or start a canary)."""
    if args.topology is None and args.canary is None:
        return commands.deploy(args)
    from runtime.functions import deploys
    from runtime.topology import rollout

    canary: float | None = args.canary  # a share the parser checked
    pops = _pops(args)
    package = deploys.to_tar(deploys.pack_dir(args.dir))
    r = rollout.deploy(pops, package, str(args.dir).rstrip("/"), canary)
    if args.json:
        return commands._print_json(_builtins(r))
    what = f"canary {r.name} version {r.version} at {canary:g}%" if canary is not None else \
        f"{'deployed' if r.changed else 'unchanged'} {r.name} version {r.version}"
    served = [p for p in pops if p[0] not in r.skipped]
    print(f"{what} on {_where(served)}; switch window {r.window_ms} ms")
    _left(r)


def rollback(args: argparse.Namespace) -> None:
    """Go back everywhere (removing the function where no version served before), or
    drop a canary everywhere. Raises `Failure` (usage) for both VERSION and a
    different --to (--to was ignored), `NotFound` for a VERSION no PoP holds."""
    if args.version is not None and args.to is not None and args.version != args.to:
        raise Failure("usage", 400, f"edgefn rollback: give VERSION ({args.version}) or --to "
                      f"({args.to}), not both")
    version = args.version if args.version is not None else args.to  # "" names no version
    if args.topology is None:
        args.version = version
        return commands.rollback(args)
    from runtime.topology import rollout

    pops = _pops(args)
    if version is not None:  # a prefix of a version any PoP holds; rollout.rollback
        recs = rollout.records(pops, args.name)  # names the PoPs that lack it
        known = {v["version"] for r in recs.values() for v in r["versions"]}
        version = commands.resolve_version(args.name, version, sorted(known),
                                           f" --topology {args.topology}")
    r = rollout.rollback(pops, args.name, version)
    if args.json:
        return commands._print_json(_builtins(r))
    if r.serving:  # the live versions differ (drift): each PoP's
        print(f"{r.name} now serves " + ", ".join(f"version {v} on {pop}" for pop, v
                                                   in sorted(r.serving.items())))
    else:
        served = [p for p in pops if p[0] not in r.skipped and p[0] not in r.removed]
        print(f"{r.name} now serves version {r.version} on {_where(served)}")
    if r.removed:
        print(f"removed {r.name} from {', '.join(r.removed)} (no version served there "
              f"before {r.previous[r.removed[0]]})")
    _left(r)


def promote(args: argparse.Namespace) -> None:
    """The canary becomes the live version everywhere."""
    from runtime.topology import rollout

    pops = _pops(args)
    r = rollout.promote(pops, args.name)
    if args.json:
        return commands._print_json(_builtins(r))
    print(f"promoted {r.name} version {r.version} on "
          f"{_where([p for p in pops if p[0] not in r.skipped])}")
    _left(r)


def _left(r: Any) -> None:
    """The PoPs a rollout left as they were, and why."""
    for pop, why in sorted(r.skipped.items()):
        print(f"  left as it was: {pop}: {why}")


def versions(args: argparse.Namespace) -> None:
    """One PoP's versions of NAME, or what every PoP of a topology serves, with drift.
    Raises `NotFound` for a NAME no PoP of the topology serves (each answered)."""
    if args.topology is None:
        if args.name is None:
            raise Failure("usage", 400, "edgefn versions: give a function NAME, or --topology "
                          "RUN_DIR")
        return commands.versions(args)
    from runtime.topology.versions import ABSENT, served_versions

    v = served_versions(args.topology)
    if args.name is not None:
        v.pops = {pop: {n: s for n, s in fns.items() if n == args.name}
                  for pop, fns in v.pops.items()}
        if not v.unreachable and not any(v.pops.values()):
            raise NotFound(f"no PoP of the topology serves {args.name!r} (`edgefn versions "
                           f"--topology {args.topology}` lists what they serve)")
    drifted = v.drift()
    if args.json:
        commands._print_json({**_builtins(v), "drift": drifted})
    else:
        print(f"{'POP':<16} {'FUNCTION':<20} VERSION")
        for pop, fns in v.pops.items():
            for name, s in sorted(fns.items()):
                print(f"{pop:<16} {name:<20} {s.label()}{'  DRIFT' if name in drifted else ''}")
        for pop, why in v.unreachable.items():
            print(f"{pop:<16} {'(unreachable)':<20} {why}")
        for name, labels in drifted.items():
            listed = ", ".join(f"{p}={lab}" for p, lab in labels.items() if lab)
            print(f"drift: {name}: {listed}" + (f" ({ABSENT}: not served)"
                                                if ABSENT in labels.values() else ""))
    if v.unreachable:  # exit status 1: a script cannot take the listing as complete
        raise Failure("pop_unreachable", 502, "not checked on " + ", ".join(
            sorted(v.unreachable)) + " (not answering)")


def _builtins(value: Any) -> Any:
    import msgspec

    return json.loads(msgspec.json.encode(value))
