"""`Rolling`: what the dashboard shows about the last `WINDOW` seconds, fed as an
`Observer` of every event on the PoP's loop.

Each second has a `Bucket` of counters and, per function, a bounded sample of
durations (the first `SAMPLE` of that second: below that rate percentiles are
exact). Buckets older than the window are dropped as time moves on, so memory is
at most `WINDOW` buckets of `MAX_FUNCTIONS` samples of `SAMPLE` floats.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from runtime.observe.event import Event

WINDOW = 60  # seconds of 1 s buckets
SAMPLE = 256  # durations kept per function per second
MAX_FUNCTIONS = 64  # functions tracked per second; the rest count under OTHER
OTHER = "(other)"
NONE = "(none)"  # a request that no function served (404, a refused one)


class Bucket:
    """One second's counts."""

    __slots__ = (
        "ai_hits",
        "ai_lookups",
        "counts",
        "durations",
        "errors",
        "fn_errors",
        "gen_ms",
        "http_hits",
        "http_lookups",
        "limited",
        "requests",
        "second",
        "tokens",
        "ttft",
        "waf",
    )

    def __init__(self, second: int) -> None:
        self.second = second
        self.requests = self.errors = 0
        self.durations: dict[str, list[float]] = {}  # function -> sampled ms
        self.counts: dict[str, int] = {}  # function -> requests
        self.fn_errors: dict[str, int] = {}  # function -> 5xx answers
        self.http_hits = self.http_lookups = self.ai_hits = self.ai_lookups = 0
        self.waf: dict[str, int] = {}  # rule id -> blocked requests
        self.limited: dict[str, int] = {}  # limit name -> rejected requests
        self.ttft: list[float] = []  # ms, sampled
        self.tokens = 0  # completion tokens
        self.gen_ms = 0.0  # ms of the calls that produced them


