"""What an isolate host writes to its stdout and stderr: a pipe of its own each,
relayed line by line into the PoP's log (``edgefn.functions``, tagged with the
function), bounded in line length and rate (one budget for both). Stdout (a
function's ``print()``) is logged at INFO, stderr (tracebacks, the host's own
complaints) at WARNING: every print had been a WARNING.

A host's fds 1 and 2 used to be the PoP's own, so a function's ``os.write(2, ...)``
could forge lines of the PoP's log and ``os.ftruncate(1, 0)`` could wipe the file it
was redirected to. Now whatever the host (or code that reaches its fds) writes is
text in the log under the function's name, never the PoP's own output.
"""

from __future__ import annotations

import logging
import threading
from typing import IO

from runtime.executors.output import MAX_LINE, GuestLines

log = logging.getLogger("edgefn.functions")


def relay(stdout: IO[bytes], stderr: IO[bytes], label: str) -> list[threading.Thread]:
    """Start a daemon thread for each pipe that logs each line read from it until its
    end (the host and every copy of its write end are gone)."""
    lines = GuestLines(log, label, "host output")
    threads = [threading.Thread(target=_relay, args=(pipe, lines, level), daemon=True,
                                name=f"edgefn-host-output {label}")
               for pipe, level in ((stdout, logging.INFO), (stderr, logging.WARNING))]
    for thread in threads:
        thread.start()
    return threads


def _relay(pipe: IO[bytes], lines: GuestLines, level: int) -> None:
    try:
        while True:
            raw = pipe.readline(MAX_LINE + 1)
            if not raw:
                break
            if len(raw) > MAX_LINE and not raw.endswith(b"\n"):
                rest = pipe.readline(1 << 16)  # the rest of that line, not logged
                while rest and not rest.endswith(b"\n"):
                    rest = pipe.readline(1 << 16)
            lines.line(raw, level)
    except (OSError, ValueError):  # the pipe was closed under us (the PoP is stopping)
        pass
    finally:
        pipe.close()
