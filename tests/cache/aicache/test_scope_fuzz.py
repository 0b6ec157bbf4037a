"""Scope isolation, fuzzed: random tenants, models (a LoRA adapter included),
system prompts and sampling parameters, with identical or paraphrased user
prompts, embedded by the real MiniLM; at a threshold far below the shipped one
(0.3) so that any entry of another scope would be close enough to be served.
No lookup may ever return an entry of another scope; each lookup's hit must be
one the reference model (stored queries per scope) allows."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.cache.ai import guards
from runtime.cache.ai.cache import AICache
from runtime.cache.ai.entry import Generated
from runtime.cache.ai.keys import Call, chat_call, completion_call
from runtime.cache.settings import AICacheSettings

from .conftest import Clock, MiniLM

TENANTS = ["", "acme", "globex", "acme "]
MODELS = ["smollm2-135m", "smollm2-135m-pirate-lora"]
SYSTEMS = [None, "Be brief.", "Answer as a pirate."]
SAMPLING: list[dict[str, Any]] = [{"temperature": 0}, {"temperature": 0, "max_tokens": 32},
                                  {"temperature": 0.7, "seed": 1}, {"temperature": 0, "top_k": 1},
                                  {"temperature": 0, "stop": ["\n"]}]
PROMPTS = ["What is the capital of France?", "what's the capital city of France",
           "Tell me France's capital.", "How do I reset my password?",
           "how can I reset my password", "What is the capital of France?"]

scopes = st.tuples(st.sampled_from(TENANTS), st.sampled_from(MODELS), st.sampled_from(SYSTEMS),
                   st.integers(0, len(SAMPLING) - 1), st.booleans())
ops = st.lists(st.tuples(st.booleans(), scopes, st.sampled_from(PROMPTS)), min_size=2,
               max_size=14)


def make(scope: tuple[str, str, str | None, int, bool], prompt: str) -> Call:
    tenant, model, system, sampling, chat = scope
    params = SAMPLING[sampling]
    if not chat:
        return completion_call(tenant, model, f"{system or ''}\n{prompt}", params)
    msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}]
    return chat_call(tenant, model, msgs, params)


async def play(cache: AICache, steps: list[tuple[bool, Any, str]]) -> None:
    stored: dict[bytes, set[str]] = {}  # the reference: scope -> queries stored there
    for store, scope, prompt in steps:
        call = make(scope, prompt)
        found = await cache.lookup(call, cache.policy())
        if found.entry is not None:
            got = found.entry.call
            assert (got.tenant, got.model, got.kind) == (call.tenant, call.model, call.kind)
            assert got.scope == call.scope and got.bucket == call.bucket
            assert got.query in stored[call.bucket]
            if found.outcome == "hit-exact":
                assert got.key == call.key
        elif store:
            cache.complete(found, Generated((prompt,), "stop", 3, 1), 1.0)
            stored.setdefault(call.bucket, set()).add(call.query)
            continue
        cache.abandon(found)
    first = make(steps[0][1], steps[0][2])
    if steps[0][0]:  # the test has teeth: what was stored is served in its own scope
        again = await cache.lookup(first, cache.policy())
        assert again.entry is not None and again.entry.call.bucket == first.bucket


@settings(max_examples=150, deadline=None)
@given(steps=ops)
def test_no_lookup_returns_an_entry_of_another_scope(minilm: MiniLM,
                                                     steps: list[tuple[bool, Any, str]]) -> None:
    cache = AICache(AICacheSettings(threshold=0.3, deterministic_only=False), minilm,
                    clock=Clock())
    asyncio.run(play(cache, steps))


def test_the_paraphrases_are_close_enough_to_be_served_across_scopes(minilm: MiniLM) -> None:
    """Guards the fuzz test's premise: at its threshold, every fuzzed prompt of an
    intent would be served for the others if scopes did not separate them."""
    cache = AICache(AICacheSettings(threshold=0.3, deterministic_only=False), minilm,
                    clock=Clock())

    async def main() -> list[str]:
        outcomes = []
        for prompt in PROMPTS[1:3]:
            miss = await cache.lookup(make(("", MODELS[0], None, 0, True), PROMPTS[0]),
                                      cache.policy())
            cache.complete(miss, Generated(("x",), "stop", 1, 1), 1.0)
            found = await cache.lookup(make(("", MODELS[0], None, 0, True), prompt),
                                       cache.policy())
            outcomes.append(found.outcome)
        return outcomes

    assert asyncio.run(main()) == ["hit-semantic", "hit-semantic"]
    assert guards.normalize(PROMPTS[0]) == guards.normalize(PROMPTS[-1])
