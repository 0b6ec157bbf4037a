"""What an idle PoP costs: CPU per second of wall time with functions deployed and no
request coming, per process (the PoP, its isolate hosts, the model worker).

    python bench/bench_idle.py [--rounds 2] [--seconds 10] [--tree OTHER_CHECKOUT]

Each round starts `edgefn serve` from a checkout, deploys hello-wat (a WASM reactor),
hello-c (a WASI command) and python-hello, serves each one request, waits until every
idle timer has run out (the epoch ticker's 1 s, the Python watchdogs' 1 s), then reads
every process's CPU clock over `--seconds`. The floor, measured in the same run, is the
raw uvloop+httptools server of bench_runtime.py idling as long: an event loop that
waits for nothing. The baseline to compare with is `--tree`.

`--tree DIR`: a second checkout (a worktree of the commit before) measured in
alternating rounds (ABBA), medians of each and this checkout's ratio to it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import _baseline  # noqa: E402
import bench_runtime  # noqa: E402
from _cpu import descendants  # noqa: E402
from bench_python_http import cpu_seconds  # noqa: E402

from runtime.admin.client import AdminClient  # noqa: E402

EXAMPLES = {"hello-wat": "/hello", "hello-c": "/hello-c", "python-hello": "/py/hello"}
SETTLE = 2.5  # seconds: past every idle timer (1 s each) after the last request


def kind(pid: int) -> str:
    """"host", "model worker" or "other" by the process's command line."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return "other"
    if b"runtime.executors.python.host" in cmd:
        return "host"
    return "model worker" if b"gpu_worker" in cmd else "other"


def idle_cpu(pids: dict[str, list[int]], seconds: float) -> dict[str, float]:
    """ms of CPU per second of wall time over `seconds`, per group of processes."""
    def read() -> dict[str, float]:
        return {group: sum(cpu_seconds(p) for p in ps) for group, ps in pids.items()}

    before, started = read(), time.monotonic()
    time.sleep(seconds)
    after, wall = read(), time.monotonic() - started
    return {group: (after[group] - before[group]) / wall * 1000 for group in pids}


def pop_round(tree: Path, seconds: float) -> dict[str, float]:
    """A fresh PoP from checkout `tree` with the examples deployed, idling."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        proc, port = bench_runtime.start_edgefn(data, tree=tree)
        try:
            client = AdminClient(data)
            for name, path in EXAMPLES.items():
                client.deploy(tree / "functions" / "examples" / name)
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
                    if r.status != 200:
                        raise RuntimeError(f"{path}: {r.status}")
            time.sleep(SETTLE)
            groups: dict[str, list[int]] = {"PoP": [proc.pid], "host": [], "model worker": []}
            for pid in descendants(proc.pid):
                groups.setdefault(kind(pid), []).append(pid)
            return idle_cpu(groups, seconds)
        finally:
            proc.terminate()
            proc.wait(20)


def raw_round(seconds: float) -> float:
    """ms of CPU per second of the raw server idling (the floor)."""
    proc = _baseline.start(bench_runtime.free_port())
    try:
        time.sleep(SETTLE)
        return idle_cpu({"raw": [proc.pid]}, seconds)["raw"]
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--tree", type=Path, help="another checkout, measured in alternating rounds")
    args = p.parse_args()
    trees = [ROOT] if args.tree is None else [args.tree.resolve(), ROOT]
    results: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
    raw: list[float] = []
    for n in range(args.rounds):
        for tree in trees if n % 2 == 0 else trees[::-1]:
            r = pop_round(tree, args.seconds)
            r["total"] = sum(r.values())
            results[tree].append(r)
            print(f"round {n + 1} {tree}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items())
                  + " ms/s", flush=True)
        raw.append(raw_round(args.seconds))
        print(f"round {n + 1} raw uvloop+httptools: {raw[-1]:.2f} ms/s", flush=True)
    cols = ("PoP", "host", "model worker", "total")
    print(f"\n== idle CPU, ms per second (1000 = a core), {', '.join(EXAMPLES)} deployed, "
          f"medians of {args.rounds} rounds of {args.seconds:g} s ==")
    print(f"{'process':<40}" + "".join(f"{c:>14}" for c in cols))
    medians = {}
    for tree, rs in results.items():
        m = {c: statistics.median(r.get(c, 0.0) for r in rs) for c in cols}
        medians[tree] = m
        print(f"{tree!s:<40}" + "".join(f"{m[c]:>14.2f}" for c in cols))
    floor = statistics.median(raw)
    print(f"{'raw uvloop+httptools (baseline)':<40}{'':>42}{floor:>14.2f}")
    this = medians[ROOT]
    if args.tree is not None:
        base = medians[trees[0]]
        print(f"{'this / --tree':<40}" + "".join(
            f"{this[c] / base[c]:>14.2f}" if base[c] else f"{'-':>14}" for c in cols))
    print(f"(load average {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
