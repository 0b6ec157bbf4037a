"""`AICache` without sockets: exact hits, TTL and eviction on a controlled
clock, bypass rules, single flight, and semantic hits on real MiniLM
embeddings (the packaged ONNX model, in process)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from runtime.cache.ai import guards
from runtime.cache.ai.cache import AICache, Lookup, entries
from runtime.cache.ai.entry import Generated
from runtime.cache.ai.keys import Call, chat_call
from runtime.cache.settings import AICacheOverride, AICacheSettings
from runtime.cache.stats import CacheStats

from .conftest import Clock, MiniLM

T0 = {"temperature": 0}
ANSWER = Generated(("Paris", "."), "stop", 12, 2)


def ask(text: str, tenant: str = "acme", system: str = "Be brief.", **params: Any) -> Call:
    return chat_call(tenant, "smollm2-135m", [{"role": "system", "content": system},
                                              {"role": "user", "content": text}],
                     {**T0, **params})


def cache(clock: Clock, embed: Any = None, **settings: Any) -> AICache:
    return AICache(AICacheSettings(**settings), embed, CacheStats(), clock)


async def through(c: AICache, call: Call, origin: Callable[[], Awaitable[Generated]],
                  **policy: Any) -> Lookup:
    """The way the stage and the binding use the cache: lookup, and on a miss the
    origin's answer stored."""
    found = await c.lookup(call, c.policy(**policy))
    if found.entry is None:
        try:
            c.complete(found, await origin(), 5.0)
        except BaseException:
            c.abandon(found)
            raise
    return found


def answered(result: Generated = ANSWER) -> Callable[[], Awaitable[Generated]]:
    async def origin() -> Generated:
        return result
    return origin


def run(c: AICache, call: Call, **policy: Any) -> Lookup:
    return asyncio.run(through(c, call, answered(), **policy))


def test_a_stored_answer_is_an_exact_hit_and_counted(clock: Clock) -> None:
    c = cache(clock)
    assert run(c, ask("Capital of France?")).outcome == "miss"
    found = run(c, ask("  Capital of France?\n"))  # the whitespace around it only
    assert found.outcome == "hit-exact" and found.entry is not None
    assert found.entry.result == ANSWER and found.entry.origin_ms == 5.0
    record = c.account(found)
    assert record == {"outcome": "hit-exact", "bytes": 6, "saved_ms": 5.0,
                      "entry": found.entry.id, "cached_tokens": 12}
    (row,) = c.stats.snapshot()
    assert (row["tenant"], row["model"], row["outcomes"]) == ("acme", "smollm2-135m",
                                                             {"hit-exact": 1})


def test_an_entry_lives_its_ttl_on_the_clock(clock: Clock) -> None:
    c = cache(clock, ttl_seconds=60)
    run(c, ask("q"))
    clock.now += 59.999
    assert run(c, ask("q")).outcome == "hit-exact"
    clock.now += 0.001
    assert run(c, ask("q")).outcome == "miss"  # expired: removed, asked again, stored anew
    assert len(c) == 1
    run(c, ask("r"), ttl=5)  # a request's own TTL (x-edgefn-cache-ttl)
    clock.now += 4.999
    assert run(c, ask("r"), store=True).outcome == "hit-exact"
    clock.now += 0.001
    assert run(c, ask("r")).outcome == "miss"


def test_each_scope_keeps_its_most_recently_used_entries(clock: Clock) -> None:
    c = cache(clock, max_entries_per_scope=3, semantic=False)
    for q in ("a", "b", "c"):
        run(c, ask(q))
    assert run(c, ask("a")).outcome == "hit-exact"  # "a" is now the most recent
    run(c, ask("d"))  # evicts "b", the least recently used
    assert sorted(e.call.query for e in entries(c)) == ["a", "c", "d"]
    run(c, ask("x", tenant="other"))  # another scope does not count against this one
    assert len(c) == 4
    assert run(c, ask("b")).outcome == "miss"


def test_least_recently_used_scopes_go_with_their_entries(clock: Clock) -> None:
    c = cache(clock, max_scopes=2)
    for tenant in ("t1", "t2"):
        run(c, ask("q", tenant=tenant))
    run(c, ask("q", tenant="t1"))  # t1 used last
    run(c, ask("q", tenant="t3"))  # drops t2's scope
    assert {e.call.tenant for e in entries(c)} == {"t1", "t3"} and len(c) == 2
    assert run(c, ask("q", tenant="t2")).outcome == "miss"


