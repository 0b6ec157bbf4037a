"""What the security stages cost on the hello path: WASM hello req/s with auth and
rate limits on, next to the same PoP without them, measured in the same run; and
each stage's own cost in microseconds, in process.

    python bench/bench_security.py [--seconds 5] [--rounds 3] [--n 20000]

Servers (all `edgefn serve --no-ai`, the hello-wat example; wrk -t1 -c32, rounds
alternated, best round of each kept; ratios are to (a)):
  (a) no security stages: request_id, access_log, route, dispatch (the pipeline
      before this issue);
  (b) + auth + ratelimit: the function asks for a key (`auth = "key"`), wrk sends
      one; three rate-limit rules apply (by ip, by key, by function), each far above
      the load so nothing is refused;
  (c) the default pipeline: waf (off), bots, auth (none), ratelimit (no rules).
Then per stage, in process: a Context and the stage in front of a stage that
answers at once, per request, minus the same chain without the stage.
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

HELLO = ROOT / "functions" / "examples" / "hello-wat"
OFF = "".join(f'[[pipeline]]\nstage = "{s}"\n' for s in
              ("request_id", "access_log", "route", "dispatch"))
AUTH_RL = "".join(f'[[pipeline]]\nstage = "{s}"\n' for s in
                  ("request_id", "access_log", "auth", "ratelimit", "route", "dispatch")) + "".join(
    f'[[ratelimit.rules]]\nby = "{by}"\nlimit = "100000000/minute"\n'
    for by in ("ip", "key", "function"))


def start(work: Path, name: str, pop_toml: str, fn: Path) -> tuple[subprocess.Popen[bytes], int]:
    """`edgefn serve` with `pop_toml`, `fn` deployed; the process and its port."""
    (work / f"{name}.toml").write_text(pop_toml)
    data = work / name
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", "--port", str(port),
                             "--data", str(data), "--no-ai", "--config",
                             str(work / f"{name}.toml")], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (data / "pop.json").exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"edgefn serve ({name}) did not start")
        time.sleep(0.05)
    subprocess.run([sys.executable, "-m", "runtime.cli", "deploy", str(fn), "--data",
                    str(data)], cwd=ROOT, check=True, capture_output=True)
    return proc, port


def keyed_hello(work: Path) -> Path:
    fn = work / "hello-key"
    shutil.copytree(HELLO, fn)
    manifest = (fn / "edgefn.toml").read_text()
    (fn / "edgefn.toml").write_text('auth = "key"\n' + manifest)
    return fn


def served(args: argparse.Namespace, work: Path) -> dict[str, dict[str, float]]:
    fn = keyed_hello(work)
    servers = {"(a) no security stages": (start(work, "a", OFF, HELLO), {}),
               "(b) + auth + ratelimit": (start(work, "b", AUTH_RL, fn), {}),
               "(c) default pipeline": (start(work, "c", "", HELLO), {})}
    from runtime.security.keys import KeyStore

    key, _ = KeyStore(work / "b").create("bench", ("fn:*",))
    servers["(b) + auth + ratelimit"][1]["x-api-key"] = key
    subprocess.run([sys.executable, "-m", "runtime.cli", "keys", "ls", "--data",
                    str(work / "b")], cwd=ROOT, check=True, capture_output=True)
    time.sleep(1.2)  # the PoP re-reads keys.json within a second
    best: dict[str, dict[str, float]] = {}
    try:
        for (_, port), headers in servers.values():
            _wrk.run(f"http://127.0.0.1:{port}/hello", seconds=1, headers=headers)
        for _ in range(args.rounds):
            for name, ((_, port), headers) in servers.items():
                r = _wrk.run(f"http://127.0.0.1:{port}/hello", seconds=args.seconds,
                             headers=headers)
                if r["errors"]:
                    raise RuntimeError(f"{name}: {r['errors']} errors under load")
                if name not in best or r["rps"] > best[name]["rps"]:
                    best[name] = r
    finally:
        for (proc, _), _h in servers.values():
            proc.terminate()
            proc.wait(20)
    return best


def per_stage(n: int) -> dict[str, float]:
    """Microseconds each stage adds per request, in process."""
    from stage_costs import costs

    return costs(n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=20000)
    args = ap.parse_args()
    os.environ.setdefault("EDGEFN_LOG", "warning")
    work = Path(tempfile.mkdtemp(prefix="edgefn-bench-security-"))
    best = served(args, work)
    base = best["(a) no security stages"]["rps"]
    print(f"\n== WASM hello, wrk -t1 -c32 -d{args.seconds}s, best of {args.rounds} rounds ==")
    print(f"{'server':<28}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'x (a)':>8}")
    for name, r in best.items():
        print(f"{name:<28}{r['rps']:>10.0f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}"
              f"{r['rps'] / base:>8.2f}")
    print(f"\n== per-stage cost, in process, {args.n} requests (us per request) ==")
    for name, us in per_stage(args.n).items():
        print(f"{name:<40}{us:>8.2f}")


if __name__ == "__main__":
    main()
