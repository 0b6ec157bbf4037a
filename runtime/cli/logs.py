"""Logging for `edgefn serve` and `edgefn dev`: by default warnings from everything
plus every line a function logs (logger ``edgefn.functions`` and its children, in
a short format); -v adds INFO from everything, -vv DEBUG."""

from __future__ import annotations

import logging
import sys
from typing import Any

FUNCTIONS = "edgefn.functions"
LONG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class FunctionLines(logging.Formatter):
    """``HH:MM:SS [NAME] message``, the level only when WARNING or above, then the
    traceback if any. NAME is the record's `function` attribute if it has one (a
    `extra={"function": ...}`), else the logger name below ``edgefn.functions``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s [%(fn)s]%(lvl)s %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        name = record.name.removeprefix(FUNCTIONS).lstrip(".")
        record.fn = getattr(record, "function", None) or name or "function"
        record.lvl = f" {record.levelname}" if record.levelno >= logging.WARNING else ""
        return super().format(record)


class Stderr(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a record is logged, not when the handler
    was made: `edgefn` run in-process (a test calling `runtime.cli.main.main`) would
    otherwise keep writing to a stream its caller replaced and closed, and every later
    line failed with "--- Logging error ---" and a printed call stack."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _: Any) -> None:
        pass


def configure(verbosity: int) -> None:
    """Log to stderr: WARNING and up from everything (INFO with `verbosity` 1,
    DEBUG with 2), and function lines from INFO (DEBUG with 2)."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    everything = Stderr()
    everything.setFormatter(logging.Formatter(LONG_FORMAT))
    logging.basicConfig(level=level, handlers=[everything], force=True)
    functions = logging.getLogger(FUNCTIONS)
    functions.setLevel(logging.DEBUG if verbosity >= 2 else logging.INFO)
    functions.propagate = False
    functions.handlers.clear()
    handler = Stderr()
    handler.setFormatter(FunctionLines())
    functions.addHandler(handler)
