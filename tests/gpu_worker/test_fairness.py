"""Fair shares between clients on a real worker process reached over its socket, as
the PoP reaches it: one client's several hogs (long chats on the packaged
smollm2-135m, long embedding requests on the packaged all-MiniLM-L6-v2) do not
make another client's short call wait behind all of them."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import msgspec
import pytest

from edgefn_core.errors import WorkerError
from gpu_worker import protocol as p
from gpu_worker.engines.onnx import MAX_TEXT_CHARS
from tests.gpu_worker.harness import Harness
from tests.gpu_worker.test_preemption import CHAT, CONTEXT, LONG, NO_END, SHORT, small_worker

EMBED = "all-minilm-l6-v2"
HOGS = 5  # one client's long chats at once: more than the worker's 4 slots
EMBED_HOGS = 6  # one client's long embedding requests at once
LONG_TEXTS = [(f"{i} " + "lighthouse keeper " * MAX_TEXT_CHARS)[:MAX_TEXT_CHARS]
              for i in range(64)]  # 16 batches of 4 inputs of 256 tokens
SENTENCE = ["is it going to rain in lisbon tomorrow"]
PAIRS = 4  # a's and b's sentences sent together while a's long embeddings run


@pytest.fixture(scope="module")
def chat_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    with small_worker(tmp_path_factory.mktemp("fair-chat")) as w:
        yield w


@pytest.fixture(scope="module")
def embed_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    tmp = tmp_path_factory.mktemp("fair-embed")
    config = tmp / "worker.toml"
    config.write_text(f'[[models]]\nname = "{EMBED}"\nengine = "onnx"\nthreads = 1\n')
    with Harness(str(tmp / "w.sock"), str(config)) as w:
        yield w


async def timed_chat(w: Harness, client: str, bound: float = 60.0) -> float:
    """Seconds to a whole 16-token answer for `client` (TimeoutError past `bound`)."""
    started = time.perf_counter()
    gen = await w.client.generate(CHAT, messages=SHORT, max_tokens=16, temperature=0.0,
                                  client=client)
    try:
        await asyncio.wait_for(gen.collect(), bound)
    finally:
        await gen.aclose()
    return time.perf_counter() - started


def test_one_clients_hogs_hold_a_fair_share_of_the_chat_model_not_all(
        chat_worker: Harness) -> None:
    """HOGS streams of client a, each free to fill the whole context, read as fast
    as they come: b's short chat takes the newest hog's slot at once. It waited for
    the hogs' queue and their preemptions, FIFO (past the bound: a minute or more)."""
    w = chat_worker

    async def go() -> tuple[float, float, int]:
        await timed_chat(w, "b")  # warm
        alone = min([await timed_chat(w, "b") for _ in range(2)])
        before = (await w.client.metrics())["preemptions_total"]
        room = CONTEXT - await w.client.count_tokens(CHAT, messages=LONG)
        hogs = [await w.client.generate(CHAT, messages=LONG, max_tokens=room, client="a",
                                        logit_bias=NO_END, temperature=0.0)
                for _ in range(HOGS)]
        readers = [asyncio.create_task(gen.collect()) for gen in hogs]
        await anext(hogs[0])  # they run
        try:
            beside = await timed_chat(w, "b", bound=5 * alone + 2.0)
        finally:
            for gen in hogs:
                await gen.aclose()
            for task in readers:
                task.cancel()
        return alone, beside, (await w.client.metrics())["preemptions_total"] - before

    alone, beside, preempted = w.run(go())
    # four sequences a step rather than one, on one thread: 2.8-3.3x here (a loaded CI)
    assert beside < 5 * alone + 1.0, (alone, beside)
    assert preempted >= 1


