"""Where a WASM hello request's time goes over HTTP, stage by stage: the same PoP
with the pipeline built up one default stage at a time.

    python bench/bench_pipeline_http.py [--seconds 3] [--rounds 2]

Each variant is an `edgefn serve` with a pop.toml listing its stages (``[ai]`` off,
everything else default) and the WASM hello deployed: first ``route`` and
``dispatch`` alone, then each default stage added in the default order, ending
with the default pipeline. All variants run side by side; each round loads each
one in turn (``wrk -t1 -c32``), and the best round is kept. Printed per variant:
req/s, its ratio to the bare pipeline's in the same run, and the PoP process's CPU
time per request (/proc, user + system, over the run it was loaded) with what the
added stage cost. The in-process split (`bench/bench_wasm_hot.py`) misses what a
stage costs over real sockets with the load generator on the same cores; this
measures it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import _wrk  # noqa: E402
from bench_runtime import free_port  # noqa: E402

from runtime.admin.client import AdminClient  # noqa: E402

HELLO = ROOT / "functions" / "examples" / "hello-wat"
BASE = ["route", "dispatch"]
ADDED = ["health", "request_id", "events", "access_log", "waf", "bots", "auth", "residency",
         "ratelimit", "http_cache", "ai_cache", "openai"]  # the default order before `route`


def variants() -> list[tuple[str, list[str]]]:
    """(what was added, the stages), the bare pipeline first, the default last."""
    out = [("route + dispatch", BASE)]
    for i, stage in enumerate(ADDED):
        out.append((f"+ {stage}", ADDED[:i + 1] + BASE))
    return out


def start(folder: Path, stages: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    """`edgefn serve` with `stages`, the WASM hello deployed; the process and its port.
    Raises RuntimeError if it does not start."""
    port = free_port()
    config = folder / "pop.toml"
    config.write_text(f'[public]\nhost = "127.0.0.1"\nport = {port}\n[ai]\nenabled = false\n'
                      + "".join(f'[[pipeline]]\nstage = "{s}"\n' for s in stages))
    data = folder / "data"
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", "--config",
                             str(config), "--data", str(data)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (data / "pop.json").exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"edgefn serve with {stages} did not start")
        time.sleep(0.05)
    AdminClient(data).deploy(HELLO)
    return proc, port


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    runs = variants()
    best: dict[str, tuple[float, float]] = {}  # what -> (req/s, CPU us per request)
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-http-") as tmp:
        servers = []
        try:
            for i, (what, stages) in enumerate(runs):
                folder = Path(tmp) / str(i)
                folder.mkdir()
                servers.append((what, *start(folder, stages)))
            for _, _, port in servers:
                _wrk.run(f"http://127.0.0.1:{port}/hello", seconds=1)  # warm-up
            for _ in range(args.rounds):
                for what, proc, port in servers:
                    r = _wrk.measured(proc.pid, f"http://127.0.0.1:{port}/hello", args.seconds)
                    if r["errors"]:
                        raise RuntimeError(f"{what}: {r['errors']} errors under load")
                    per = r["cpu_us"]
                    if what not in best or r["rps"] > best[what][0]:
                        best[what] = (r["rps"], per)
        finally:
            for _, proc, _ in servers:
                proc.terminate()
                proc.wait(20)
    bare = best[runs[0][0]][0]
    print(f"\n== WASM hello over HTTP, the pipeline built up stage by stage (wrk -t1 -c32 "
          f"-d{args.seconds}s, best of {args.rounds} rounds) ==")
    print(f"{'pipeline':<20}{'req/s':>10}{'x bare':>8}{'CPU us/req':>12}{'added':>8}")
    last = None
    for what, _ in runs:
        rps, per = best[what]
        added = f"{per - last:+.1f}" if last is not None else ""
        print(f"{what:<20}{rps:>10.0f}{rps / bare:>8.2f}{per:>12.1f}{added:>8}")
        last = per
    print("(the last row is the default pipeline; CPU is the PoP process's, user + system)")


if __name__ == "__main__":
    main()
