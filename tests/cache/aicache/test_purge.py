"""`AICache.purge`: by model, by tenant, both or all; exact and semantic entries
go together; a call in flight when a purge matches it answers its waiters and
stores nothing."""

from __future__ import annotations

import asyncio
from typing import Any

from runtime.cache.ai.cache import AICache, Lookup, entries
from runtime.cache.ai.entry import Generated
from runtime.cache.ai.keys import Call, chat_call
from runtime.cache.settings import AICacheSettings
from runtime.cache.stats import CacheStats

from .conftest import Clock, MiniLM
from .test_cache import ANSWER, answered, through


def ask(text: str, tenant: str = "acme", model: str = "smollm2-135m") -> Call:
    return chat_call(tenant, model, [{"role": "user", "content": text}], {"temperature": 0})


def filled(clock: Clock, embed: Any = None) -> AICache:
    """Four entries: tenants acme and zeta, models smollm2-135m and other."""
    c = AICache(AICacheSettings(semantic=embed is not None), embed, CacheStats(), clock)
    for tenant in ("acme", "zeta"):
        for model in ("smollm2-135m", "other"):
            assert asyncio.run(through(c, ask("Capital of France?", tenant, model),
                                       answered())).outcome == "miss"
    return c


def outcome(c: AICache, call: Call) -> str:
    return asyncio.run(through(c, call, answered())).outcome


def left(c: AICache) -> set[tuple[str, str]]:
    return {(e.call.tenant, e.call.model) for e in entries(c)}


def test_a_purge_by_model_drops_that_model_only(clock: Clock) -> None:
    c = filled(clock)
    assert c.purge(model="other") == 2
    assert left(c) == {("acme", "smollm2-135m"), ("zeta", "smollm2-135m")} and len(c) == 2
    assert outcome(c, ask("Capital of France?", "acme", "other")) == "miss"
    assert outcome(c, ask("Capital of France?", "acme")) == "hit-exact"


def test_a_purge_by_tenant_drops_that_tenant_only(clock: Clock) -> None:
    c = filled(clock)
    assert c.purge(tenant="zeta") == 2
    assert left(c) == {("acme", "smollm2-135m"), ("acme", "other")}


def test_a_purge_by_model_and_tenant_needs_both(clock: Clock) -> None:
    c = filled(clock)
    assert c.purge(model="other", tenant="zeta") == 1
    assert ("zeta", "other") not in left(c) and len(left(c)) == 3


def test_a_purge_of_everything_leaves_no_entry_or_scope(clock: Clock) -> None:
    c = filled(clock)
    assert c.purge() == 4
    assert len(c) == 0 and not c.scopes
    assert c.purge() == 0


def test_a_purged_entry_is_no_semantic_hit(clock: Clock, minilm: MiniLM) -> None:
    c = filled(clock, minilm)
    assert outcome(c, ask("what's the capital city of france")) == "hit-semantic"
    c.purge(tenant="acme")
    assert outcome(c, ask("what's the capital city of france")) == "miss"
    assert outcome(c, ask("what's the capital city of france", "zeta")) == "hit-semantic"


def test_a_call_in_flight_during_a_purge_stores_nothing_and_its_waiters_ask_anew(
        clock: Clock) -> None:
    c = AICache(AICacheSettings(semantic=False), None, CacheStats(), clock)
    calls = 0
    answer = asyncio.Event()  # the model answers when the test says (sleeps raced a busy box)

    async def origin() -> Generated:
        nonlocal calls
        calls += 1
        await answer.wait()
        return ANSWER

    async def turns(n: int = 10) -> None:
        for _ in range(n):
            await asyncio.sleep(0)

    async def main() -> list[Lookup]:
        leader = asyncio.ensure_future(through(c, ask("q"), origin))
        await turns()
        assert c.flights and calls == 1
        waiter = asyncio.ensure_future(through(c, ask("q"), origin))  # joins the flight
        await turns()
        assert calls == 1
        assert c.purge(model="smollm2-135m") == 0 and not c.flights
        answer.set()
        return list(await asyncio.gather(leader, waiter))

    leader, waiter = asyncio.run(main())
    # the leader's answer was asked for before the purge: the waiter, answered after
    # it, asks the model itself, and only its answer is kept
    assert (leader.outcome, waiter.outcome) == ("miss", "miss") and calls == 2
    assert [e.result for e in entries(c)] == [ANSWER] and leader.entry is None
