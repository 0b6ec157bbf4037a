"""`CacheStats`: counts by cache, function, model and tenant, bounded."""

from __future__ import annotations

import pytest

from runtime.cache import stats
from runtime.cache.stats import OVERFLOW, CacheStats


def test_counts_fold_into_overflow_past_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client names the model: 30 made-up names made 30 permanent rows."""
    monkeypatch.setattr(stats, "MAX_TALLIES", 4)
    s = CacheStats()
    s.record("ai", "hit-exact", model="real", nbytes=10)
    for i in range(30):
        s.record("ai", "miss", model=f"rnd{i}")
    s.record("ai", "hit-exact", model="real", nbytes=10)  # a known row keeps counting
    rows = {(r["model"], r["function"]): r for r in s.snapshot()}
    assert len(s.tallies) == 5  # the cap, plus one overflow row per outcome it met
    assert rows[("real", "")]["hits"] == 2 and rows[("real", "")]["bytes_served"] == 20
    assert rows[(OVERFLOW, OVERFLOW)]["requests"] == 27
    assert sum(r["requests"] for r in rows.values()) == 32


def test_workers_rows_are_summed_into_one() -> None:
    from runtime.cache.stats import merged

    a, b = CacheStats(), CacheStats()
    for _ in range(7):
        a.record("http", "MISS", function="f")
    for _ in range(13):
        b.record("http", "HIT", function="f", nbytes=5, saved_ms=1.5)
    b.record("http", "MISS", function="g")
    rows = {r["function"]: r for r in merged([a.snapshot(), b.snapshot()])}
    f = rows["f"]
    assert (f["requests"], f["hits"], f["bytes_served"], f["saved_ms"]) == (20, 13, 65, 19.5)
    assert f["outcomes"] == {"MISS": 7, "HIT": 13} and f["hit_rate"] == 0.65
    assert rows["g"]["requests"] == 1
    assert a.snapshot()[0]["outcomes"] == {"MISS": 7}  # the inputs are not changed

