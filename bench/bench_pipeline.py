"""The request pipeline's cost: WASM hello req/s through today's pipeline next to
the same PoP before the pipeline existed, measured in the same run.

    python bench/bench_pipeline.py [--seconds 5] [--rounds 3] [--baseline-rev c7c9a92]

Servers, all serving functions/examples/hello-wat with ``--no-ai``, alternated
round by round (wrk -t1 -c32), best round of each kept:
  (a) baseline: the PoP at --baseline-rev (the commit before the pipeline), from
      a git worktree in bench/.cache, run with this venv;
  (b) the default pipeline: request_id, access_log (to /dev/null), route, dispatch;
  (c) a minimal pipeline: route, dispatch only (what the stages around them cost).
Ratios are to (a). Needs git and wrk (apt-get install -y wrk).
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import _wrk  # noqa: E402
from bench_runtime import start_edgefn  # noqa: E402

HELLO = ROOT / "functions" / "examples" / "hello-wat"
MINIMAL = '[[pipeline]]\nstage = "route"\n[[pipeline]]\nstage = "dispatch"\n'


def baseline_tree(rev: str) -> Path:
    """A worktree of `rev` under bench/.cache (made once). Raises CalledProcessError."""
    tree = ROOT / "bench" / ".cache" / f"baseline-{rev}"
    if not tree.exists():
        tree.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
                       check=True, capture_output=True)
    return tree


def start(tree: Path, data: Path, extra: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    """`edgefn serve --no-ai` from `tree`, hello-wat deployed."""
    return start_edgefn(data, ["--no-ai", *extra], tree, HELLO)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline-rev", default="c7c9a92")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="edgefn-bench-pipeline-"))
    atexit.register(shutil.rmtree, work, True)  # its PoPs' data dirs, at exit
    minimal = work / "minimal.toml"
    minimal.write_text(MINIMAL)
    servers = {
        "before the pipeline": start(baseline_tree(args.baseline_rev), work / "a", []),
        "default pipeline": start(ROOT, work / "b", []),
        "route+dispatch only": start(ROOT, work / "c", ["--config", str(minimal)]),
    }
    best: dict[str, dict[str, float]] = {}
    try:
        for _, port in servers.values():
            _wrk.run(f"http://127.0.0.1:{port}/hello", seconds=1)
        for _ in range(args.rounds):
            for name, (_, port) in servers.items():
                r = _wrk.run(f"http://127.0.0.1:{port}/hello", seconds=args.seconds)
                if r["errors"]:
                    raise RuntimeError(f"{name}: {r['errors']} errors under load")
                if name not in best or r["rps"] > best[name]["rps"]:
                    best[name] = r
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(20)
    base = best["before the pipeline"]["rps"]
    print(f"\n== WASM hello, wrk -t1 -c32 -d{args.seconds}s, best of {args.rounds} rounds ==")
    print(f"{'server':<24}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'x before':>10}")
    for name, r in best.items():
        print(f"{name:<24}{r['rps']:>10.0f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}"
              f"{r['rps'] / base:>10.2f}")


if __name__ == "__main__":
    main()
