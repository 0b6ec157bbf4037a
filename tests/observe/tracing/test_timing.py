"""Tracing times the chain for the requests it samples, not the others (unless the
events or the access log want every request's stage timings)."""

from __future__ import annotations

import pytest

from runtime import config
from runtime.observe.observers import Observers
from runtime.observe.settings_tracing import TracingSettings
from runtime.pipeline.chain import Chain
from runtime.pipeline.stages.events import Events
from runtime.pipeline.stages.request_id import RequestId
from runtime.pipeline.stages.tracing import Tracing
from tests.observe.events.helpers import Answer, Collect, request, run

NOT_SAMPLED = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
SAMPLED = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def stages_ms(traceparent: bytes | None, keep_timings: bool) -> dict[str, float]:
    observers, seen = Observers(), Collect()
    observers.add(seen)
    cfg = config.load(None)
    tracing = Tracing(TracingSettings(enabled=True, sample=0.0), keep_timings=keep_timings)
    chain = Chain([tracing, RequestId(config.RequestIdStage()), Events(cfg, observers),
                   Answer()], timed=True)
    r = request()
    if traceparent is not None:
        r.headers.append((b"traceparent", traceparent))
    run(chain(r))
    event, = seen.events
    return event.stages_ms


@pytest.mark.parametrize("traceparent", [None, NOT_SAMPLED])
def test_a_request_not_sampled_is_not_timed(traceparent: bytes | None) -> None:
    assert stages_ms(traceparent, keep_timings=False) == {}


def test_a_sampled_request_is_timed_stage_by_stage() -> None:
    assert list(stages_ms(SAMPLED, keep_timings=False)) == [
        "tracing", "request_id", "events", "answer"]


def test_every_request_is_timed_when_events_want_the_timings() -> None:
    assert list(stages_ms(NOT_SAMPLED, keep_timings=True)) == [
        "tracing", "request_id", "events", "answer"]


def test_a_stages_decided_lists_of_ints_are_span_attributes() -> None:
    """The WAF's rule ids are ints: a stage span carried its mode and score, not them."""
    from runtime.observe.tracing import _decided

    got = _decided("waf", {"mode": "block", "score": 8, "rules": [920350, 942100],
                           "mixed": [1, "a"], "none": None})
    assert got == {"edgefn.waf.mode": "block", "edgefn.waf.score": 8,
                   "edgefn.waf.rules": [920350, 942100]}


@pytest.mark.parametrize(("trust", "sent", "sample", "sampled"), [
    (True, SAMPLED, 0.0, True), (True, NOT_SAMPLED, 1.0, False),  # W3C parent-based
    (False, SAMPLED, 0.0, False), (False, NOT_SAMPLED, 1.0, True),  # this PoP's draw
])
def test_trust_sampled_false_leaves_the_sampling_to_the_pop(
        trust: bool, sent: bytes, sample: float, sampled: bool) -> None:
    """Any client could have every one of its requests traced (0.1x the req/s), or
    none: with ``trust_sampled = false`` its traceparent joins its trace, and the
    PoP's `sample` decides."""
    tracing = Tracing(TracingSettings(enabled=True, sample=sample, trust_sampled=trust))
    r = request()
    r.headers.append((b"traceparent", sent))
    response = run(Chain([tracing, Answer()])(r))
    header = dict(response.headers)[b"traceparent"]
    assert header.startswith(b"00-0af7651916cd43dd8448eb211c80319c-")  # the same trace
    assert header.endswith(b"-01" if sampled else b"-00")
