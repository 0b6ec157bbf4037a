"""The native lane's C extension (``native_src/lane.c``, `_edgefn_lane`): whole
requests for eligible targets served in C from the bytes a read brought.

Built on first use with the system C compiler into the native cache
(`edgefn_core.fastcodec.compile_cached`, as the codec and the WASM reactor's
libraries are). It parses with the llhttp that httptools ships, reached through
httptools' own extension (`httptools_parser`); `layout_check` compares the struct
fields the C reads with llhttp's accessors on a known request before the lane is
used. Without a compiler, Python's headers or a matching llhttp, `load()` returns
None (logged once) and every request takes the Python front and pipeline.

What the lane serves, and how a PoP decides it, is `runtime.pipeline.lane_table`'s; this
module only builds and loads the extension.
"""

from __future__ import annotations

import logging
import os
import subprocess
from functools import cache
from pathlib import Path
from types import ModuleType

from edgefn_core.fastcodec import build, import_extension

log = logging.getLogger("edgefn.http")
SOURCE = Path(__file__).with_name("native_src") / "lane.c"
PARTS = tuple(SOURCE.with_name(f"lane_{part}.c.h")  # what lane.c includes: part of the key
              for part in ("routes", "records", "cgi", "drain"))
NAME = "_edgefn_lane"
ENV = "EDGEFN_NATIVE_LANE"  # "0": off, whatever [http] native_lane says
# (err, method field, accessor, major, minor, major accessor, minor accessor, keep-alive)
# of "PUT /x HTTP/1.0" with keep-alive: PUT is llhttp's method 4
LAYOUT = (0, 4, 4, 1, 0, 1, 0, 1)
# what a Python route's call says of its request's connection (its 17th field, lane.c
# `conn_of`): an HTTP/1.0 request; one not kept alive (answered with `connection: close`)
CONN_HTTP10, CONN_CLOSE = 1, 2


def httptools_parser() -> str:
    """The path of httptools' parser extension, whose llhttp the lane calls."""
    import httptools.parser.parser as parser

    return str(parser.__file__)


def disabled() -> bool:
    """Whether the environment turns the lane off (``EDGEFN_NATIVE_LANE=0`` or
    ``EDGEFN_NATIVE=0``)."""
    return any(os.environ.get(name, "1") == "0" for name in (ENV, "EDGEFN_NATIVE"))


@cache
def load() -> ModuleType | None:
    """The extension, built if needed; None (logged once) when it cannot be had."""
    try:
        return import_extension(NAME, build(SOURCE, "lane", PARTS))
    except (OSError, RuntimeError, ImportError, subprocess.SubprocessError) as e:
        log.warning("the native lane is unavailable (%s); every request takes the Python "
                    "front", e)
        return None


def check_layout(module: ModuleType) -> None:
    """Raises RuntimeError when the llhttp httptools ships is not laid out as lane.c
    reads it (call after a `Lane` was made: that loads llhttp)."""
    got = tuple(module.layout_check())
    if got != LAYOUT:
        raise RuntimeError(f"llhttp's layout differs from lane.c's: {got} != {LAYOUT}")
