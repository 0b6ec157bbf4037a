"""Sandbox uids for isolate hosts (used when the PoP runs as root): each host gets
one no other host on this machine holds, whichever PoP process started it.

Hosts with one uid share what the kernel counts per user (``RLIMIT_NPROC``), so
one could use up another's. The uids were ``pid * 1000 + n`` modulo the range,
and two PoP processes (``workers = N``, or several PoPs on one machine) whose
pids matched modulo 50 walked the same sequence. Now a uid is claimed with an
exclusive ``flock`` on a file named after it, held until its host is gone (or
the PoP process exits: the kernel releases it then).
"""

from __future__ import annotations

import fcntl
import os
import random
import tempfile
from pathlib import Path

from edgefn_core.errors import DeployError
from runtime.executors.python.sandbox import UID_BASE, UID_RANGE


def lock_dir() -> Path:
    """Where the locks live: /run (a tmpfs, root's) when writable, else the temp dir."""
    run = Path("/run")
    base = run if os.access(run, os.W_OK) else Path(tempfile.gettempdir())
    return base / "edgefn-uids"


def claim(where: Path | None = None) -> tuple[int, int]:
    """A uid no other host holds, and the fd of its lock (`release` it when the host
    is gone). Raises `DeployError` when every uid of the range is held."""
    folder = where or lock_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    start = random.randrange(UID_RANGE)
    for i in range(UID_RANGE):
        n = (start + i) % UID_RANGE
        fd = os.open(folder / str(n), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return UID_BASE + n, fd
    raise DeployError(f"every one of the {UID_RANGE} sandbox uids is held by a running host")


def release(fd: int) -> None:
    """Give a claimed uid back (idempotent for -1)."""
    if fd >= 0:
        os.close(fd)
