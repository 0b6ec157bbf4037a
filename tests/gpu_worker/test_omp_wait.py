"""llama.cpp's OpenMP threads wait passively in the worker after a short spin (spinning
long, a 24-token chat took 30-60 s instead of ~1 s on 2 cores with one busy; sleeping at
once, each barrier woke a halted core), unless the environment says otherwise. Read off
libgomp itself (``OMP_DISPLAY_ENV=VERBOSE``), which reads the variables once, when
llama.cpp's CPU backend loads it, so this also checks that they are set in time: how
long a thread spins before it sleeps (libgomp's own: 0 passive, 300000 unset, which it
prints as PASSIVE too)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpu_worker.engines import BARRIER_SPINS
from tests.support import ROOT

LOAD = ("import gpu_worker.server\n"
        "from gpu_worker.engines import llama_backends\n"
        "llama_backends.load_backends()\n")


def _spin_count(policy: str | None, spins: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(OMP_DISPLAY_ENV="VERBOSE", PYTHONPATH=str(ROOT))
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    if spins is not None:
        env["GOMP_SPINCOUNT"] = spins
    out = subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = next((x for x in out.stderr.splitlines() if "GOMP_SPINCOUNT" in x), None)
    assert line is not None, out.stderr  # libgomp was loaded and said what it read
    return line.split("=", 1)[1].strip().strip("'")


@pytest.mark.parametrize(("policy", "given", "spins"), [
    (None, None, str(BARRIER_SPINS)),  # the worker's: a short spin, then sleep
    ("ACTIVE", None, "30000000000"),  # the user's policy, libgomp's spin for it
    ("PASSIVE", None, "0"),
    (None, "5000", "5000"),  # the user's spin, the worker's policy
])
def test_llama_cpps_threads_spin_briefly_then_sleep_unless_told(
        policy: str | None, given: str | None, spins: str) -> None:
    assert _spin_count(policy, given) == spins
