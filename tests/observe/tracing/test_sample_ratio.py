"""`[tracing] sample` is the share of new traces kept: a draw below it keeps the
trace, one at or above it does not (sample 0.5 keeps about half, not every one).
The draw (`rand`) is given, so the decision is exact; the answer's
``traceparent`` says it (flags ``01`` sampled, ``00`` not)."""

from __future__ import annotations

import pytest

from runtime.observe.settings_tracing import TracingSettings
from runtime.pipeline.chain import Chain
from runtime.pipeline.stages.tracing import Tracing
from tests.observe.events.helpers import Answer, request, run
from tests.observe.tracing.test_timing import NOT_SAMPLED


def sampled(sample: float, draw: float, traceparent: bytes | None = None,
            trust: bool = True) -> bool:
    """Whether a request is sampled when the stage draws `draw`."""
    draws: list[float] = []

    def rand() -> float:
        draws.append(draw)
        return draw

    tracing = Tracing(TracingSettings(enabled=True, sample=sample, trust_sampled=trust),
                      rand=rand)
    r = request()
    if traceparent is not None:
        r.headers.append((b"traceparent", traceparent))
    response = run(Chain([tracing, Answer()])(r))
    header = dict(response.headers)[b"traceparent"]
    assert header.endswith((b"-01", b"-00"))
    assert len(draws) <= 1
    return header.endswith(b"-01")


@pytest.mark.parametrize(("draw", "kept"), [(0.3, True), (0.7, False), (0.5, False),
                                            (0.0, True), (0.9999, False)])
def test_a_new_trace_is_kept_when_the_draw_is_below_sample(draw: float, kept: bool) -> None:
    assert sampled(0.5, draw) is kept


@pytest.mark.parametrize(("draw", "kept"), [(0.3, True), (0.7, False)])
def test_an_untrusted_parent_is_decided_by_the_same_draw(draw: float, kept: bool) -> None:
    """With ``trust_sampled = false`` a client's traceparent is drawn for as a new
    trace is: its flags decide nothing."""
    assert sampled(0.5, draw, NOT_SAMPLED, trust=False) is kept


@pytest.mark.parametrize("draw", [0.0, 0.5, 0.9999])
def test_sample_one_keeps_and_sample_zero_drops_whatever_the_draw(draw: float) -> None:
    assert sampled(1.0, draw) is True
    assert sampled(0.0, draw) is False