@pytest.mark.parametrize(("call", "policy", "reason", "stored"), [
    (ask("q", temperature=0.7), {}, "nondeterministic", False),
    (ask("q"), {"lookup": False}, "no-cache", True),
    (ask("q"), {"lookup": False, "store": False}, "no-store", False),
    (ask("q"), {"override": AICacheOverride(enabled=False)}, "off", False),
])
def test_bypass_reasons_and_what_they_store(clock: Clock, call: Call, policy: dict[str, Any],
                                            reason: str, stored: bool) -> None:
    c = cache(clock)
    override = policy.pop("override", None)
    found = asyncio.run(through(c, call, answered(), override=override, **policy))
    assert (found.outcome, found.reason, found.entry) == ("bypass", reason, None)
    assert len(c) == int(stored)


def test_no_cache_skips_the_lookup_and_refreshes_the_entry(clock: Clock) -> None:
    c = cache(clock)
    old = run(c, ask("q"))
    assert old.outcome == "miss"
    (first,) = entries(c)
    assert run(c, ask("q"), lookup=False).outcome == "bypass"
    (second,) = entries(c)
    assert second.id != first.id and run(c, ask("q")).entry is second


def test_nondeterministic_calls_are_cached_when_allowed(clock: Clock) -> None:
    c = cache(clock, deterministic_only=False)
    run(c, ask("q", temperature=0.7))
    assert run(c, ask("q", temperature=0.7)).outcome == "hit-exact"
    f = AICacheOverride(deterministic_only=True)  # a function may ask for the strict rule
    assert asyncio.run(through(c, ask("q", temperature=0.7), answered(), override=f)
                       ).outcome == "bypass"


def test_concurrent_identical_calls_make_one_origin_call(clock: Clock) -> None:
    c = cache(clock, semantic=False)
    calls = 0

    async def origin() -> Generated:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)  # the model at work while the others arrive
        return ANSWER

    async def main() -> list[Lookup]:
        return await asyncio.gather(*(through(c, ask("q"), origin) for _ in range(8)))

    found = asyncio.run(main())
    assert calls == 1
    assert sorted(f.outcome for f in found) == ["hit-exact"] * 7 + ["miss"]
    assert all(f.coalesced for f in found if f.hit) and not c.flights


def test_waiters_go_on_when_the_leader_fails(clock: Clock) -> None:
    c = cache(clock, semantic=False)
    calls = 0

    async def origin() -> Generated:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        if calls == 1:
            raise RuntimeError("the model failed")
        return ANSWER

    async def main() -> list[Lookup | BaseException]:
        return await asyncio.gather(*(through(c, ask("q"), origin) for _ in range(4)),
                                    return_exceptions=True)

    found = asyncio.run(main())
    assert sum(isinstance(f, RuntimeError) for f in found) == 1
    # one waiter led the second try, the other two waited for it
    assert calls == 2 and not c.flights and len(c) == 1
    assert sorted(f.outcome for f in found if isinstance(f, Lookup)) == [
        "hit-exact", "hit-exact", "miss"]


# -- semantic, on the real MiniLM embeddings -------------------------------------------
PARIS = "What is the capital of France?"
PARIS2 = "what's the capital city of France"


def sim(m: MiniLM, a: str, b: str) -> float:
    import numpy as np

    out = asyncio.run(m(EMBED_MODEL, [guards.normalize(a), guards.normalize(b)]))
    va, vb = (np.asarray(v) for v in out["embeddings"])
    return float(va @ vb / np.linalg.norm(va) / np.linalg.norm(vb))


EMBED_MODEL = "all-minilm-l6-v2"


def test_a_paraphrase_is_a_semantic_hit_at_the_threshold_and_not_above(
        clock: Clock, minilm: MiniLM) -> None:
    s = sim(minilm, PARIS, PARIS2)
    assert 0.5 < s < 0.999
    for threshold, outcome in ((s - 1e-3, "hit-semantic"), (s + 1e-3, "miss")):
        c = cache(clock, minilm, threshold=threshold)
        run(c, ask(PARIS))
        found = run(c, ask(PARIS2))
        assert found.outcome == outcome
        if outcome == "hit-semantic":
            assert found.entry is not None and found.entry.call.query == guards.normalize(PARIS)
            assert found.similarity == pytest.approx(s, abs=1e-4)
            assert c.account(found)["similarity"] == round(found.similarity, 4)


def test_a_semantic_hit_needs_the_same_scope(clock: Clock, minilm: MiniLM) -> None:
    c = cache(clock, minilm, threshold=0.5)
    run(c, ask(PARIS))
    for other in (ask(PARIS2, tenant="rival"), ask(PARIS2, system="Be verbose."),
                  ask(PARIS2, max_tokens=3)):
        assert run(c, other).outcome == "miss"
    assert run(c, ask(PARIS2)).outcome == "hit-semantic"


