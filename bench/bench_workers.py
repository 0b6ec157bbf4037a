"""WASM hello req/s of a PoP with ``workers = 1`` and ``workers = 2`` (or each count
of ``--workers``), same run, rounds alternated, the server and wrk each pinned with
`taskset`, and each count's ratio to one worker.

    python bench/bench_workers.py [--seconds 5] [--rounds 3] [--connections 32]
                                  [--layout apart|shared|both] [--workers 1,2]

Layouts (chosen by the number of cores; say which when quoting a figure):
- ``apart``: the server on cores S, wrk on the other cores W, with one wrk thread
  a core of W. With 4+ cores S is {0 .. K-1}, K the largest count of ``--workers``
  (at least 2, at most half the cores: each worker can have a core) and W the rest;
  every count runs on the same S. On a 2-core machine S is {1} and W {0}: nothing
  is shared with wrk, but two workers share one core, so this shows the cost of a
  second process, not scaling.
- ``shared`` (2-core machines): server and wrk both on {0,1}; two workers can use
  both cores, but wrk takes part of them, and the OS schedules all three.

Needs wrk (apt-get install -y wrk) and taskset (util-linux).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import _wrk  # noqa: E402
from bench_runtime import free_port  # noqa: E402

from runtime.admin.client import AdminClient  # noqa: E402

HELLO = ROOT / "functions" / "examples" / "hello-wat"


def layouts(cores: int, which: str, most: int) -> dict[str, tuple[str, str]]:
    """{name: (server cpus, wrk cpus)} for taskset -c; `most` workers at most."""
    if cores >= 4:
        k = min(max(2, most), cores // 2)
        return {"apart": (f"0-{k - 1}", f"{k}-{cores - 1}")}
    found = {"apart": ("1", "0"), "shared": ("0,1", "0,1")}
    return found if which == "both" else {which: found[which]}


def start(workers: int, cpus: str, root: Path) -> tuple[subprocess.Popen[bytes], int]:
    """`edgefn serve` with `workers`, pinned to `cpus`, hello-wat deployed."""
    data = root / f"w{workers}-{cpus.replace(',', '_')}"
    data.mkdir()
    (data / "pop.toml").write_text(f"workers = {workers}\n")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        ["taskset", "-c", cpus, sys.executable, "-m", "runtime.cli", "serve", "--config",
         str(data / "pop.toml"), "--no-ai", "--port", str(port), "--data", str(data / "d")],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (data / "d" / "pop.json").exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"edgefn serve with workers = {workers} did not start")
        time.sleep(0.05)
    AdminClient(data / "d").deploy(HELLO)
    return proc, port


def count(cpus: str) -> int:
    """How many cores a taskset list such as "0,1" or "2-15" names."""
    return sum(int(b) - int(a) + 1 if "-" in part else 1
               for part in cpus.split(",") for a, _, b in [part.partition("-")])


def wrk_threads(cpus: str, connections: int) -> int:
    """wrk's threads on `cpus`: one a core, at most one a connection."""
    return min(count(cpus), connections)


def wrk(url: str, cpus: str, seconds: int, connections: int) -> dict:
    """wrk pinned to `cpus` (`wrk_threads` threads); its figures (see `_wrk.parse`)."""
    cmd = ["taskset", "-c", cpus, "wrk", f"-t{wrk_threads(cpus, connections)}",
           f"-c{connections}", f"-d{seconds}s", "--latency", url]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30)
    if out.returncode != 0:
        raise RuntimeError(f"wrk failed: {out.stdout}{out.stderr}")
    return _wrk.parse(out.stdout + out.stderr)


def measure(name: str, server_cpus: str, wrk_cpus: str, args: argparse.Namespace,
            root: Path) -> None:
    servers = {n: start(n, server_cpus, root) for n in args.workers}
    best: dict[int, dict] = {}
    try:
        for port in (p for _, p in servers.values()):  # warm both
            wrk(f"http://127.0.0.1:{port}/hello", wrk_cpus, 1, args.connections)
        for _ in range(args.rounds):
            for n, (_, port) in servers.items():
                r = wrk(f"http://127.0.0.1:{port}/hello", wrk_cpus, args.seconds,
                        args.connections)
                if r["errors"]:
                    print(f"  workers={n}: {r['errors']} errors", flush=True)
                if n not in best or r["rps"] > best[n]["rps"]:
                    best[n] = r
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(60)
    print(f"layout {name}: server on cores {{{server_cpus}}}, "
          f"wrk -t{wrk_threads(wrk_cpus, args.connections)} "
          f"-c{args.connections} on cores {{{wrk_cpus}}}; best of {args.rounds} rounds of "
          f"{args.seconds}s")
    one = best[args.workers[0]]["rps"]
    for n, r in best.items():
        print(f"  workers={n}: {r['rps']:>9.0f} req/s  p50 {r['p50_ms']:.2f} ms  "
              f"p99 {r['p99_ms']:.2f} ms  x workers={args.workers[0]}: {r['rps'] / one:.2f}")
    sys.stdout.flush()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--connections", type=int, default=32)  # hello-wat: concurrency 32
    p.add_argument("--layout", choices=("apart", "shared", "both"), default="both")
    p.add_argument("--workers", default="1,2",
                   help="worker counts, comma-separated, the baseline first (default 1,2)")
    args = p.parse_args()
    args.workers = [int(n) for n in args.workers.split(",")]
    for tool in ("wrk", "taskset"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found (apt-get install -y {tool})")
    cores = os.cpu_count() or 1
    print(f"{cores} cores; load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (server, load) in layouts(cores, args.layout, max(args.workers)).items():
            measure(name, server, load, args, Path(tmp))


if __name__ == "__main__":
    main()
