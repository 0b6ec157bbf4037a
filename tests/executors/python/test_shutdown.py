"""Stopping `edgefn dev` with Python functions deployed: Ctrl-C (the terminal
sends SIGINT to the whole foreground process group, isolate hosts included)
must end everything quickly and quietly, and a PoP killed outright must not
leave isolate hosts behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support import EXAMPLES, running

ROOT = Path(__file__).resolve().parents[3]
STARTUP_TIMEOUT = 120.0
EXIT_WITHIN = 3.0


@contextmanager
def dev_pop(data: Path) -> Iterator[subprocess.Popen[str]]:
    """`edgefn dev functions/examples --no-ai` in its own session (so that killpg is
    a terminal's Ctrl-C), once it prints "serving"; killed if still running after."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "dev", str(EXAMPLES), "--no-ai", "--port", "0",
         "--data", str(data)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        out: list[str] = []
        reader = threading.Thread(target=_read_until_serving, args=(proc, out), daemon=True)
        reader.start()
        reader.join(STARTUP_TIMEOUT)
        assert out and out[-1].startswith("serving "), "".join(out)
        time.sleep(0.5)  # a user presses Ctrl-C whenever; let the standbys settle
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def _read_until_serving(proc: subprocess.Popen[str], out: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        out.append(line)
        if line.startswith("serving "):
            return


def test_ctrl_c_on_dev_exits_within_3s_without_tracebacks(tmp_path: Path) -> None:
    with dev_pop(tmp_path / "data") as proc:
        hosts = _children(proc.pid)
        assert len(hosts) >= 5, "expected isolate hosts for the Python examples"
        os.killpg(proc.pid, signal.SIGINT)
        sent = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    print(f"exited {took:.2f}s after SIGINT (status {proc.returncode})")
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    assert took < EXIT_WITHIN, f"took {took:.2f}s to exit after SIGINT\n{stderr[-3000:]}"
    assert proc.returncode == 0
    assert _gone(hosts), "isolate hosts outlived the PoP"


def test_isolate_hosts_exit_when_the_pop_is_killed(tmp_path: Path) -> None:
    with dev_pop(tmp_path / "data") as proc:
        hosts = _children(proc.pid)
        proc.kill()  # the PoP alone: no signal reaches its hosts
        proc.wait()
        assert _gone(hosts, within=EXIT_WITHIN), "isolate hosts outlived a killed PoP"


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (the isolate hosts of a PoP run with --no-ai)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _gone(pids: list[int], within: float = 2.0) -> bool:
    """None of `pids` is running (a zombie counts as gone) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(running(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


