"""bench/bench_vector_sync.py runs end to end on a small index (a real writer
process, real LMDB and usearch) and prints each figure with its ratio."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_bench_prints_every_figure_with_its_ratio() -> None:
    out = subprocess.run([sys.executable, "bench/bench_vector_sync.py", "--n", "2000",
                          "--dim", "16", "--queries", "50"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    assert out.count("== ") == 2  # the two index sizes
    assert len(re.findall(r"with the check\): +\d+ QPS +[\d.]+ us +ratio [\d.]+x", out)) == 2
    assert len(re.findall(r"the check alone: +\d+ /s +[\d.]+ us", out)) == 2
    assert len(re.findall(r"wrote 1 vector: +[\d.]+ us median; nothing new: +[\d.]+ us; "
                          r"ratio [\d.]+x \(50 rounds\)", out)) == 2
    assert len(re.findall(r"writer's own insert\): +[\d.]+ us median", out)) == 2
