"""What the caches decided, counted per cache, function, model and tenant, for
``edgefn cache stats`` (admin ``GET /v1/cache/stats``) and the events stage."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

# outcomes that served the request from the cache
SERVED = frozenset({"HIT", "STALE", "hit-exact", "hit-semantic", "stale"})
# counters kept at most: a model name is the client's to choose, so past this many every
# new (function, model, tenant) is counted under OVERFLOW (as `[metrics] max_series` does)
MAX_TALLIES = 4096
OVERFLOW = "_overflow"


class Tally:
    __slots__ = ("bytes", "count", "saved_ms")

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0  # bytes served from the cache
        self.saved_ms = 0.0  # origin time not spent (the stored entry's origin time)


class CacheStats:
    """Counters keyed by (cache, function, model, tenant, outcome). `function`
    is "" for the OpenAI API, `model` "" for the HTTP cache, `tenant` "" for
    an anonymous caller; at most `MAX_TALLIES` of them (then `OVERFLOW`)."""

    def __init__(self) -> None:
        self.tallies: defaultdict[tuple[str, str, str, str, str], Tally] = defaultdict(Tally)

    def record(self, cache: str, outcome: str, *, function: str = "", model: str = "",
               tenant: str | None = None, nbytes: int = 0, saved_ms: float = 0.0,
               n: int = 1) -> None:
        """Count `n` requests that decided `outcome` (`nbytes` and `saved_ms` each)."""
        key = (cache, function, model, tenant or "", outcome)
        t = self.tallies.get(key)
        if t is None:
            if len(self.tallies) >= MAX_TALLIES:
                key = (cache, OVERFLOW, OVERFLOW, OVERFLOW, outcome)
            t = self.tallies[key]
        t.count += n
        if outcome in SERVED:
            t.bytes += nbytes * n
            t.saved_ms += saved_ms * n

    def reclassify(self, cache: str, was: str, now: str, *, function: str = "",
                   model: str = "", tenant: str | None = None, nbytes: int = 0,
                   saved_ms: float = 0.0) -> None:
        """One request counted as `was` turned out `now` (an AI-cache miss whose
        origin failed, answered stale)."""
        old = self.tallies.get((cache, function, model, tenant or "", was))
        if old is not None and old.count > 0:
            old.count -= 1
        self.record(cache, now, function=function, model=model, tenant=tenant, nbytes=nbytes,
                    saved_ms=saved_ms)

    def snapshot(self) -> list[dict[str, Any]]:
        """One row per (cache, function, model, tenant): its counts by outcome,
        requests, hits and hit rate, bytes served and origin time saved."""
        rows: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        for (cache, function, model, tenant, outcome), t in sorted(self.tallies.items()):
            row = rows.setdefault((cache, function, model, tenant), {
                "cache": cache, "function": function, "model": model, "tenant": tenant,
                "outcomes": {}, "requests": 0, "hits": 0, "bytes_served": 0,
                "saved_ms": 0.0})
            row["outcomes"][outcome] = t.count
            row["requests"] += t.count
            if outcome in SERVED:
                row["hits"] += t.count
                row["bytes_served"] += t.bytes
                row["saved_ms"] = round(row["saved_ms"] + t.saved_ms, 3)
        for row in rows.values():
            row["hit_rate"] = round(row["hits"] / row["requests"], 4)
        return list(rows.values())


def merged(snapshots: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Several processes' `CacheStats.snapshot()` rows as one (``workers = N``): the
    counts of a (cache, function, model, tenant) summed, its hit rate made again."""
    rows: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for snapshot in snapshots:
        for r in snapshot:
            key = (r["cache"], r["function"], r["model"], r["tenant"])
            row = rows.get(key)
            if row is None:
                rows[key] = {**r, "outcomes": dict(r["outcomes"])}
                continue
            for outcome, n in r["outcomes"].items():
                row["outcomes"][outcome] = row["outcomes"].get(outcome, 0) + n
            for field in ("requests", "hits", "bytes_served"):
                row[field] += r[field]
            row["saved_ms"] = round(row["saved_ms"] + r["saved_ms"], 3)
    for row in rows.values():
        row["hit_rate"] = round(row["hits"] / row["requests"], 4) if row["requests"] else 0.0
    return [rows[k] for k in sorted(rows)]

