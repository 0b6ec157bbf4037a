"""What a guest writes to its stdout or stderr, as lines of the PoP's log: tagged
with the function, each cut at `MAX_LINE` characters, control characters shown
escaped (an ANSI escape or a CR cannot redraw the operator's terminal or forge a
line), and at most `RATE` lines a second (burst `BURST`) per function; past it
lines are counted and dropped, and the count is logged once lines flow again.

Used for a Python isolate host's pipe (`runtime.executors.python.host_output`),
a WASI guest's stderr (`runtime.executors.wasm.function`) and a Python function's
``env.log`` (`runtime.executors.python.calls`, at INFO: it wrote raw newlines,
so forged access-log lines, and 54 MB in a second).
"""

from __future__ import annotations

import logging
import threading
import time

MAX_LINE = 2000  # characters of one line kept (the rest is cut, marked)
RATE = 20.0  # lines a second a function may log, on average ...
BURST = 200  # ... and at once; past it lines are counted and dropped


class GuestLines:
    """Logs one function's output lines on `log` as ``LABEL: WHAT: line`` (at WARNING
    unless told otherwise). Thread-safe (WASI guests run on worker threads; a Python
    host's stdout and stderr are read by a thread each)."""

    def __init__(self, log: logging.Logger, label: str, what: str,
                 level: int = logging.WARNING) -> None:
        """`what`: the kind of line (``stderr``), logged after the label (if any)."""
        self.log, self.label, self.level = log, label, level
        self.prefix = f"{label}: {what}: " if what else f"{label}: "
        self.what = what or "log"
        self.tokens, self.last, self.dropped = float(BURST), time.monotonic(), 0
        self.lock = threading.Lock()

    def line(self, raw: bytes, level: int | None = None) -> None:
        """Log one line (its end of line, if any, is dropped) at `level` (None: the
        one given at construction)."""
        if len(raw) > MAX_LINE:
            raw = raw[:MAX_LINE] + b" [cut]"
        with self.lock:
            now = time.monotonic()
            self.tokens = min(BURST, self.tokens + (now - self.last) * RATE)
            self.last = now
            if self.tokens < 1:
                self.dropped += 1
                return
            self.tokens -= 1
            dropped, self.dropped = self.dropped, 0
        if dropped:
            self.log.warning("%s: %s: %d lines dropped (over %g a second)", self.label,
                             self.what, dropped, RATE)
        self.log.log(self.level if level is None else level, "%s%s", self.prefix,
                     escaped(raw.decode("utf-8", "replace").rstrip("\r\n")))


def escaped(text: str) -> str:
    """`text` for one log line: control characters (a newline, an ANSI escape, a CR)
    shown escaped, so a function's text cannot start a forged line or redraw the
    operator's terminal."""
    return text.encode("unicode_escape", "replace").decode("ascii") if _control(text) else text


def said(text: str, limit: int = MAX_LINE) -> str:
    """A guest's one-line `text` for the PoP's log: escaped, and cut at `limit`
    characters (marked): escaped alone, one forged frame made a line of 64 MiB."""
    if len(text) <= limit:
        return escaped(text)
    return escaped(text[:limit]) + f" [cut: {len(text) - limit} more characters]"


def escaped_lines(label: str, text: str) -> str:
    """A function's multi-line `text` (a traceback) for one log record: each line
    escaped, and each after the first starting with ``LABEL| `` (a message with a
    newline in it could end a line and start one that read like the access log's)."""
    return f"\n{label}| ".join(escaped(line) for line in text.split("\n"))


def _control(text: str) -> bool:
    """Whether `text` holds control characters (ANSI escapes, CR): shown escaped."""
    return any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in text)