class Rolling:
    """An `Observer`; `snapshot()` reads it (on the same loop)."""

    def __init__(self, clock: Callable[[], float] = time.time, window: int = WINDOW) -> None:
        self.clock = clock
        self.window = window
        self.buckets: deque[Bucket] = deque(maxlen=window)
        self.total = 0

    def observe(self, event: Event) -> None:
        second = int(event.ts)
        buckets = self.buckets
        b = buckets[-1] if buckets else None
        if b is None or b.second != second:
            b = self._bucket(second)
            if b is None:
                return  # older than the window
        self.total += 1
        b.requests += 1
        fn = _function(event.target)
        counts = b.counts
        if fn not in counts and len(counts) >= MAX_FUNCTIONS:
            fn = OTHER
        counts[fn] = counts.get(fn, 0) + 1
        sample = b.durations.get(fn)
        if sample is None:
            sample = b.durations[fn] = []
        if len(sample) < SAMPLE:
            sample.append(event.duration_ms)
        if event.status >= 500:
            b.errors += 1
            b.fn_errors[fn] = b.fn_errors.get(fn, 0) + 1
        if event.decisions:
            _decisions(b, event.decisions)
        if event.ai is not None:
            _ai(b, event)

    def _bucket(self, second: int) -> Bucket | None:
        """The bucket of `second`, made if missing; None if it fell out of the window."""
        for b in reversed(self.buckets):
            if b.second == second:
                return b
            if b.second < second:
                break
        if self.buckets and second <= self.buckets[-1].second - self.window:
            return None
        b = Bucket(second)
        if not self.buckets or second > self.buckets[-1].second:
            self.buckets.append(b)
        else:  # a late event (it started before the current second): keep the order
            items = sorted([*self.buckets, b], key=lambda x: x.second)[-self.window:]
            self.buckets = deque(items, maxlen=self.window)
        return b

    def live(self) -> list[Bucket]:
        """The buckets inside the window ending now."""
        now = int(self.clock())
        return [b for b in self.buckets if now - self.window < b.second <= now]

    def snapshot(self) -> dict[str, Any]:
        """The figures of the window: totals, a req/s series (oldest first), rates,
        and per function count, errors and p50/p95/p99 ms."""
        now = int(self.clock())
        live = self.live()
        by_second = {b.second: b for b in live}
        series = [by_second[s].requests if s in by_second else 0
                  for s in range(now - self.window + 1, now + 1)]
        requests = sum(b.requests for b in live)
        errors = sum(b.errors for b in live)
        last = by_second.get(now - 1)  # the last full second
        return {
            "now": now, "window_s": self.window, "total": self.total,
            "requests": requests, "errors": errors,
            "error_rate": errors / requests if requests else 0.0,
            "rps": last.requests if last is not None else 0,
            "rps_avg": requests / self.window, "series": series,
            "functions": _functions(live),
            "cache": _cache(live), "waf": _merged(live, "waf"),
            "ratelimit": _merged(live, "limited"), "ai": _ai_figures(live),
        }


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (`q` in 0..100) of a sorted, non-empty list."""
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def _function(target: str | None) -> str:
    return target.partition("@")[0] if target else NONE


def _decisions(b: Bucket, d: dict[str, Any]) -> None:
    http = d.get("http_cache")
    if http is not None:
        b.http_lookups += 1
        if http.get("outcome") in ("HIT", "STALE"):
            b.http_hits += 1
    ai = d.get("ai_cache")
    if ai is not None:
        b.ai_lookups += 1
        if str(ai.get("outcome", "")).startswith("HIT"):
            b.ai_hits += 1
    waf = d.get("waf")
    if waf is not None and (waf.get("blocked") or waf.get("would_block")):
        for rule in waf.get("rules") or ["?"]:
            b.waf[str(rule)] = b.waf.get(str(rule), 0) + 1
    limited = d.get("ratelimit")
    if limited is not None and limited.get("limited"):  # an admitted one records None
        name = str(limited["limited"])
        b.limited[name] = b.limited.get(name, 0) + 1


def _ai(b: Bucket, event: Event) -> None:
    ai = event.ai
    assert ai is not None
    if ai.ttft_ms is not None and len(b.ttft) < SAMPLE:
        b.ttft.append(ai.ttft_ms)
    if ai.completion_tokens and ai.tokens_per_s:
        b.tokens += ai.completion_tokens
        b.gen_ms += ai.completion_tokens / ai.tokens_per_s * 1000


def _functions(live: list[Bucket]) -> list[dict[str, Any]]:
    rows = []
    for fn in sorted({f for b in live for f in b.counts}):
        sample = sorted(v for b in live for v in b.durations.get(fn, ()))
        rows.append({"function": fn, "requests": sum(b.counts.get(fn, 0) for b in live),
                     "errors": sum(b.fn_errors.get(fn, 0) for b in live),
                     "p50": percentile(sample, 50), "p95": percentile(sample, 95),
                     "p99": percentile(sample, 99)})
    return rows


def _cache(live: list[Bucket]) -> dict[str, Any]:
    out = {}
    for kind in ("http", "ai"):
        hits = sum(getattr(b, f"{kind}_hits") for b in live)
        lookups = sum(getattr(b, f"{kind}_lookups") for b in live)
        out[kind] = {"hits": hits, "lookups": lookups,
                     "hit_rate": hits / lookups if lookups else None}
    return out


def _merged(live: list[Bucket], field: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for b in live:
        for k, n in getattr(b, field).items():
            out[k] = out.get(k, 0) + n
    return out


def _ai_figures(live: list[Bucket]) -> dict[str, Any]:
    ttft = sorted(v for b in live for v in b.ttft)
    tokens = sum(b.tokens for b in live)
    gen_ms = sum(b.gen_ms for b in live)
    return {"calls_with_ttft": len(ttft),
            "ttft_p50": percentile(ttft, 50) if ttft else None,
            "ttft_p95": percentile(ttft, 95) if ttft else None,
            "tokens": tokens, "tokens_per_s": tokens / gen_ms * 1000 if gen_ms else None}
