"""bench/bench_topology.py --quick runs end to end: both modes, every request
answered, what needs no model never reaches central in the distributed run, and
the cold-start tables (one boot and pooled over three) carry their noise control.
(The speed figures are the bench's to print, not this test's to time.)"""

from __future__ import annotations

import subprocess
import sys

from tests.support import ROOT


def test_the_quick_bench_runs_and_prints_the_table() -> None:
    out = subprocess.run([sys.executable, "bench/bench_topology.py", "--quick"], cwd=ROOT,
                         capture_output=True, text=True, timeout=900,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    failed = next(line for line in lines if line.startswith("failed requests"))
    assert failed == "failed requests: (a) 0 of 20, (b) 0 of 20", out.stdout
    origin = next(line for line in lines if line.startswith("origin requests")).split()
    assert int(origin[4]) < int(origin[3]), out.stdout  # (b) < (a): functions ran at the edge
    for label in ("global p50", "global ttft50", "hit rates of", "cold start", "eu-west",
                  "us-east"):
        assert any(line.startswith(label) for line in lines), label
    colds = [line for line in lines if line.startswith("  ") and "x" in line.split()[-1]]
    assert len(colds) == 4 * 2  # 4 PoPs x 2 functions
    assert all("control" in line for line in colds), colds  # the noise control beside each
    # --boots' default (3): the pooled tables, inside the PoP and end to end, 8 rows each
    # and how many ratios (first, control) exceed 1.2x
    for where in ("inside the PoP", "end to end"):
        at = lines.index(next(line for line in lines
                              if line.startswith(f"cold start over 3 boots, {where}")))
        assert all("control" in line for line in lines[at + 1:at + 9]), out.stdout
        assert lines[at + 9].startswith(f"  above 1.2x ({where}, 3 boots): first "), out.stdout


def test_boots_below_one_is_refused_before_anything_starts() -> None:
    out = subprocess.run([sys.executable, "bench/bench_topology.py", "--boots", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--boots must be at least 1, got 0" in out.stderr
    assert "topology up" not in out.stdout


def test_with_regional_models_the_regional_generates_what_central_did() -> None:
    """--regional-models: the regional runs the chat model, so in the distributed run
    central generates nothing and the regional generates the misses."""
    out = subprocess.run([sys.executable, "bench/bench_topology.py", "--quick", "--boots", "1",
                          "--regional-models"], cwd=ROOT, capture_output=True, text=True,
                         timeout=900, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert "failed requests: (a) 0 of 20, (b) 0 of 20" in lines, out.stdout
    model = next(line for line in lines if line.startswith("model calls (central)")).split()
    regional = next(line for line in lines if line.startswith("generated at regionals")).split()
    assert int(model[3]) > 0 and int(model[4]) == 0, out.stdout  # (a) central, (b) none
    assert int(regional[3]) == 0 and int(regional[4]) > 0, out.stdout
