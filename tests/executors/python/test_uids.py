"""Sandbox uids: one host a uid, across every PoP process on the machine."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from runtime.executors.python import uids
from runtime.executors.python.sandbox import UID_BASE, UID_RANGE


def test_a_claimed_uid_is_nobody_elses_until_released(tmp_path: Path) -> None:
    held = [uids.claim(tmp_path) for _ in range(50)]
    taken = [uid for uid, _ in held]
    assert len(set(taken)) == 50 and all(UID_BASE <= u < UID_BASE + UID_RANGE for u in taken)
    # another process's lock on a uid (a lock is an open file's: this fd stands for it)
    n = taken[0] - UID_BASE
    uids.release(held[0][1])
    other = os.open(tmp_path / str(n), os.O_RDWR)
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        for _ in range(200):
            uid, fd = uids.claim(tmp_path)
            uids.release(fd)
            assert uid != taken[0]
    finally:
        os.close(other)
    for _, fd in held[1:]:
        uids.release(fd)
    uids.release(-1)  # nothing to release: no error
