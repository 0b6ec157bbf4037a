"""The test run ends when its tests do: a thread left running after them (which
interpreter exit would join forever) is named with its stack and the run fails,
rather than CI waiting out its time limit (conftest.py, `pytest_unconfigure`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("body, status", [
    # a non-daemon thread that never ends: the run stops after the grace, failed
    ("threading.Thread(target=threading.Event().wait, name='left-forever').start()", 3),
    # an idle pool nobody shut down: its workers end as at interpreter exit
    ("ThreadPoolExecutor(2, thread_name_prefix='idle-pool').submit(int).result()", 0),
], ids=["left-running", "idle-pool"])
def test_a_thread_left_running_ends_the_run_with_its_stack(tmp_path: Path, body: str,
                                                           status: int) -> None:
    (tmp_path / "test_left.py").write_text(
        "import threading\nfrom concurrent.futures import ThreadPoolExecutor\n\n\n"
        f"def test_it():\n    {body}\n")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:randomly",
         "-p", "no:cacheprovider", str(tmp_path / "test_left.py")],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "EDGEFN_TEST_LEFT_THREADS_S": "1"})
    assert "1 passed" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.returncode == status, done.stderr[-2000:]
    if status:
        assert "1 thread(s) still running 1 s after the tests" in done.stderr
        assert "left-forever" in done.stderr and "in wait" in done.stderr  # its stack
    else:
        assert "still running" not in done.stderr
    assert time.monotonic() - started < 30
