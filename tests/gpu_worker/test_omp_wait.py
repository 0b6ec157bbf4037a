"""llama.cpp's OpenMP threads wait passively in the worker (spinning, a 24-token chat
took 30-60 s instead of ~1 s on 2 cores with one busy), unless the environment says
otherwise. Read off libgomp itself (``OMP_DISPLAY_ENV=VERBOSE``), which reads the variable
once, when llama.cpp's CPU backend loads it, so this also checks that it is set in time:
how long a thread spins before it sleeps, 0 passive (unset: 300000; libgomp prints the
policy as PASSIVE then too)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import ROOT

LOAD = ("import gpu_worker.server\n"
        "from gpu_worker.engines import llama_backends\n"
        "llama_backends.load_backends()\n")


def _spin_count(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update(OMP_DISPLAY_ENV="VERBOSE", PYTHONPATH=str(ROOT))
    if env_value is not None:
        env["OMP_WAIT_POLICY"] = env_value
    out = subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = next((x for x in out.stderr.splitlines() if "GOMP_SPINCOUNT" in x), None)
    assert line is not None, out.stderr  # libgomp was loaded and said what it read
    return line.split("=", 1)[1].strip().strip("'")


@pytest.mark.parametrize(("given", "spins"), [(None, "0"), ("ACTIVE", "30000000000")])
def test_llama_cpps_threads_wait_passively_unless_told(given: str | None, spins: str) -> None:
    assert _spin_count(given) == spins
