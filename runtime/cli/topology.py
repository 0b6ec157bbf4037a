"""`edgefn topology up|status|down`: an emulated network of PoPs on this machine
(`runtime.topology`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from runtime.topology import runner, spec
from runtime.topology.rundir import read_state

COLUMNS = (("POP", 12), ("TIER", 10), ("GEO", 12), ("REGION", 11), ("PID", 8),
           ("HEALTH", 8), ("ADDRESS", 24), ("PARENTS", 28), ("FUNCTIONS", 0))


def topology_command(args: argparse.Namespace) -> None:
    """Raises `InvalidConfig` for a bad topology file, `Failure` when a topology
    already runs (up), does not come up (up) or was never started (status)."""
    run = Path(args.dir)
    match args.op:
        case "up":
            topo = spec.load(args.file)
            try:
                state = runner.up(topo, run, str(Path(args.file).resolve()), args.timeout)
            except KeyboardInterrupt:
                print(f"edgefn: interrupted; stopped what had started in {run}",
                      file=sys.stderr)
                raise
            entries = {geo: f"http://127.0.0.1:{port}"
                       for geo, port in runner.read_network(run).entries.items()}
            if args.json:
                print(json.dumps({"pops": len(state.pops), "clients": entries}))
                return
            print(f"{len(state.pops)} PoPs ready in {run}")
            for geo, url in entries.items():
                print(f"clients in {geo}: {url}")
        case "status":
            _status(run, args.json)
        case "load":
            _load(run, args)
        case "restart":
            entry = runner.restart(run, args.pop, args.timeout)
            print(json.dumps({"pop": entry.name, "pid": entry.pid}) if args.json else
                  f"{entry.name} ready again (pid {entry.pid}) at {entry.public}")
        case "down":
            stopped = runner.down(run)
            print(json.dumps({"stopped": stopped}) if args.json else
                  f"stopped {len(stopped)} processes" if stopped else
                  f"nothing was running in {run}")


def _status(run: Path, as_json: bool) -> None:
    state = read_state(run)
    if state is None:
        runner.read_network(run)  # raises no_topology
        return
    from runtime.topology.versions import served_versions

    versions = served_versions(run)
    drifted = versions.drift()
    rows: list[dict[str, Any]] = []
    for p in state.pops:
        served = versions.pops.get(p.name)  # None: it did not answer
        rows.append({
            "name": p.name, "tier": p.tier, "geo": p.geo, "region": p.region, "pid": p.pid,
            "health": _health(p.pid, p.public), "address": p.public,
            "parents": ",".join(p.parents),
            "functions": None if served is None else {n: s.label() for n, s in served.items()},
            "drift": sorted(n for n, labels in drifted.items() if p.name in labels)})
    if as_json:
        print(json.dumps(rows))
        return
    print("".join(f"{t:<{w}}" for t, w in COLUMNS).rstrip())
    for r in rows:
        fns = "?" if r["functions"] is None else ", ".join(
            f"{n}@{label}{' DRIFT' if n in r['drift'] else ''}"
            for n, label in sorted(r["functions"].items())) or "-"
        cells = [r["name"], r["tier"], r["geo"] or "-", r["region"] or "-", r["pid"],
                 r["health"], r["address"], r["parents"] or "-", fns]
        print("".join(f"{c!s:<{w}}" for c, (_, w) in zip(cells, COLUMNS, strict=True)).rstrip())
    net = runner.read_network(run)
    for name, pid in (("links", net.links_pid),
                      *((f"redis {r}", pid) for r, pid in sorted(net.redis_pids.items()))):
        print(f"{name}: " + ("stopped" if pid == 0 else
                             f"pid {pid} {'running' if runner.alive(pid) else 'dead'}"))
    silent = [r["name"] for r in rows if r["functions"] is None]
    print(f"drift: {', '.join(drifted) if drifted else 'none'}"
          + (" (`edgefn versions --topology` says where)" if drifted else "")
          + (f"; not checked on {', '.join(silent)} (not answering)" if silent else ""))


def _load(run: Path, args: argparse.Namespace) -> None:
    """Sends `args.n` requests for `args.path` in sequence through a geography's edge
    and prints their latency percentiles (of the 200s; none when no request got one)
    and the statuses they got. Raises `Failure` (no_topology), `NotFound` for a
    geography with no edge."""
    from edgefn_core.errors import NotFound
    from runtime.topology.load import Client, percentile

    net = runner.read_network(run)
    ports = net.direct if args.central else net.entries
    if args.geo not in ports:
        raise NotFound(f"no edge serves geography {args.geo!r}; the topology has: "
                       f"{', '.join(sorted(ports))}")
    with Client(args.geo, ports[args.geo]) as client:
        samples = [client.send("fn", "GET", args.path) for _ in range(args.n)]
    ok = [s.seconds * 1000 for s in samples if s.status == 200]
    statuses = Counter(str(s.status) for s in samples)  # "0": no answer
    result: dict[str, Any] = {
        "requests": len(samples), "failed": len(samples) - len(ok),
        **{f"p{q}_ms": round(percentile(ok, q / 100), 2) if ok else None
           for q in (50, 95, 99)},
        "statuses": dict(sorted(statuses.items()))}
    print(json.dumps(result) if args.json else " ".join(
        f"{k}={_field(v)}" for k, v in result.items()))


def _field(value: Any) -> str:
    """One value of `_load`'s text line: "-" for none, "200:28,503:2" for statuses."""
    if value is None:
        return "-"
    if isinstance(value, dict):
        return ",".join(f"{k}:{n}" for k, n in value.items())
    return str(value)


def _health(pid: int, url: str) -> str:
    if pid == 0:  # `topology down` stopped it
        return "stopped"
    if not runner.alive(pid):
        return "dead"
    return "ready" if runner.ready(url) else "starting"
