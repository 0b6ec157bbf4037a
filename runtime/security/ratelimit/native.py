"""The rate-limit counters' C extension (``native_src/counters.c``,
`_edgefn_counters`): `Counters` in C, the same decisions as counters.py's.

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
NAME = "_edgefn_counters"


@cache
def load() -> ModuleType | None:
    """The extension, built if needed; None (logged once) when it cannot be had or
    ``EDGEFN_NATIVE=0`` turns natives off."""
    if os.environ.get("EDGEFN_NATIVE", "1") == "0":
        return None
    try:
        return import_extension(NAME, build(SOURCE, "counters"))
    except (OSError, RuntimeError, ImportError, subprocess.SubprocessError) as e:
        log.warning("native rate-limit counters are unavailable (%s); the Python ones count",
                    e)
        return None


def counters(clock: Callable[[], float] = time.time) -> Any:
    """A fresh `Counters` on `clock`: the C one where it loads, else counters.py's."""
    module = load()
    return module.Counters(clock) if module is not None else Counters(clock)
