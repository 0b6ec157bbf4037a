"""What an isolate host writes to its stdout and stderr: a pipe of its own, relayed
line by line into the PoP's log (``edgefn.functions``, tagged with the function),
bounded in line length and rate.

A host's fds 1 and 2 used to be the PoP's own, so a function's ``os.write(2, ...)``
could forge lines of the PoP's log and ``os.ftruncate(1, 0)`` could wipe the file it
was redirected to. Now whatever the host (or code that reaches its fds) writes is
text in the log under the function's name, never the PoP's own output.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import IO

log = logging.getLogger("edgefn.functions")

MAX_LINE = 2000  # characters of one line kept (the rest is cut, marked)
RATE = 20.0  # lines a second a host may log, on average ...
BURST = 200  # ... and at once; past it lines are counted and dropped


def relay(pipe: IO[bytes], label: str) -> threading.Thread:
    """Start a daemon thread that logs each line read from `pipe` until its end
    (the host and every copy of its write end are gone)."""
    thread = threading.Thread(target=_relay, args=(pipe, label), daemon=True,
                              name=f"edgefn-host-output {label}")
    thread.start()
    return thread


def _relay(pipe: IO[bytes], label: str) -> None:
    tokens, last, dropped = float(BURST), time.monotonic(), 0
    try:
        while True:
            raw = pipe.readline(MAX_LINE + 1)
            if not raw:
                break
            if len(raw) > MAX_LINE and not raw.endswith(b"\n"):
                rest = pipe.readline()  # the rest of that line, not logged
                while rest and not rest.endswith(b"\n"):
                    rest = pipe.readline(1 << 16)
                raw = raw[:MAX_LINE] + b" [cut]"
            now = time.monotonic()
            tokens = min(BURST, tokens + (now - last) * RATE)
            last = now
            if tokens < 1:
                dropped += 1
                continue
            tokens -= 1
            if dropped:
                log.warning("%s: host output: %d lines dropped (over %g a second)", label,
                            dropped, RATE)
                dropped = 0
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            log.warning("%s: host output: %s", label, text.encode("unicode_escape", "replace")
                        .decode("ascii") if _control(text) else text)
    except (OSError, ValueError):  # the pipe was closed under us (the PoP is stopping)
        pass
    finally:
        pipe.close()


def _control(text: str) -> bool:
    """Whether `text` holds control characters (ANSI escapes, CR): shown escaped."""
    return any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in text)
