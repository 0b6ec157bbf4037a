"""The Python hello over HTTP: req/s and where its CPU goes, per process.

    python bench/bench_python_http.py [--pool KEY=VALUE,...]... [--rounds 4] [--seconds 5]
                                      [--connections 32] [--tree OTHER_CHECKOUT]
                                      [--function python-hello --path /py/hello]

A PoP (`edgefn serve`) with python-hello deployed, loaded by `wrk -t1 -c32`
(`--connections N`: -cN); for each round, req/s and the CPU per request of the PoP
and of its isolate hosts (their CPU clocks; the hosts, the active one and its
standby, found among the PoP's descendants). CPU per request moves less than req/s
on a noisy machine: both sides' figures say where a change took effect.

wrk's own CPU per request is printed too (its rusage), and the cores the three took
together: on a 2-core machine near 2.0 means req/s is bound by the machine, and a
PoP's saving shows as CPU, not as req/s. "PoP core" is the PoP's CPU over the round's
wall time: near 1.0 its event loop (one thread does nearly all of its work) is what
bounds req/s, and only a saving in the PoP raises them; a saving in the isolate hosts
shows as their CPU a request.

`--pool "max=4,pipeline=0"`: python-hello with those keys of its manifest's [pool]
set; given more than once, each is a variant, measured in alternating rounds with
the others ("" is the manifest as it is), and each variant's ratio to the first.
`--tree DIR`: a second checkout (a worktree of the commit before) measured the same
way (ABBA, so neither always runs first), and this checkout's ratio to it: of the
medians, and paired within each round (median and range: a slow spell of the machine
takes both of a round down, and cancels out of their ratio).
`--function hello-wat --path /hello`: another example of the checkout (a WASM one
has no isolate hosts: its host us is 0, and `--pool` does not apply).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import _cpu  # noqa: E402
import _variants  # noqa: E402
import _wrk  # noqa: E402
import bench_runtime  # noqa: E402

from runtime.admin.client import AdminClient  # noqa: E402
from runtime.executors.python.thread_clock import ProcessClock  # noqa: E402
from runtime.functions import manifest  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """CPU seconds of process `pid`, all its threads (the kernel's clock, as the PoP
    reads its hosts'). Raises RuntimeError once it is gone."""
    seconds = ProcessClock(pid).read()
    if seconds is None:
        raise RuntimeError(f"process {pid} is gone")
    return seconds


def children_cpu() -> float:
    """CPU seconds of this process's children that ended (wrk, once it exits)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def isolate_hosts(pop: int, python: bool = True) -> list[int]:
    """The PoP's isolate host processes (the active one and its standby). Raises
    RuntimeError if it has none and serves a `python` function."""
    hosts = _cpu.isolate_hosts(pop)
    if python and not hosts:
        raise RuntimeError("no isolate host among the PoP's processes")
    return hosts


def is_python(example: Path) -> bool:
    """Whether the function in folder `example` is a Python one (its manifest says so).
    Raises `ManifestError` for a folder without a valid manifest."""
    return manifest.load(example).runtime == "python"


def with_pool(example: Path, work: Path, pool: str) -> Path:
    """`example`, or a copy of it in `work` whose [pool] (its last table) sets the
    ``KEY=VALUE`` pairs of `pool` (comma-separated)."""
    if not pool:
        return example
    copy = work / f"{example.name}-pool"
    shutil.copytree(example, copy)
    manifest = copy / "edgefn.toml"
    text = manifest.read_text()
    settings = dict(item.split("=", 1) for item in pool.split(","))
    kept = [line for line in text[text.index("[pool]\n"):].splitlines()[1:]
            if line.split("=")[0].strip() not in settings]
    table = "".join(f"{k.strip()} = {v.strip()}\n" for k, v in settings.items())
    manifest.write_text(text[:text.index("[pool]\n")] + "[pool]\n" + table + "\n".join(kept)
                        + "\n")
    return copy


def one_round(tree: Path, pool: str, seconds: int, connections: int,
              function: str = "python-hello", path: str = "/py/hello") -> dict[str, float]:
    """A fresh PoP from checkout `tree`, its example `function` deployed (its [pool]
    set as `pool` says) and loaded at `path`:
    {"rps", "pop_us", "host_us", "wrk_us", "cores", "pop_core"}."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        proc, port = bench_runtime.start_edgefn(data, tree=tree)
        try:
            example = tree / "functions" / "examples" / function
            AdminClient(data).deploy(with_pool(example, Path(tmp), pool))
            url = f"http://127.0.0.1:{port}{path}"
            _wrk.run(url, seconds=1, connections=connections)  # warm-up: the pool grows
            hosts = isolate_hosts(proc.pid, is_python(example))
            pop0, t0 = cpu_seconds(proc.pid), time.monotonic()
            host0, wrk0 = sum(cpu_seconds(h) for h in hosts), children_cpu()
            r = _wrk.run(url, seconds=seconds, connections=connections)
            wall = time.monotonic() - t0
            wrk = children_cpu() - wrk0
            if r["errors"]:
                raise RuntimeError(f"{r['errors']} errors under load")
            n = r["rps"] * wall
            pop, host = cpu_seconds(proc.pid) - pop0, sum(cpu_seconds(h) for h in hosts) - host0
            return {"rps": r["rps"], "pop_us": pop / n * 1e6, "host_us": host / n * 1e6,
                    "wrk_us": wrk / n * 1e6, "cores": (pop + host + wrk) / wall,
                    "pop_core": pop / wall}
        finally:
            proc.terminate()
            proc.wait(20)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pool", action="append", help='python-hello\'s [pool] keys to set, '
                   '"max=4,pipeline=0" (more than once: variants; "": as in its manifest)')
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--connections", type=int, default=32, help="wrk's -c")
    p.add_argument("--tree", type=Path, help="another checkout, measured in alternating rounds")
    p.add_argument("--function", default="python-hello",
                   help="the example served (functions/examples/NAME of each checkout)")
    p.add_argument("--path", default="/py/hello", help="the path wrk loads")
    args = p.parse_args()
    if args.pool and not is_python(ROOT / "functions" / "examples" / args.function):
        p.error("--pool sets a Python function's [pool]")
    trees = [ROOT] if args.tree is None else [args.tree.resolve(), ROOT]
    variants = [(tree, pool) for tree in trees for pool in (args.pool or [""])]

    def report(n: int, variant: tuple[Path, str], r: dict[str, float]) -> None:
        tree, pool = variant
        print(f"round {n} {tree} [{pool or 'manifest'}]: {r['rps']:.0f} req/s, "
              f"PoP {r['pop_us']:.1f} us, host {r['host_us']:.1f} us, wrk {r['wrk_us']:.1f} "
              f"us, {r['cores']:.2f} cores (PoP {r['pop_core']:.2f})", flush=True)

    results = _variants.alternate(
        variants, args.rounds,
        lambda v: one_round(v[0], v[1], args.seconds, args.connections, args.function,
                            args.path), report)
    print(f"\n== {args.function} {args.path}, wrk -t1 -c{args.connections} -d{args.seconds}s, "
          f"medians of {args.rounds} rounds (x first: ratio to the first line) ==")
    print(f"{'checkout':<28}{'[pool]':<40}{'req/s':>8}{'PoP us':>8}{'host us':>8}"
          f"{'x first':>8}{'PoP':>6}{'host':>6}{'wrk us':>8}{'cores':>6}{'PoP core':>9}")
    for (tree, pool), m, x in _variants.medians(results, ("rps", "pop_us", "host_us",
                                                          "wrk_us", "cores", "pop_core")):
        print(f"{str(tree)[-27:]:<28}{pool or 'as in its manifest':<40}{m['rps']:>8.0f}"
              f"{m['pop_us']:>8.1f}{m['host_us']:>8.1f}{x['rps']:>8.2f}"
              f"{x['pop_us']:>6.2f}{x['host_us']:>6.2f}{m['wrk_us']:>8.1f}{m['cores']:>6.2f}"
              f"{m['pop_core']:>9.2f}")
    _variants.print_paired(results, {"req/s": "rps", "PoP us": "pop_us", "host us": "host_us"},
                           lambda v: f"{str(v[0])[-27:]} [{v[1] or 'manifest'}]")
    print(f"(load average {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
