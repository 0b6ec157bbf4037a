"""A WASI command (WAGI-style: functions/examples/hello-c, C built for wasm32-wasi)
per request, next to baselines measured in the same run.

    python bench/bench_wasi.py [--seconds 5] [--rounds 2] [--n 2000] [--tree OTHER_CHECKOUT]

1. In process, one thread: hello-c's run (`WasmFunction._run_wasi`: a fresh store,
   `_start`, its stdio) in microseconds of wall and CPU, with the thread's voluntary
   context switches per request; `--tree`: the same in that checkout (a worktree of
   the commit before a change), in its own process.
2. Over HTTP (`wrk -t1 -c32`, best of `--rounds`, servers in turns): the raw
   uvloop + httptools hello (the baseline), hello-c through edgefn (and through
   `--tree`'s), and the reactor hello (hello-wat) on the same PoP.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import _baseline  # noqa: E402
import _wrk  # noqa: E402
import bench_runtime  # noqa: E402

from runtime.admin.client import AdminClient  # noqa: E402

HELLO_C = "functions/examples/hello-c"
HELLO_WAT = "functions/examples/hello-wat"

# One process of checkout `sys.argv[1]`: hello-c's `_run_wasi` N times on this thread.
IN_PROCESS = r"""
import json, os, resource, sys, time
from pathlib import Path
tree, n = Path(sys.argv[1]), int(sys.argv[2])
sys.path.insert(0, str(tree))
from runtime.executors.wasm.engine import WasmEngine
from runtime.executors.wasm.function import WasmFunction
from runtime.functions import manifest
d = tree / "functions" / "examples" / "hello-c"
engine = WasmEngine(Path(sys.argv[3]))
fn = WasmFunction(engine, manifest.load(d), d)
fn.prewarm()
env = [("REQUEST_METHOD", "GET"), ("PATH_INFO", "/hello-c"), ("QUERY_STRING", "")]
assert fn._run_wasi(env, b"", time.monotonic() + 60).endswith(b"path=/hello-c\n")
best = None
for _ in range(3):
    r0, t0 = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
    for _ in range(n):
        fn._run_wasi(env, b"", time.monotonic() + 60)
    t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_THREAD)
    row = {"wall_us": (t1 - t0) / n * 1e6,
           "cpu_us": (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / n * 1e6,
           "switches": (r1.ru_nvcsw - r0.ru_nvcsw) / n}
    best = row if best is None or row["wall_us"] < best["wall_us"] else best
print(json.dumps(best), flush=True)
os._exit(0)  # wasmtime's runtime threads may still hold Python callbacks at exit
"""


def in_process(tree: Path, n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as cache:
        out = subprocess.run([sys.executable, "-c", IN_PROCESS, str(tree), str(n), cache],
                             capture_output=True, text=True, timeout=600, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def http_rounds(trees: dict[str, Path], seconds: int, rounds: int) -> dict[str, dict[str, float]]:
    best: dict[str, dict[str, float]] = {}
    servers = []
    data_dirs: list[Path] = []
    try:
        port = bench_runtime.free_port()
        servers.append(_baseline.start(port))
        urls = {"raw uvloop+httptools": f"http://127.0.0.1:{port}/"}
        for label, tree in trees.items():
            data = Path(tempfile.mkdtemp(prefix="edgefn-bench-wasi-"))
            data_dirs.append(data)
            proc, port = bench_runtime.start_edgefn(data / "data", tree=tree)
            servers.append(proc)
            admin = AdminClient(data / "data")
            admin.deploy(tree / HELLO_C)
            urls[f"hello-c, {label}"] = f"http://127.0.0.1:{port}/hello-c"
            if label == "this tree":
                admin.deploy(tree / HELLO_WAT)
                urls["reactor hello (hello-wat), this tree"] = f"http://127.0.0.1:{port}/hello"
        best = _wrk.best_of(urls, seconds, rounds)
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(20)
        for data in data_dirs:
            shutil.rmtree(data, ignore_errors=True)
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--n", type=int, default=2000, help="requests per in-process pass")
    p.add_argument("--tree", type=Path, help="another checkout, measured the same way")
    args = p.parse_args()
    trees = {"this tree": ROOT}
    if args.tree is not None:
        trees["--tree"] = args.tree.resolve()

    print(f"\n== hello-c's run in process, one thread (best of 3 x {args.n}) ==")
    print(f"{'checkout':<12}{'wall us':>10}{'CPU us':>10}{'switches':>10}   x this tree")
    rows = {label: in_process(tree, args.n) for label, tree in trees.items()}
    base = rows["this tree"]["wall_us"]
    for label, row in rows.items():
        print(f"{label:<12}{row['wall_us']:10.1f}{row['cpu_us']:10.1f}{row['switches']:10.1f}"
              f"   {row['wall_us'] / base:.2f}")

    print(f"\n== HTTP, wrk -t1 -c32 -d{args.seconds}s, best of {args.rounds} rounds ==")
    best = http_rounds(trees, args.seconds, args.rounds)
    raw = best["raw uvloop+httptools"]["rps"]
    ours = best["hello-c, this tree"]["rps"]
    print(f"{'server':<40}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'x raw':>8}{'x hello-c':>11}")
    for name, r in best.items():
        print(f"{name:<40}{r['rps']:9.0f}{r['p50_ms']:9.2f}{r['p99_ms']:9.2f}{r['rps'] / raw:8.3f}"
              f"{r['rps'] / ours:11.2f}")
    print(f"(load average {Path('/proc/loadavg').read_text().split()[0]}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