def test_a_vector_the_tier_below_gave_is_looked_up_without_embedding(
        clock: Clock, minilm: MiniLM) -> None:
    import numpy as np

    asked: list[list[str]] = []

    async def embed(model: str, texts: list[str], client: str | None) -> dict[str, Any]:
        asked.append(texts)
        return await minilm(model, texts, client)

    c = cache(clock, embed, threshold=0.5)
    run(c, ask(PARIS))
    assert len(asked) == 1  # the stored query, embedded here
    given = np.asarray((asyncio.run(minilm(EMBED_MODEL, [guards.normalize(PARIS2)])))
                       ["embeddings"][0], dtype=np.float32)
    found = asyncio.run(c.lookup(ask(PARIS2), c.policy(), given))
    assert (found.outcome, found.embedded, len(asked)) == ("hit-semantic", "given", 1)
    assert c.account(found)["embedding"] == "given"
    # a vector far from every entry: a miss, still not embedded here, and its flight
    # carries the given vector (what the tier above gets)
    far = asyncio.run(c.lookup(ask("How do I bake bread?"), c.policy(), -given))
    assert (far.outcome, far.embedded, len(asked)) == ("miss", "given", 1)
    assert far.flight is not None and far.vector is not None and np.array_equal(far.vector,
                                                                                -given)
    c.abandon(far)
    # without one it embeds, as before, and says nothing of it
    own = asyncio.run(c.lookup(ask(PARIS2), c.policy()))
    assert (own.outcome, own.embedded, len(asked)) == ("hit-semantic", "here", 2)
    assert "embedding" not in c.account(own)


@pytest.mark.parametrize(("stored", "asked"), [
    ("What is 7 * 3?", "What is 7 - 3?"), ("Is 5 < 3?", "Is 5 > 3?"),
    ('How do I print("a") in Python?', "How do I print(a) in Python?")])
def test_another_operator_is_no_semantic_hit(clock: Clock, minilm: MiniLM, stored: str,
                                             asked: str) -> None:
    """Operators embed alike and no word guard reads them: the formula decides."""
    c = cache(clock, minilm, threshold=0.5)
    run(c, ask(stored))
    found = run(c, ask(asked))
    assert (found.outcome, found.guard) == ("miss", "formula")
    assert found.similarity is not None and found.similarity >= 0.5
    assert run(c, ask(stored.lower())).outcome == "hit-semantic"  # the same formula


@pytest.mark.parametrize(("stored", "asked", "guard"), [
    ("Is Paris the capital of France?", "Is Paris not the capital of France?", "negation"),
    ("How many days are in 3 weeks?", "How many days are in 4 weeks?", "number"),
    ("Is 5 bigger than 3?", "Is 3 bigger than 5?", "number"),
    ("Is Rust faster than Go?", "Is Go faster than Rust?", "order"),
    ("Did Germany beat Brazil in 2014?", "Did Brazil beat Germany in 2014?", "order"),
    # names are read by their case: the cache once gave the guards two normalized
    # queries, and the entity guard saw none
    ("How do I pair AirPods with a Windows PC?", "How do I pair AirPods with an Android phone?",
     "entity"),
    ("What is the population of Spain?", "What is the population of Portugal?", "entity"),
])
def test_a_guard_veto_refuses_a_semantic_hit(clock: Clock, minilm: MiniLM, stored: str,
                                             asked: str, guard: str) -> None:
    c = cache(clock, minilm, threshold=0.5)  # similar enough: only the guard can refuse
    run(c, ask(stored))
    found = run(c, ask(asked))
    assert (found.outcome, found.guard) == ("miss", guard)
    assert c.account(found)["guard"] == guard and found.similarity is not None
    assert found.similarity >= 0.5


def test_an_expired_entry_is_no_semantic_hit(clock: Clock, minilm: MiniLM) -> None:
    c = cache(clock, minilm, threshold=0.5, ttl_seconds=10)
    run(c, ask(PARIS))
    clock.now += 10
    assert run(c, ask(PARIS2)).outcome == "miss"


def test_an_evicted_entry_leaves_the_index(clock: Clock, minilm: MiniLM) -> None:
    c = cache(clock, minilm, threshold=0.5, max_entries_per_scope=1)
    run(c, ask(PARIS))
    run(c, ask("How do I bake bread?"))  # evicts the Paris entry and its vector
    (scope,) = c.scopes.values()
    assert scope.index is not None and len(scope.index) == 1 and len(scope.labels) == 1
    found = run(c, ask(PARIS2))
    assert found.entry is None or found.entry.call.query != guards.normalize(PARIS)


def test_concurrent_near_identical_prompts_wait_for_one_model_call(
        clock: Clock, minilm: MiniLM) -> None:
    c = cache(clock, minilm, threshold=0.5)
    calls = 0

    async def origin() -> Generated:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return ANSWER

    async def main() -> list[Lookup]:
        first = asyncio.ensure_future(through(c, ask(PARIS), origin))
        await asyncio.sleep(0.01)  # the first is in flight
        return [await through(c, ask(PARIS2), origin), await first]

    second, first = asyncio.run(main())
    assert calls == 1 and first.outcome == "miss"
    assert second.outcome == "hit-semantic" and second.coalesced
