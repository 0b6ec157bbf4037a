"""The rate-limit counters' C extension (``native_src/counters.c``,
`_edgefn_counters`): `Counters` in C, the same decisions as counters.py's, and the
table of shared memory through which the PoP processes of ``workers = N`` count
together (`SharedTable`, `counters(table=...)`; `create_table` makes one in a file).

Built on first use with the system C compiler into the native cache
(`edgefn_core.fastcodec.build`, as the lane and the codec are). Without a compiler or
Python's headers, or with ``EDGEFN_NATIVE=0``, `counters()` gives the Python class
(logged once): the same counts, at a few microseconds more a request.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from edgefn_core.fastcodec import build, import_extension
from runtime.security.ratelimit.counters import Counters

log = logging.getLogger("edgefn.ratelimit")
SOURCE = Path(__file__).with_name("native_src") / "counters.c"
PARTS = (SOURCE.with_name("counters_table.c.h"),)  # what counters.c includes: part of the key
NAME = "_edgefn_counters"
# The shared table's groups of 8 windows (512 bytes each, with their lock: 8 MiB of
# shared memory). A group's 9th live key gives up the window that ends first, so it
# holds ~50,000 live keys (clients x rules within one window; the per-process counters
# sweep at as many) before that is common.
TABLE_GROUPS = 1 << 14


@cache
def load() -> ModuleType | None:
    """The extension, built if needed; None (logged once) when it cannot be had or
    ``EDGEFN_NATIVE=0`` turns natives off."""
    if os.environ.get("EDGEFN_NATIVE", "1") == "0":
        return None
    try:
        return import_extension(NAME, build(SOURCE, "counters", PARTS))
    except (OSError, RuntimeError, ImportError, subprocess.SubprocessError) as e:
        log.warning("native rate-limit counters are unavailable (%s); the Python ones count",
                    e)
        return None


def counters(clock: Callable[[], float] = time.time, table: str | None = None) -> Any:
    """A fresh `Counters` on `clock`: the C one where it loads, else counters.py's.
    `table`: the path of a shared table (`SharedTable`, `create_table`) its fixed and
    sliding windows live in, counted with every process that maps it; without the
    extension, this process's memory (logged). Raises OSError or ValueError for a
    table it cannot map."""
    module = load()
    if module is None:
        if table is not None:
            log.warning("rate limits are counted per worker: the shared table needs the "
                        "native counters")
        return Counters(clock)
    return module.Counters(clock, table)


def create_table(path: Path, groups: int = TABLE_GROUPS) -> bool:
    """A fresh shared table in a file at `path` (what was there is unlinked first: a
    process still mapping it keeps it whole). False (logged) without the extension.
    Raises OSError, ValueError for 0 groups."""
    module = load()
    if module is None:
        log.warning("rate limits are counted per process: the shared table needs the "
                    "native counters")
        return False
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        module.init_table(fd, groups)
    finally:
        os.close(fd)
    return True


class SharedTable:
    """The table the workers of ``workers = N`` count in, made by their parent: a
    memfd (no name in /dev/shm to leave behind), which this process holds open and
    the workers open by `path`, ``/proc/<its pid>/fd/<fd>``. Its memory goes when the
    last process holding or mapping it does, whatever killed them."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.path = f"/proc/{os.getpid()}/fd/{fd}"

    @classmethod
    def create(cls, groups: int = TABLE_GROUPS) -> SharedTable | None:
        """A fresh table of `groups` groups; None (logged) without the extension: each
        worker then counts alone. Raises OSError."""
        module = load()
        if module is None:
            log.warning("rate limits with storage memory:// are counted per worker: the "
                        "shared table needs the native counters")
            return None
        fd = os.memfd_create("edgefn-ratelimit", os.MFD_CLOEXEC)
        try:
            module.init_table(fd, groups)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)

    def close(self) -> None:
        """Let it go (the workers that map it keep it until they exit)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# (path, worker, workers) of the table this process's parent made (`inherit_table`)
_inherited: list[tuple[str, int, int] | None] = [None]


def inherit_table(path: str | None, worker: int = 0, workers: int = 1) -> None:
    """Count in the table at `path` as `worker` of `workers` (a worker, told by its
    parent: `shared_table`); None: in nothing shared."""
    _inherited[0] = (path, worker, workers) if path is not None else None


def inherited_table() -> str | None:
    """The table `inherit_table` named in this process, if any."""
    got = _inherited[0]
    return got[0] if got is not None else None


def inherited_worker() -> tuple[int, int] | None:
    """Which worker, of how many, `inherit_table` said this process is (None: none)."""
    got = _inherited[0]
    return (got[1], got[2]) if got is not None else None
