"""The Python hello over HTTP: req/s and where its CPU goes, per process.

    python bench/bench_python_http.py [--pipeline N] [--rounds 4] [--seconds 5]
                                      [--tree OTHER_CHECKOUT]

A PoP (`edgefn serve`) with python-hello deployed (`--pipeline N`: with its
`pool.pipeline` set to N), loaded by `wrk -t1 -c32`; for each round, req/s and
the CPU per request of the PoP and of its isolate host (their CPU clocks, the
host found among the PoP's descendants). CPU per request moves less than req/s on a
noisy machine: both sides' figures say where a change took effect.

`--tree DIR`: a second checkout (a worktree of the commit before) measured in
alternating rounds (ABBA, so neither always runs first), medians of each and this
checkout's ratio to it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import _wrk  # noqa: E402
import bench_runtime  # noqa: E402

from runtime.admin.client import AdminClient  # noqa: E402
from runtime.executors.python.thread_clock import ProcessClock  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """CPU seconds of process `pid`, all its threads (the kernel's clock, as the PoP
    reads its hosts'). Raises RuntimeError once it is gone."""
    seconds = ProcessClock(pid).read()
    if seconds is None:
        raise RuntimeError(f"process {pid} is gone")
    return seconds


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        out = subprocess.run(["pgrep", "-P", str(todo.pop())], capture_output=True,
                             text=True).stdout.split()
        found += [int(p) for p in out]
        todo += [int(p) for p in out]
    return found


def isolate_host(pop: int) -> int:
    """The PoP's isolate host process. Raises RuntimeError if it has none."""
    for pid in descendants(pop):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"runtime.executors.python.host" in f.read():
                return pid
    raise RuntimeError("no isolate host among the PoP's processes")


def one_round(tree: Path, pipeline: int | None, seconds: int) -> dict[str, float]:
    """A fresh PoP from checkout `tree`: {"rps", "pop_us", "host_us"}."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        proc, port = bench_runtime.start_edgefn(data, tree=tree)
        try:
            example = tree / "functions" / "examples" / "python-hello"
            AdminClient(data).deploy(bench_runtime.with_pipeline(example, Path(tmp), pipeline))
            url = f"http://127.0.0.1:{port}/py/hello"
            _wrk.run(url, seconds=1)  # warm-up: the pool grows to its max under load
            host = isolate_host(proc.pid)
            pop0, host0, t0 = cpu_seconds(proc.pid), cpu_seconds(host), time.monotonic()
            r = _wrk.run(url, seconds=seconds)
            wall = time.monotonic() - t0
            if r["errors"]:
                raise RuntimeError(f"{r['errors']} errors under load")
            n = r["rps"] * wall
            return {"rps": r["rps"], "pop_us": (cpu_seconds(proc.pid) - pop0) / n * 1e6,
                    "host_us": (cpu_seconds(host) - host0) / n * 1e6}
        finally:
            proc.terminate()
            proc.wait(20)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pipeline", type=int, help="python-hello's pool.pipeline (default: its "
                   "manifest's)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--tree", type=Path, help="another checkout, measured in alternating rounds")
    args = p.parse_args()
    trees = [ROOT] if args.tree is None else [args.tree.resolve(), ROOT]
    results: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
    for n in range(args.rounds):
        for tree in trees if n % 2 == 0 else trees[::-1]:
            r = one_round(tree, args.pipeline, args.seconds)
            results[tree].append(r)
            print(f"round {n + 1} {tree}: {r['rps']:.0f} req/s, PoP {r['pop_us']:.1f} us, "
                  f"host {r['host_us']:.1f} us", flush=True)
            time.sleep(2)  # the last PoP's processes gone
    print(f"\n== python-hello, wrk -t1 -c32 -d{args.seconds}s, pool.pipeline = "
          f"{args.pipeline if args.pipeline is not None else 'as in its manifest'}, medians of "
          f"{args.rounds} rounds ==")
    print(f"{'checkout':<40}{'req/s':>9}{'PoP us':>9}{'host us':>9}")
    medians = {}
    for tree, rs in results.items():
        m = {k: statistics.median(r[k] for r in rs) for k in ("rps", "pop_us", "host_us")}
        medians[tree] = m
        print(f"{tree!s:<40}{m['rps']:>9.0f}{m['pop_us']:>9.1f}{m['host_us']:>9.1f}")
    if args.tree is not None:
        base, this = medians[trees[0]], medians[ROOT]
        print(f"{'this / --tree':<40}{this['rps'] / base['rps']:>9.2f}"
              f"{this['pop_us'] / base['pop_us']:>9.2f}{this['host_us'] / base['host_us']:>9.2f}")
    print(f"(load average {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
