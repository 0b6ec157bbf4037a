"""Which deployments have stored a response, as a PoP's workers share it
(``workers = N``, the HTTP cache's disk tier shared).

A worker serves a request for a deployment that never stored a response without
a lookup (the native lane answers it in C). With one worker the cache knows that
set itself; with several, another worker may have stored one. So the first store
of a deployment in a worker also appends its ``name@version`` to a file in the
cache's folder (``labels``, one per line, under an exclusive `flock`) and then
writes the file's new size into a second, 8-byte file every worker maps
(``labels.size``). `stamp` reads that size (a memory read: the lane checks it at
every read it serves); when it moved, `fresh` reads the lines added since. A
deployment is never taken out (as with one worker): a purge leaves its requests to
the lookup, which finds nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
from collections.abc import Iterator
from pathlib import Path

SIZE_BYTES = 8


class SharedLabels:
    """The shared file of deployments that stored a response. Raises `OSError` when
    its files cannot be opened or mapped."""

    def __init__(self, folder: Path) -> None:
        self.fd = os.open(folder / "labels", os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        size_fd = os.open(folder / "labels.size", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            with _locked(self.fd):
                if os.fstat(size_fd).st_size < SIZE_BYTES:
                    os.ftruncate(size_fd, SIZE_BYTES)
            self.map = mmap.mmap(size_fd, SIZE_BYTES)
        finally:
            os.close(size_fd)  # the mapping keeps what it needs
        self.size = memoryview(self.map).cast("Q")
        self.read_to = 0  # bytes of `labels` read (whole lines)

    def stamp(self) -> int:
        """A value that changes whenever a worker adds a deployment."""
        return int(self.size[0])

    def fresh(self) -> list[str]:
        """The deployments added since the last call (all of them, the first time)."""
        end = self.size[0]
        if end <= self.read_to:
            return []
        data = os.pread(self.fd, end - self.read_to, self.read_to)
        whole = data[:data.rfind(b"\n") + 1]  # a line is whole once the size says so
        self.read_to += len(whole)
        return whole.decode("utf-8", "replace").split()

    def add(self, label: str) -> None:
        """Append `label` for every worker (one write under the lock, then the size)."""
        with _locked(self.fd):
            os.write(self.fd, label.encode() + b"\n")
            self.size[0] = os.fstat(self.fd).st_size

    def close(self) -> None:
        self.size.release()
        self.map.close()
        os.close(self.fd)


@contextlib.contextmanager
def _locked(fd: int) -> Iterator[None]:
    """An exclusive `flock` on `fd` (the other workers')."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
