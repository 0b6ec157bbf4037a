"""The dashboard's rolling aggregator: 1 s buckets over a 60 s window, exact
nearest-rank percentiles below the sample bound, bounded memory."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.observe.dashboard.aggregator import MAX_FUNCTIONS, OTHER, SAMPLE, Rolling
from runtime.observe.event import AIUsage, Event

T0 = 1_800_000_000


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def event(ts: float, target: str | None = "hello@v1", status: int = 200, ms: float = 1.0,
          **kw: object) -> Event:
    return Event(ts=ts, rid="r", pop="p", tier="edge", geo="eu", client="127.0.0.1",
                 method="GET", host="h", path="/x", status=status, target=target,
                 duration_ms=ms, **kw)  # type: ignore[arg-type]


def reference(values: list[float], q: float) -> float:
    """Nearest rank, written independently: the smallest value with at least q% at
    or below it."""
    ordered = sorted(values)
    for v in ordered:
        if sum(1 for x in ordered if x <= v) * 100 >= q * len(ordered):
            return v
    return ordered[-1]


def test_series_counts_each_second_and_rps_is_the_last_full_second() -> None:
    clock = Clock(T0 + 10.5)
    r = Rolling(clock)
    for ts, n in ((T0 + 8.1, 3), (T0 + 9.7, 5), (T0 + 10.2, 2)):
        for _ in range(n):
            r.observe(event(ts))
    s = r.snapshot()
    assert s["series"][-3:] == [3, 5, 2] and sum(s["series"]) == 10
    assert s["rps"] == 5 and s["requests"] == 10 and len(s["series"]) == 60


def test_buckets_leave_the_window_after_60_seconds() -> None:
    clock = Clock(T0)
    r = Rolling(clock)
    r.observe(event(T0))
    clock.now = T0 + 59
    assert r.snapshot()["requests"] == 1
    clock.now = T0 + 60
    assert r.snapshot()["requests"] == 0 and r.snapshot()["functions"] == []
    r.observe(event(T0 - 1))  # older than the window when it arrives: not counted
    r.observe(event(T0 + 60))
    assert len(r.buckets) <= 60 and r.snapshot()["requests"] == 1


def test_errors_are_5xx_only_per_function() -> None:
    r = Rolling(Clock(T0 + 1))
    for status in (200, 404, 500, 503):
        r.observe(event(T0, status=status))
    r.observe(event(T0, target=None, status=502))
    s = r.snapshot()
    assert s["errors"] == 3 and s["error_rate"] == 3 / 5
    rows = {f["function"]: f for f in s["functions"]}
    assert rows["hello"]["errors"] == 2 and rows["hello"]["requests"] == 4
    assert rows["(none)"]["errors"] == 1


def test_cache_waf_ratelimit_and_ai_figures_come_from_decisions() -> None:
    r = Rolling(Clock(T0 + 1))
    r.observe(event(T0, decisions={"http_cache": {"outcome": "HIT"}}))
    r.observe(event(T0, decisions={"http_cache": {"outcome": "MISS"}}))
    r.observe(event(T0, decisions={"ai_cache": {"outcome": "HIT_SEMANTIC"}}))
    r.observe(event(T0, status=403, decisions={"waf": {"blocked": True, "rules": [942100]}}))
    r.observe(event(T0, decisions={"waf": {"blocked": False, "rules": []}}))
    r.observe(event(T0, status=429, decisions={"ratelimit": {"limited": "per_ip"}}))
    r.observe(event(T0, decisions={"ratelimit": {"limited": None}}))  # admitted: not a reject
    r.observe(event(T0, ai=AIUsage(operation="chat", model="m", completion_tokens=20,
                                   tokens_per_s=40.0, ttft_ms=80.0)))
    s = r.snapshot()
    assert s["cache"]["http"] == {"hits": 1, "lookups": 2, "hit_rate": 0.5}
    assert s["cache"]["ai"]["hit_rate"] == 1.0
    assert s["waf"] == {"942100": 1} and s["ratelimit"] == {"per_ip": 1}
    assert s["ai"]["ttft_p50"] == 80.0 and s["ai"]["tokens_per_s"] == 40.0


def test_each_decision_and_ai_call_counts_every_time_it_comes() -> None:
    """Twice each within one second: the counts add up (a STALE answer is a hit, an AI
    cache record without an outcome a lookup, a report-only WAF match counts, one
    without rules as "?", rate-limit rejects per rule), the total counts every event,
    and the AI figures sum tokens and generation time over the calls that say both."""
    r = Rolling(Clock(T0 + 1))
    for _ in range(2):
        r.observe(event(T0, decisions={"http_cache": {"outcome": "STALE"}}))
        r.observe(event(T0, decisions={"http_cache": {"outcome": "MISS"}}))
        r.observe(event(T0, decisions={"ai_cache": {"outcome": "HIT_EXACT"}}))
        r.observe(event(T0, decisions={"ai_cache": {}}))
        r.observe(event(T0, decisions={"waf": {"would_block": True, "rules": [1, 2]}}))
        r.observe(event(T0, status=403, decisions={"waf": {"blocked": True}}))
        r.observe(event(T0, status=429, decisions={"ratelimit": {"limited": "per_ip"}}))
        r.observe(event(T0, ai=AIUsage(operation="chat", model="m", completion_tokens=20,
                                       tokens_per_s=40.0)))  # 500 ms, no TTFT
        r.observe(event(T0, ai=AIUsage(operation="chat", model="m", completion_tokens=30,
                                       tokens_per_s=10.0, ttft_ms=5.0)))  # 3000 ms
        r.observe(event(T0, ai=AIUsage(operation="chat", model="m", completion_tokens=9)))
    r.observe(event(T0, decisions={"http_cache": {"outcome": "HIT"}}))
    s = r.snapshot()
    assert s["total"] == s["requests"] == 21
    assert s["cache"] == {"http": {"hits": 3, "lookups": 5, "hit_rate": 0.6},
                          "ai": {"hits": 2, "lookups": 4, "hit_rate": 0.5}}
    assert s["waf"] == {"1": 2, "2": 2, "?": 2} and s["ratelimit"] == {"per_ip": 2}
    assert s["ai"]["calls_with_ttft"] == 2 and s["ai"]["tokens"] == 100
    assert math.isclose(s["ai"]["tokens_per_s"], 100 / 7.0)  # 100 tokens in 7 s


def test_ttft_samples_are_bounded_per_second() -> None:
    r = Rolling(Clock(T0 + 1))
    for i in range(SAMPLE + 5):
        r.observe(event(T0, ai=AIUsage(operation="chat", model="m", ttft_ms=float(i))))
    assert r.snapshot()["ai"]["calls_with_ttft"] == SAMPLE


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 59), st.floats(0, 1e4, allow_nan=False)),
                min_size=1, max_size=300))
def test_percentiles_match_a_sorted_reference(samples: list[tuple[int, float]]) -> None:
    r = Rolling(Clock(T0 + 59))
    for second, ms in samples:
        r.observe(event(T0 + second, ms=ms))
    row, = r.snapshot()["functions"]
    values = [ms for _, ms in samples]
    for q in (50, 95, 99):
        assert row[f"p{q}"] == reference(values, q)
    assert row["requests"] == len(samples)


def test_memory_is_bounded_per_second_and_per_function() -> None:
    r = Rolling(Clock(T0 + 1))
    for i in range(SAMPLE * 3):
        r.observe(event(T0, ms=float(i)))
    for i in range(MAX_FUNCTIONS + 10):
        r.observe(event(T0, target=f"f{i}@v"))
    b, = r.buckets
    assert len(b.durations["hello"]) == SAMPLE and b.counts["hello"] == SAMPLE * 3
    assert len(b.counts) == MAX_FUNCTIONS + 1 and b.counts[OTHER] == 11  # + OTHER
    rows = {f["function"]: f for f in r.snapshot()["functions"]}
    assert rows["hello"]["p99"] == math.ceil(0.99 * SAMPLE) - 1  # of the first SAMPLE
