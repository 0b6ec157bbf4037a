"""The llama.cpp scheduler's admission by KV use and its preemption, on a real
worker process (the packaged smollm2-135m, a 1024-token context, 4 slots)
reached over its socket by `gpu_worker.client`, as the PoP reaches it: one
stream that may fill the whole context, or streams whose readers read nothing,
no longer hold a short chat behind them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_worker.client import Generation, WorkerClient
from gpu_worker.protocol import TokenLogprob
from tests.gpu_worker.harness import Harness

CHAT = "smollm2-135m"
CONTEXT, SLOTS = 1024, 4
NO_END = {0: -100.0, 2: -100.0}  # <|endoftext|>, <|im_end|>: it runs to max_tokens
SHORT = [{"role": "user", "content": "Name three colours."}]
LONG = [{"role": "user", "content": "Count to a thousand."}]
STORY = [{"role": "user", "content": "Write a long story about a cat."}]
JSON = [{"role": "user", "content": "Name three colours, as JSON."}]
COLOURS = {"type": "json_schema", "json_schema": {"name": "colours", "schema": {
    "type": "object", "properties": {"colours": {"type": "array", "items": {"type": "string"}}},
    "required": ["colours"]}}}
PAUSE_GRACE = 1.0  # batching.PAUSE_GRACE


def small_worker(tmp: Path, context: int = CONTEXT) -> Harness:
    """A worker with a small context (and `SLOTS` sequence slots)."""
    config = tmp / "worker.toml"
    config.write_text(f'[[models]]\nname = "{CHAT}"\nengine = "llamacpp"\n'
                      f"threads = 1\ncontext = {context}\nmax_batch = {SLOTS}\n")
    return Harness(str(tmp / "w.sock"), str(config))


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    with small_worker(tmp_path_factory.mktemp("preempt")) as w:
        yield w


async def short_chat(client: WorkerClient) -> float:
    """Seconds to a whole 16-token answer (raises `WorkerError` if it fails)."""
    started = time.perf_counter()
    gen = await client.generate(CHAT, messages=SHORT, max_tokens=16, temperature=0.0)
    await asyncio.wait_for(gen.collect(), 60)
    return time.perf_counter() - started


async def drain(gen: Generation) -> str:
    return "".join([chunk async for chunk in gen])


def test_a_stream_that_may_fill_the_context_does_not_hold_a_short_chat(worker: Harness) -> None:
    """max_tokens = the context less the prompt reserved the whole KV cache: the
    short chat waited for the whole of it (~40x its own time here)."""
    async def go() -> tuple[float, float, Any]:
        await short_chat(worker.client)  # warm
        alone = min([await short_chat(worker.client) for _ in range(2)])
        room = CONTEXT - await worker.client.count_tokens(CHAT, messages=LONG)
        hog = await worker.client.generate(CHAT, messages=LONG, max_tokens=room,
                                           logit_bias=NO_END, temperature=0.0)
        await anext(hog)
        reader = asyncio.create_task(drain(hog))
        beside = await short_chat(worker.client)
        assert not reader.done()  # the hog still runs
        await hog.aclose()
        reader.cancel()
        return alone, beside, await worker.client.metrics()

    alone, beside, metrics = worker.run(go())
    assert beside < 4 * alone + 1.0, (alone, beside)  # two sequences a step, a loaded CI
    assert metrics["running_batch_peak"] >= 2, metrics


def test_slow_readers_yield_their_slots_and_their_text_is_unchanged(worker: Harness) -> None:
    """Every slot is held by a stream whose reader stopped after its first chunk:
    the short chat gets a slot once they have been paused PAUSE_GRACE, and each
    slow stream, read at last, has the text a fast reader gets: its JSON schema's
    grammar and its frequency penalty went on from where they were, and its KV
    cells too (kept under a spare sequence id: the short chat needed none of them,
    so nothing was recomputed)."""
    shaped = {"messages": JSON, "max_tokens": 40, "temperature": 0.0,
              "response_format": COLOURS, "frequency_penalty": 0.5}

    async def go() -> tuple[float, float, list[str], str, tuple[int, int]]:
        alone = await short_chat(worker.client)
        before = await worker.client.metrics()
        slow = [await worker.client.generate(CHAT, window=2, **shaped) for _ in range(SLOTS)]
        firsts = [await anext(gen) for gen in slow]
        beside = await short_chat(worker.client)
        texts = [first + await drain(gen) for first, gen in zip(firsts, slow, strict=True)]
        fast = await worker.client.generate(CHAT, **shaped)
        after = await worker.client.metrics()
        counts = (after["preemptions_total"] - before["preemptions_total"],
                  after["recomputes_total"] - before["recomputes_total"])
        return alone, beside, texts, await drain(fast), counts

    alone, beside, texts, fast, (preempted, recomputed) = worker.run(go())
    assert beside < PAUSE_GRACE + 4 * alone + 1.0, (alone, beside)
    assert preempted >= 1 and recomputed == 0
    assert texts == [fast] * SLOTS


# nats: two tokens this close at a step are a tie that a kernel's rounding may break
# either way (AVX-512 builds' batched steps are not bit-identical to single ones: seen,
# ties 0.0004 and 0.0034 apart broken differently at tokens 87 and 88)
NEAR_TIE = 0.01


def parted_at(alone: list[TokenLogprob], other: list[TokenLogprob]) -> int:
    """How many tokens `other` has as `alone` has them before the two part (all of
    them: never). Asserts that they part only at a near tie of `alone`'s step: past it
    the two texts go on from different words and are not compared."""
    assert len(other) == len(alone)
    for i, (a, b) in enumerate(zip(alone, other, strict=True)):
        if a.token != b.token:
            theirs = dict(a.top).get(b.token)
            assert theirs is not None and a.logprob - theirs < NEAR_TIE, (i, a, b)
            return i
    return len(alone)


def test_streams_that_outgrow_the_kv_cache_take_turns_and_keep_their_text(
        tmp_path: Path) -> None:
    """Two streams of 150 tokens in a 256-token cache: the newer one is preempted
    when the cache fills (llama.cpp's cells freed and filled again), recomputed
    once the older one ends, and both have the text each has alone at temperature
    0, up to a near tie that the batch's arithmetic broke the other way (`parted_at`;
    on an AVX2 build they are the same to the end). (Sampled text is not compared: a
    batch's composition moves the logits a little, preempted or not.)"""
    async def go(w: Harness) -> tuple[list[Any], list[Any], tuple[int, int]]:
        async def text(messages: list[Any]) -> tuple[str, Any, list[TokenLogprob]]:
            gen = await w.client.generate(CHAT, messages=messages, max_tokens=150,
                                          logit_bias=NO_END, temperature=0.0, logprobs=4)
            return (*await gen.collect(), gen.logprobs)

        alone = [await text(LONG), await text(STORY)]
        both = await asyncio.gather(text(LONG), text(STORY))
        metrics = await w.client.metrics()
        return alone, list(both), (metrics["preemptions_total"], metrics["recomputes_total"])

    with small_worker(tmp_path, context=256) as w:
        alone, both, counts = w.run(go(w))
    assert counts == (1, 1)  # its cells were wanted: dropped with its slot
    for (text, _, lp), (their_text, _, their_lp) in zip(alone, both, strict=True):
        if parted_at(lp, their_lp) == len(lp):
            assert their_text == text
    assert [(d.finish_reason, d.completion_tokens) for _, d, _ in both] == [("length", 150)] * 2
