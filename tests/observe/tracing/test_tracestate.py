"""The request's tracestate as the tracing stage keeps it and the span carries it
(W3C trace-context 3.3): several headers are one list, a long one loses whole
entries, and a bad entry drops it without a log line per request."""

from __future__ import annotations

import logging

import pytest

from runtime.net.message import Request
from runtime.observe.tracing import _state
from runtime.pipeline.stages.tracing import MAX_STATE, tracestate


def request(*states: str) -> Request:
    headers = [(b"host", b"x")] + [(b"tracestate", s.encode()) for s in states]
    return Request(b"GET", b"/", b"", headers, b"x", "1.1", True, "192.0.2.1:1")


def test_several_headers_are_one_list() -> None:
    assert tracestate(request("a=1", "b=2")) == "a=1,b=2"
    assert tracestate(request()) is None
    assert tracestate(request("vendor=abc")) == "vendor=abc"


def test_a_long_state_loses_whole_entries_long_ones_first() -> None:
    """It was cut at 512 characters, mid-entry: the third of three 200-character
    entries became a shorter, altered value."""
    long = [f"v{i}=" + "x" * 200 for i in range(3)]
    short = [f"s{i}=" + "y" * 60 for i in range(10)]
    got = tracestate(request(",".join(long[:1] + short[:5]), ",".join(long[1:] + short[5:])))
    assert got is not None and len(got) <= MAX_STATE
    entries = got.split(",")
    assert entries == short[:8]  # 8 x 63 + 7 commas = 511
    assert tracestate(request(",".join(long))) == ""


def test_a_state_under_the_bound_is_kept_as_sent() -> None:
    sent = ",".join(f"k{i}=" + "z" * 40 for i in range(11))  # 11 x 44 + 10 = 494
    assert tracestate(request(sent)) == sent


def test_a_bad_entry_drops_the_state_without_a_log_line(
        caplog: pytest.LogCaptureFixture) -> None:
    """The SDK's parser logged a WARNING for each bad entry: a line any client could
    add to the PoP's log with each request."""
    caplog.set_level(logging.DEBUG)
    for bad in ("badN state!!", "a=1,a=2", "UPPER=1", ",".join(f"k{i}=1" for i in range(33))):
        assert _state(bad) == "", bad
    assert not caplog.records
    assert _state("a=1, b=2,,t@v=x") == "a=1,b=2,t@v=x"
