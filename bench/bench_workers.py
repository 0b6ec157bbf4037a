"""WASM hello req/s of a PoP with ``workers = 1`` and ``workers = 2``, same run,
rounds alternated, the server and wrk each pinned with `taskset`, and the ratio.

    python bench/bench_workers.py [--seconds 5] [--rounds 3] [--connections 32]
                                  [--layout apart|shared|both]

Layouts (chosen by the number of cores; say which when quoting a figure):
- ``apart``: the server on cores S, wrk on the other cores W. With 4+ cores S is
  {0,1} (two workers can each have a core) and W the rest. On a 2-core machine S
  is {1} and W {0}: nothing is shared with wrk, but two workers share one core,
  so this shows the cost of a second process, not scaling.
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


def layouts(cores: int, which: str) -> dict[str, tuple[str, str]]:
    """{name: (server cpus, wrk cpus)} for taskset -c."""
    if cores >= 4:
        return {"apart": ("0,1", f"2-{cores - 1}")}
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


def wrk(url: str, cpus: str, seconds: int, connections: int) -> dict:
    """wrk -t1 pinned to `cpus`; its figures (see `_wrk.parse`)."""
    cmd = ["taskset", "-c", cpus, "wrk", "-t1", f"-c{connections}", f"-d{seconds}s",
           "--latency", url]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30)
    if out.returncode != 0:
        raise RuntimeError(f"wrk failed: {out.stdout}{out.stderr}")
    return _wrk.parse(out.stdout + out.stderr)


def measure(name: str, server_cpus: str, wrk_cpus: str, args: argparse.Namespace,
            root: Path) -> None:
    servers = {n: start(n, server_cpus, root) for n in (1, 2)}
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
    print(f"layout {name}: server on cores {{{server_cpus}}}, wrk -t1 -c{args.connections} "
          f"on cores {{{wrk_cpus}}}; best of {args.rounds} rounds of {args.seconds}s")
    for n, r in best.items():
        print(f"  workers={n}: {r['rps']:>9.0f} req/s  p50 {r['p50_ms']:.2f} ms  "
              f"p99 {r['p99_ms']:.2f} ms")
    print(f"  ratio workers=2 / workers=1: {best[2]['rps'] / best[1]['rps']:.2f}x", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--connections", type=int, default=32)  # hello-wat: concurrency 32
    p.add_argument("--layout", choices=("apart", "shared", "both"), default="both")
    args = p.parse_args()
    for tool in ("wrk", "taskset"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} not found (apt-get install -y {tool})")
    cores = os.cpu_count() or 1
    print(f"{cores} cores; load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (server, load) in layouts(cores, args.layout).items():
            measure(name, server, load, args, Path(tmp))


if __name__ == "__main__":
    main()
