"""The seconds a 429's ``Retry-After`` says: until the full window lets the client
in again, rounded up, and never 0 (a client told "0" retries at once, into the same
refusal).

The clock is the limiter module's `time`, set by the test (as
`test_the_lanes_refusals_are_the_stages_429s` does), so the seconds are exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from runtime.pipeline.chain import Chain
from runtime.security.ratelimit import limiter as limiter_module
from runtime.security.settings import Algorithm, RateLimitSettings, RateRule
from tests.security.test_ratelimit import call, chain, header

START = 1_796_000_040.0  # a whole minute: where a sliding window of 60 s starts


@pytest.fixture
def clock() -> Iterator[list[float]]:
    """The limiter's clock, [now], in seconds since the epoch."""
    now = [START]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(limiter_module, "time", SimpleNamespace(time=lambda: now[0]))
        yield now


def app(algorithm: Algorithm) -> Iterator[Chain]:
    chained, stage = chain(RateLimitSettings(rules=[RateRule("ip", "3/minute", algorithm)]))
    try:
        yield chained
    finally:
        stage.close()


@pytest.fixture
def fixed() -> Iterator[Chain]:
    yield from app("fixed_window")


@pytest.fixture
def sliding() -> Iterator[Chain]:
    yield from app("sliding_window")


def test_a_refusal_says_the_seconds_left_in_the_window(clock: list[float], fixed: Chain
                                                       ) -> None:
    """A fixed window of 60 s starts at its first hit: full at once, a request 10 s
    later waits the 50 s left, and one 59.5 s in waits the half second left, as 1."""
    assert [call(fixed).status for _ in range(3)] == [200] * 3
    clock[0] = START + 10
    refused = call(fixed)
    assert refused.status == 429
    assert header(refused, b"retry-after") == "50"
    clock[0] = START + 59.5
    refused = call(fixed)
    assert refused.status == 429 and header(refused, b"retry-after") == "1"
    clock[0] = START + 60
    assert call(fixed).status == 200  # the window it named has passed


def test_a_refusal_as_the_window_turns_says_at_least_one_second(clock: list[float],
                                                                 sliding: Chain) -> None:
    """A sliding window that took its 3 in the last minute is full at the very start
    of the next one, with nothing left to wait (its reset is now): still "1"."""
    assert [call(sliding).status for _ in range(3)] == [200] * 3
    clock[0] = START + 60
    refused = call(sliding)
    assert refused.status == 429
    assert header(refused, b"retry-after") == "1"
