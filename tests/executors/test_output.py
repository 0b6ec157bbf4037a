"""A guest's output lines in the PoP's log (`runtime.executors.output`): cut, escaped
and rate-limited per function, so a function can neither flood the log nor draw on
the operator's terminal."""

from __future__ import annotations

import logging
import time

import pytest

from runtime.executors.output import BURST, MAX_LINE, RATE, GuestLines
from tests.support import own_records


def test_lines_are_cut_escaped_and_limited(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("edgefn.functions")
    lines = GuestLines(log, "f@v1", "stderr")
    with caplog.at_level(logging.WARNING, logger="edgefn.functions"):
        lines.line(b"x" * (MAX_LINE + 50) + b"\n")
        lines.line(b"\x1b[2Jclear\r\n")
        for i in range(BURST + 48):  # 198 more fit the burst; 50 are dropped
            lines.line(b"n%d" % i)
        time.sleep(2 / RATE)  # room for two lines again
        lines.line(b"after")
    got = [r.getMessage() for r in own_records(caplog, "edgefn.functions")]
    assert got[0] == "f@v1: stderr: " + "x" * MAX_LINE + " [cut]"
    assert got[1] == "f@v1: stderr: \\x1b[2Jclear"
    import re

    counted = re.fullmatch(rf"f@v1: stderr: (\d+) lines dropped \(over {RATE:g} a second\)",
                           got[-2])
    assert counted is not None and got[-1] == "f@v1: stderr: after"
    dropped = int(counted[1])  # 50, or a few less on a machine slow enough to refill
    assert 45 <= dropped <= 50
    assert len(got) == 2 + (BURST + 48 - dropped) + 2
