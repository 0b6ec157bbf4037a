"""Tests of the `edgefn` command line; `edgefn(...)` runs it in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EDGEFN = [sys.executable, "-m", "runtime.cli"]


def edgefn(*args: str, stdin: bytes = b"", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `edgefn ARGS` from the repository root; text output."""
    return subprocess.run([*EDGEFN, *args], input=stdin.decode(), capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed command (asserts it is one line, no traceback)."""
    assert r.returncode != 0, r.stdout
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    return r.stderr.strip()
