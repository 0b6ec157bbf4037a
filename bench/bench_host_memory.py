"""What a Python function's isolate hosts hold in memory: a host process, and each
isolate in it (the figure behind README "16+ cores": what sharing the hosts across
workers would save).

    python bench/bench_host_memory.py [--function functions/examples/python-hello]
                                      [--path /py/hello] [--seconds 3]

An `edgefn serve --no-ai` with the function deployed; each isolate host's resident
and proportional set sizes (``/proc/PID/smaps_rollup``: Rss, Pss) and its threads,
idle (its first isolates), then after `wrk -t1 -c32` for `--seconds` (the pool grown
toward `pool.max`). The isolates started meanwhile (the PoP's `edgefn_isolates`
gauge, warm + busy, before and after) and the PSS the hosts added give an isolate's
cost; the grown host's idle PSS less `pool.min` of them gives the process's own.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import _cpu  # noqa: E402
import _wrk  # noqa: E402
import bench_runtime  # noqa: E402

from runtime.admin.client import AdminClient  # noqa: E402

LIVE = re.compile(r'^edgefn_isolates\{[^}]*state="(?:warm|busy)"[^}]*\} (\S+)$', re.M)


def rollup(pid: int) -> tuple[int, int, int]:
    """(Rss KiB, Pss KiB, threads) of process `pid`. Raises OSError once it is gone."""
    sizes = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("Rss", "Pss"):
                sizes[name] = int(rest.split()[0])
    return sizes["Rss"], sizes["Pss"], len(list(Path(f"/proc/{pid}/task").iterdir()))


def live_isolates(data: Path) -> int:
    """The PoP's started isolates (warm or busy), by its metrics."""
    return int(sum(float(n) for n in LIVE.findall(AdminClient(data).metrics())))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--function", default="functions/examples/python-hello")
    p.add_argument("--path", default="/py/hello")
    p.add_argument("--seconds", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgefn-bench-mem-") as tmp:
        data = Path(tmp) / "data"
        proc, port = bench_runtime.start_edgefn(data, ["--no-ai"], deploy=ROOT / args.function)
        try:
            time.sleep(1.0)  # the standby warm too
            hosts = _cpu.isolate_hosts(proc.pid)
            if not hosts:
                raise RuntimeError(f"{args.function} runs in no isolate host")
            idle, before = {pid: rollup(pid) for pid in hosts}, live_isolates(data)
            _wrk.run(f"http://127.0.0.1:{port}{args.path}", seconds=args.seconds)
            time.sleep(0.5)
            loaded, after = {pid: rollup(pid) for pid in hosts}, live_isolates(data)
        finally:
            proc.terminate()
            proc.wait(20)
    print(f"== {args.function}: its isolate hosts, idle and after {args.seconds} s of "
          "wrk -t1 -c32 ==")
    print(f"{'host':>8}{'idle RSS MiB':>14}{'PSS':>7}{'threads':>9}"
          f"{'loaded RSS MiB':>16}{'PSS':>7}{'threads':>9}")
    for pid in hosts:
        (r0, p0, t0), (r1, p1, t1) = idle[pid], loaded[pid]
        print(f"{pid:>8}{r0 / 1024:>14.1f}{p0 / 1024:>7.1f}{t0:>9}{r1 / 1024:>16.1f}"
              f"{p1 / 1024:>7.1f}{t1:>9}")
    first = tomllib.loads((ROOT / args.function / "edgefn.toml").read_text()).get(
        "pool", {}).get("min", 1)  # the isolates a host starts with
    started = after - before
    grown = max(hosts, key=lambda pid: loaded[pid][1] - idle[pid][1])
    if started > 0:
        added = sum(loaded[pid][1] - idle[pid][1] for pid in hosts)
        each = added / started / 1024
        print(f"isolates started under load: {started} ({before} -> {after}); an isolate: "
              f"{each:.1f} MiB PSS; the host process itself: "
              f"{idle[grown][1] / 1024 - first * each:.1f} MiB PSS (host {grown}'s idle PSS "
              f"less its first {first} isolate(s), pool.min)")
    else:
        print(f"no isolate started under this load ({before} live): no per-isolate figure")
    return 0


if __name__ == "__main__":
    sys.exit(main())
