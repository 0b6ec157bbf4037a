"""`edgefn` start-up time; every figure next to the bare interpreter's start-up.

    python bench/bench_cli.py [--runs 10]

Median wall time of `python -m runtime.cli ARGS` over N runs for --help, a
command's help, --version, a client command with no PoP to talk to (`ls` on an
empty data dir: parser, admin client, one error line) and `kv list` on a data
dir (opens the stores: LMDB, usearch, numpy). The baseline is `python -c pass`
with the same interpreter and environment.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EDGEFN = [sys.executable, "-m", "runtime.cli"]


def median_ms(argv: list[str], runs: int) -> float:
    """Median wall time of `argv` (cwd: the repository root), in milliseconds."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    runs = ap.parse_args().runs
    with tempfile.TemporaryDirectory() as tmp:
        data = str(Path(tmp) / "data")
        subprocess.run([*EDGEFN, "kv", "put", "ns", "k", "v", "--data", data], check=True,
                       stdout=subprocess.DEVNULL, cwd=ROOT)
        cases = [("--help", ["--help"]), ("serve --help", ["serve", "--help"]),
                 ("--version", ["--version"]), ("ls (no PoP)", ["ls", "--data", tmp]),
                 ("kv list (data dir)", ["kv", "list", "ns", "--data", data])]
        floor = median_ms([sys.executable, "-c", "pass"], runs)
        print(f"{'python -c pass':<22} {floor:7.0f} ms")
        for name, args in cases:
            ms = median_ms([*EDGEFN, *args], runs)
            print(f"{'edgefn ' + name:<22} {ms:7.0f} ms  {ms / floor:5.1f}x the interpreter")


if __name__ == "__main__":
    main()