def test_one_clients_long_embeddings_leave_another_one_turn_in_two(
        embed_worker: Harness) -> None:
    """EMBED_HOGS requests of client a, 16 batches of long inputs each: b's one
    sentence waits for about two of a's steps (a's jobs take a's turns in turn: the
    step under way and a's next one, as b's turn comes after it), not one batch of
    each of a's requests (EMBED_HOGS here, a turn per request).

    Measured against a's own one sentence, sent just before b's and waited for at
    the same time, so the machine's speed and load weigh on both: a's waits for a
    step of each of a's requests ahead of it (EMBED_HOGS + 1 steps), so b is answered
    first, and over PAIRS pairs waits about 2/7 as long (bound 0.6: 4 of a's steps,
    under the EMBED_HOGS a turn per request takes, where b also waits for a's
    sentence). Sent once a's requests are queued and past their tokenizing (the
    events, not a sleep a loaded machine outran). A single sample of b's wait
    against a batch timed alone before it failed under bursty load."""
    w = embed_worker

    async def asked() -> int:
        return int((await w.client.metrics())["calls_by_client"].get("a", 0))

    async def ended(texts: list[str], client: str) -> float:
        await w.client.embed(EMBED, texts, client=client)
        return time.perf_counter()

    async def pair() -> tuple[float, float]:
        """b's wait and a's one sentence's, sent just before b's: they end in order."""
        before = await asked()
        sent = time.perf_counter()
        mine = asyncio.ensure_future(ended(SENTENCE, "a"))
        while await asked() < before + 1:
            await asyncio.sleep(0.005)  # the worker has it: it is a's job, queued
        b_sent = time.perf_counter()
        b_end = await asyncio.wait_for(ended(SENTENCE, "b"), 60)
        a_end = await asyncio.wait_for(mine, 60)
        assert b_end < a_end, "b's sentence waited for a's, sent just before it"
        return b_end - b_sent, a_end - sent

    async def go() -> list[tuple[float, float]]:
        await w.client.embed(EMBED, SENTENCE, client="b")  # warm
        before = await asked()
        hogs = [asyncio.ensure_future(w.client.embed(EMBED, LONG_TEXTS, client="a"))
                for _ in range(EMBED_HOGS)]
        try:
            while await asked() < before + EMBED_HOGS:
                await asyncio.sleep(0.01)  # the worker has every one: they take a's turns
            # a job of a's behind them tokenizing the same texts takes its steps in turn
            # with theirs: when it ends, each has tokenized and runs its batches
            await w.client.count_tokens(EMBED, inputs=LONG_TEXTS, client="a")
            pairs = [await pair() for _ in range(PAIRS)]
            assert not any(h.done() for h in hogs), "a's requests ended before b's"
        finally:
            for task in hogs:
                task.cancel()
            for task in hogs:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return pairs

    pairs = w.run(go())
    share = sum(b for b, _ in pairs) / sum(a for _, a in pairs)
    print("b waited " + ", ".join(f"{b:.3f} s (a's sentence {a:.3f} s)" for b, a in pairs)
          + f": {share:.2f} as long")
    assert share < 0.6, pairs  # about 2/7; with a turn per request, over 1


def test_a_client_name_past_the_limit_is_refused(embed_worker: Harness) -> None:
    """A fair share's key is a short name (a key id, an owner), never a payload."""
    async def chat() -> None:
        gen = await embed_worker.client.generate(EMBED, prompt="x", client="k" * 201)
        await gen.collect()

    for call in (embed_worker.client.embed(EMBED, SENTENCE, client="k" * 201), chat()):
        with pytest.raises(WorkerError) as e:
            embed_worker.run(call)
        assert (e.value.code, e.value.status) == ("invalid_request", 400)
        assert "'client' has 201 characters; at most 200" in str(e.value)
    assert embed_worker.run(embed_worker.client.embed(EMBED, SENTENCE, client="k" * 200))



class EmbedBeforeClients(msgspec.Struct, array_like=True, omit_defaults=True, tag="embed"):
    """`protocol.Embed` as a worker or PoP older than clients has it."""

    id: int
    model: str
    inputs: list[str]


def test_the_client_field_is_backward_compatible() -> None:
    """An older PoP's frame reads as an anonymous client's; an older worker reads a
    frame naming a client, without it (array-like: the field trails the others)."""
    old = msgspec.msgpack.encode(EmbedBeforeClients(1, EMBED, SENTENCE))
    assert p.request_decoder.decode(old) == p.Embed(1, EMBED, SENTENCE, client=None)
    new = msgspec.msgpack.encode(p.Embed(1, EMBED, SENTENCE, client="key:k1"))
    assert msgspec.msgpack.decode(new, type=EmbedBeforeClients) == \
        EmbedBeforeClients(1, EMBED, SENTENCE)
