"""Stale if error (``[ai_cache] stale_if_error_s``) without sockets: an entry is
kept that long past its TTL, is never a hit then, and answers a miss whose model
call failed (`AICache.stale`): the exact key's, else a close enough one of the
scope (real MiniLM embeddings); counted as ``stale``, not as the miss."""

from __future__ import annotations

import asyncio

from runtime.cache.ai.cache import AICache, Lookup

from .conftest import Clock, MiniLM
from .test_cache import ANSWER, PARIS, PARIS2, ask, cache, run


def failed(c: AICache, text: str) -> tuple[Lookup, AICache]:
    """A miss whose model call failed: what `stale` found for it."""
    async def go() -> Lookup:
        found = await c.lookup(ask(text), c.policy())
        c.stale(found)
        c.abandon(found)
        return found
    return asyncio.run(go()), c


def test_an_expired_entry_answers_a_failed_call_within_the_window(clock: Clock) -> None:
    c = cache(clock, ttl_seconds=60, stale_if_error_s=600, semantic=False)
    run(c, ask("q"))
    clock.now += 60
    found, _ = failed(c, "q")
    assert found.outcome == "stale" and found.entry is not None
    assert found.entry.result == ANSWER
    record = c.account_stale(found)
    assert record["outcome"] == "stale" and record["expired_s"] == 0.0
    clock.now += 599.999
    assert failed(c, "q")[0].outcome == "stale"
    clock.now += 0.001  # past the window: removed on the next lookup
    assert failed(c, "q")[0].outcome == "miss" and len(c) == 0


def test_a_stale_entry_is_never_a_hit(clock: Clock) -> None:
    c = cache(clock, ttl_seconds=60, stale_if_error_s=600, semantic=False)
    run(c, ask("q"))
    clock.now += 60
    assert run(c, ask("q")).outcome == "miss"  # the origin answered: stored anew
    clock.now += 59
    assert run(c, ask("q")).outcome == "hit-exact"


def test_without_the_window_nothing_is_kept(clock: Clock) -> None:
    c = cache(clock, ttl_seconds=60, semantic=False)
    run(c, ask("q"))
    clock.now += 60
    assert failed(c, "q")[0].outcome == "miss"


def test_a_failed_paraphrase_gets_the_nearest_stale_entry(clock: Clock,
                                                          minilm: MiniLM) -> None:
    c = cache(clock, minilm, ttl_seconds=60, stale_if_error_s=600, threshold=0.5)
    run(c, ask(PARIS))
    clock.now += 61
    found, _ = failed(c, PARIS2)
    assert found.outcome == "stale" and found.similarity is not None
    assert found.entry is not None and found.entry.result == ANSWER
    assert c.account_stale(found)["expired_s"] == 1.0
    other = asyncio.run(c.lookup(ask(PARIS2, tenant="rival"), c.policy()))
    assert c.stale(other) is None  # another scope: nothing


def test_a_stale_answer_is_counted_as_stale_not_as_a_miss(clock: Clock) -> None:
    c = cache(clock, ttl_seconds=60, stale_if_error_s=600, semantic=False)
    c.account(run(c, ask("q")))  # the first request: a miss
    clock.now += 60

    async def go() -> None:  # as the stage does it
        found = await c.lookup(ask("q"), c.policy())
        c.account(found)  # a miss, counted at lookup time
        assert c.stale(found) is not None
        c.abandon(found)
        c.account_stale(found)
    asyncio.run(go())
    (row,) = c.stats.snapshot()
    assert row["outcomes"] == {"miss": 1, "stale": 1} and row["hits"] == 1
