"""The rate-limit counters' C extension (``native_src/counters.c``,
`_edgefn_counters`): `Counters` in C, the same decisions as counters.py's, and the
table of shared memory through which the PoP processes of ``workers = N`` count
together (`create_table`, `counters(table=...)`).

Built on first use with the system C compiler into the native cache
(`edgefn_core.fastcodec.build`, as the lane and the codec are). Without a compiler or
Python's headers, or with ``EDGEFN_NATIVE=0``, `counters()` gives the Python class
(logged once): the same counts, at a few microseconds more a request.
"""

from __future__ import annotations

import hashlib
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
SHM = Path("/dev/shm")


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
    `table`: the path of a shared table (`create_table`) its fixed and sliding windows
    live in, counted with every process that maps it; without the extension, this
    process's memory (logged). Raises OSError or ValueError for a table it cannot map."""
    module = load()
    if module is None:
        if table is not None:
            log.warning("rate limits are counted per worker: the shared table needs the "
                        "native counters")
        return Counters(clock)
    return module.Counters(clock, table)


def table_path(data_dir: Path) -> Path:
    """Where the shared table of the PoP on `data_dir` lives: in /dev/shm (named
    after the data dir, as the workers' control sockets are), else in the data dir."""
    key = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:24]
    if SHM.is_dir() and os.access(SHM, os.W_OK):
        return SHM / f"edgefn-{key}-ratelimit"
    return data_dir / "ratelimit.table"


def create_table(path: Path, groups: int = TABLE_GROUPS) -> bool:
    """A fresh shared table at `path` (what was there is replaced): the workers' parent
    makes it before it starts them. False (logged) without the extension: each
    worker then counts alone. Raises OSError."""
    module = load()
    if module is None:
        log.warning("rate limits with storage memory:// are counted per worker: the "
                    "shared table needs the native counters")
        return False
    module.create_table(str(path), groups)
    return True
