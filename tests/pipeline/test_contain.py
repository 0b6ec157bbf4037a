"""Failures made responses (`runtime.pipeline.contain`): what the PoP's log says of
them. A refusal that sheds load is logged once a second per target and code, with
how many more came meanwhile: a client at a function's concurrency limit wrote
1,100 warning lines a second."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from edgefn_core.errors import FunctionError
from runtime.net.message import Response
from runtime.pipeline import contain as contain_mod
from runtime.pipeline.contain import contain
from runtime.pipeline.stage import Context


def context(label: str) -> Context:
    ctx = Context("127.0.0.1")
    ctx.target = SimpleNamespace(  # type: ignore[assignment]
        label=label, kind="function",
        error_response=lambda err: Response(err.status, [], str(err).encode()))
    return ctx


def test_load_shedding_refusals_are_logged_once_a_second_with_a_count(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    monkeypatch.setattr(contain_mod.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(contain_mod, "_shed", {})
    busy = FunctionError("concurrency_limit", 503, "has 4 requests in flight")
    with caplog.at_level(logging.WARNING, "edgefn.pop"):
        for _ in range(50):
            assert contain(context("f@1"), busy).status == 503  # each answered
        contain(context("g@1"), busy)  # another target: its own line
        now[0] += 1.0
        contain(context("f@1"), busy)
        for _ in range(3):  # a trap says something new each time: every one logged
            contain(context("f@1"), FunctionError("trap", 500, "raised ValueError"))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "f@1: concurrency_limit: has 4 requests in flight",
        "g@1: concurrency_limit: has 4 requests in flight",
        "f@1: concurrency_limit: has 4 requests in flight (and 49 more like it since the last)",
        *["f@1: trap: raised ValueError"] * 3]
