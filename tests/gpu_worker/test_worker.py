"""The model worker as a real process with the real default models, reached over
its Unix socket by `gpu_worker.client`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgefn_core.errors import WorkerDead, WorkerError
from gpu_worker import protocol as p
from gpu_worker.adapters import write_random_lora
from gpu_worker.client import WorkerClient
from gpu_worker.models import packaged_model
from tests.gpu_worker.harness import Harness

CHAT = "smollm2-135m"
EMBED = "all-minilm-l6-v2"
HELLO = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    with Harness(str(tmp_path_factory.mktemp("worker") / "w.sock")) as h:
        yield h


async def greedy(client: WorkerClient, model: str = CHAT, messages: list[Any] = HELLO,
                 **params: Any) -> tuple[str, Any]:
    params.setdefault("max_tokens", 24)
    gen = await client.generate(model, messages=messages, temperature=0.0, **params)
    return await gen.collect()


def test_chat_streams_text_and_counts_usage(worker: Harness) -> None:
    async def go() -> tuple[list[str], Any]:
        gen = await worker.client.generate(CHAT, messages=HELLO, max_tokens=16, temperature=0)
        chunks = [c async for c in gen]
        return chunks, gen.done

    chunks, done = worker.run(go())
    assert len(chunks) > 1 and "".join(chunks).strip()
    assert done.finish_reason in ("stop", "length")
    assert 0 < done.completion_tokens <= 16
    assert done.prompt_tokens > 5  # the chat template wraps the message


def test_max_tokens_ends_with_length(worker: Harness) -> None:
    _, done = worker.run(greedy(worker.client, max_tokens=3))
    assert (done.finish_reason, done.completion_tokens) == ("length", 3)


def test_seed_makes_sampling_repeatable(worker: Harness) -> None:
    async def sample(seed: int) -> str:
        gen = await worker.client.generate(CHAT, prompt="Once upon a time", max_tokens=20,
                                           temperature=1.0, top_p=0.95, seed=seed)
        return (await gen.collect())[0]

    a1, a2, b = worker.run(sample(7)), worker.run(sample(7)), worker.run(sample(8))
    assert a1 == a2
    assert a1 != b
    # llama.cpp reads a seed of 0xFFFFFFFF as "draw one at random": -1 and 2**32 - 1
    # (and every seed ending in those bits) gave another output at every call
    for seed in (-1, 2**32 - 1, 2**63 - 1):
        assert worker.run(sample(seed)) == worker.run(sample(seed)), seed


def test_stop_string_cuts_the_output(worker: Harness) -> None:
    full, _ = worker.run(greedy(worker.client, max_tokens=32))
    word = full.split()[2]
    cut, done = worker.run(greedy(worker.client, max_tokens=32, stop=[word]))
    assert done.finish_reason == "stop"
    assert word not in cut
    assert full.startswith(cut)


def test_concurrent_requests_share_decode_steps_and_match_solo_output(worker: Harness) -> None:
    prompts = [[{"role": "user", "content": f"Count from {i} to {i + 5}."}] for i in range(4)]

    async def go() -> tuple[list[str], list[str], dict[str, Any]]:
        solo = [(await greedy(worker.client, messages=m))[0] for m in prompts]
        await worker.client.metrics()  # resets the peak
        together = await asyncio.gather(*(greedy(worker.client, messages=m) for m in prompts))
        return solo, [t for t, _ in together], await worker.client.metrics()

    solo, together, metrics = worker.run(go())
    assert metrics["running_batch_peak"] >= 2, metrics
    # batching changes float summation order slightly; greedy text must still agree
    # on a solid prefix for every request
    for s, t in zip(solo, together, strict=True):
        assert s[:12] == t[:12], (s, t)


def test_a_long_prompt_beside_a_stream_is_fed_in_prefill_chunks(worker: Harness) -> None:
    """While a stream waits on every step for its next token, a long prompt is fed at
    most `prefill_chunk` (128 by default) tokens a step, not the whole 512-token
    budget: the stream's tokens keep coming beside it."""
    words = " ".join(f"word{i}" for i in range(400))
    long = [{"role": "user", "content": f"Summarize: {words}"}]

    async def drain(gen: Any) -> None:
        async for _ in gen:
            pass

    async def go() -> tuple[int, int]:
        stream = await worker.client.generate(  # end-of-text banned: it runs on
            CHAT, messages=HELLO, max_tokens=4000, temperature=0.0,
            logit_bias={0: -100.0, 1: -100.0, 2: -100.0})
        await anext(stream)
        reading = asyncio.ensure_future(drain(stream))
        before = (await worker.client.metrics())["decode_calls_total"]
        _, done = await greedy(worker.client, messages=long, max_tokens=1)
        calls = (await worker.client.metrics())["decode_calls_total"] - before
        assert not reading.done()  # the stream ran beside it throughout
        await stream.aclose()
        reading.cancel()
        return done.prompt_tokens, calls

    prompt, calls = worker.run(go())
    assert prompt > 1000 and calls >= prompt // 128, (prompt, calls)


def test_cancel_frees_the_slot(worker: Harness) -> None:
    async def go() -> dict[str, Any]:
        gen = await worker.client.generate(CHAT, prompt="Write a long story.", max_tokens=400,
                                           temperature=0)
        await anext(gen)
        await anext(gen)
        await gen.aclose()
        for _ in range(100):
            m = await worker.client.metrics()
            if m["running_batch"] == 0:
                return m
            await asyncio.sleep(0.02)
        return m

    assert worker.run(go())["running_batch"] == 0
    assert worker.run(greedy(worker.client, max_tokens=4))[1].completion_tokens == 4


def test_a_sequence_paused_for_credit_still_counts_as_running(worker: Harness) -> None:
    """A stream whose reader stopped holds its slot: `running_batch` must keep
    counting it even when the scheduler wakes with nothing it can step (here: a
    cancel), or a leaked sequence would look like a freed one."""
    client = worker.client

    async def go() -> int:
        paused = await client.generate(CHAT, prompt="List many animals:", max_tokens=200,
                                       temperature=0, window=2)
        try:
            async with asyncio.timeout(30):
                while paused.queue.qsize() < 2:  # its window is used up: it is paused
                    await asyncio.sleep(0.01)
            other = await client.generate(CHAT, prompt="Write a long story.", max_tokens=200,
                                          temperature=0)
            await anext(other)
            client.send(p.Cancel(other.rid))  # kept pending, so its end can be awaited
            async with asyncio.timeout(30):
                rest = [c async for c in other]
            assert other.done is not None and other.done.finish_reason == "cancelled", rest
            await asyncio.sleep(0.2)  # the scheduler handles the wake-up after the cancel
            return (await client.metrics())["running_batch"]
        finally:
            await paused.aclose()

    assert worker.run(go()) >= 1


def test_a_stream_nobody_reads_stops_at_its_window(worker: Harness) -> None:
    async def go() -> tuple[int, str]:
        gen = await worker.client.generate(CHAT, prompt="List many animals:", max_tokens=200,
                                           temperature=0, window=4)
        await asyncio.sleep(1.0)  # plenty of time for 200 tokens if nothing held it back
        held = gen.queue.qsize()
        rest = "".join([c async for c in gen])
        return held, rest

    held, rest = worker.run(go())
    assert held <= 4
    assert len(rest) > 20  # reading resumed it


@pytest.mark.parametrize(("params", "code", "status"), [
    ({"model": "no-such-model"}, "model_not_found", 404),
    ({"temperature": 5.0}, "invalid_request", 400),
    ({"top_p": -0.1}, "invalid_request", 400),
    ({"top_p": 1.0000001}, "invalid_request", 400),
    ({"top_k": -1}, "invalid_request", 400),
    ({"max_tokens": 0}, "invalid_request", 400),
    ({"stop": ["a", "b", "c", "d", "e"]}, "invalid_request", 400),
    ({"max_tokens": 100_000}, "context_length_exceeded", 400),
    ({"messages": [{"role": "user"}]}, "invalid_request", 400),
    ({"messages": [{"role": "user", "content": [  # read text only: never dropped unread
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     "invalid_request", 400),
    ({"messages": [{"role": "user", "content": [{"type": "bogus", "x": 1}]}]},
     "invalid_request", 400),
])
def test_bad_generation_requests_get_clear_errors(worker: Harness, params: dict[str, Any],
                                                  code: str, status: int) -> None:
    args: dict[str, Any] = {"messages": HELLO, **params}
    model = args.pop("model", CHAT)

    async def go() -> None:
        gen = await worker.client.generate(model, **args)
        await gen.collect()

    with pytest.raises(WorkerError) as e:
        worker.run(go())
    assert (e.value.code, e.value.status) == (code, status), str(e.value)
    assert worker.run(greedy(worker.client, max_tokens=2))[1].completion_tokens == 2


def test_an_embedding_nobody_waits_for_stops_and_frees_the_engine(worker: Harness) -> None:
    """The worker computed an abandoned 2000-input embedding to its end (minutes on a
    CPU; past the PoP's 120 s timeout too), every later one queued behind it."""
    inputs = [f"{i} " + "lighthouse keeper " * 120 for i in range(2000)]

    async def go() -> float:
        abandoned = asyncio.ensure_future(worker.client.embed(EMBED, inputs))
        await asyncio.sleep(1.0)
        abandoned.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await abandoned
        started = time.monotonic()
        out = await worker.client.embed(EMBED, ["after it"])
        assert len(out["embeddings"]) == 1
        return time.monotonic() - started

    assert worker.run(go()) < 10  # one batch of 32 at most: the whole would take minutes


def test_embeddings_and_rerank(worker: Harness) -> None:
    out = worker.run(worker.client.embed(EMBED, ["a cat sat", "a kitten sat", "tax law"]))
    a, b, c = out["embeddings"]
    dot = lambda x, y: sum(p * q for p, q in zip(x, y, strict=True))  # noqa: E731
    assert len(a) == 384 and abs(dot(a, a) - 1) < 1e-3
    assert dot(a, b) > dot(a, c)
    ranked = worker.run(worker.client.rerank(EMBED, "Where is the Eiffel Tower?", [
        "Bananas are yellow.", "The Eiffel Tower stands in Paris.", "Tax forms are due."]))
    assert ranked["results"][0]["index"] == 1
    with pytest.raises(WorkerError) as e:
        worker.run(worker.client.embed(CHAT, ["x"]))
    assert e.value.code == "invalid_request"
    with pytest.raises(WorkerError) as e:
        worker.run(worker.client.embed(EMBED, [""]))
    assert (e.value.status, str(e.value)) == (400, "'input'[0] is an empty string")
    with pytest.raises(WorkerError) as e:  # the query is one string, not a list
        worker.run(worker.client.rerank(EMBED, "", ["a"]))
    assert (e.value.status, str(e.value)) == (400, "'query' is an empty string")
    with pytest.raises(WorkerError) as e:
        worker.run(worker.client.rerank(EMBED, "q", ["a", ""]))
    assert (e.value.status, str(e.value)) == (400, "'documents'[1] is an empty string")


def test_lora_adapters_change_output_and_base_stays_the_same(worker: Harness,
                                                             tmp_path: Path) -> None:
    base_before = worker.run(greedy(worker.client))[0]
    for i in (1, 2):
        write_random_lora(packaged_model(), tmp_path / f"a{i}.gguf", rank=8, seed=i, std=0.1)
        info = worker.run(worker.client.add_lora(f"test-a{i}", str(tmp_path / f"a{i}.gguf")))
        assert info["parent"] == CHAT
    models = {m["id"]: m for m in worker.run(worker.client.models())}
    assert models["test-a1"]["parent"] == CHAT and models[CHAT].get("parent") is None

    async def mixed() -> list[str]:
        outs = await asyncio.gather(greedy(worker.client), greedy(worker.client, "test-a1"),
                                    greedy(worker.client, "test-a2"))
        return [t for t, _ in outs]

    calls_before = worker.run(worker.client.metrics())["decode_calls_total"]
    base, a1, a2 = worker.run(mixed())
    calls = worker.run(worker.client.metrics())["decode_calls_total"] - calls_before
    # adapters in the same batch leave the base model alone; batching may change the
    # float summation order slightly, so greedy text agrees on a solid prefix
    assert base[:12] == base_before[:12], (base, base_before)
    assert len({base, a1, a2}) == 3, (base, a1, a2)
    assert worker.run(greedy(worker.client, "test-a1"))[0][:12] == a1[:12]
    # the patched llama.cpp (.ci/llama-wheel) decodes the three in one call a step:
    # 24 tokens each, prompts in a call or two; a stock build needs three calls a step
    assert calls <= 24 + 3, calls

    with pytest.raises(WorkerError) as e:
        worker.run(worker.client.add_lora("bad", str(tmp_path / "missing.gguf")))
    assert "does not exist" in str(e.value)
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file")
    with pytest.raises(WorkerError):
        worker.run(worker.client.add_lora("junk", str(tmp_path / "junk.gguf")))
    with pytest.raises(WorkerError) as e:
        worker.run(worker.client.add_lora("test-a1", str(tmp_path / "a1.gguf")))
    assert "already in use" in str(e.value)


def test_ipc_round_trip(worker: Harness) -> None:
    assert worker.run(worker.client.ping(b"x" * 1000)) == b"x" * 1000


def test_killed_worker_fails_in_flight_cleanly_and_comes_back(worker: Harness) -> None:
    client = worker.client

    async def go() -> tuple[BaseException | None, str]:
        gen = await client.generate(CHAT, prompt="Tell a long story.", max_tokens=300,
                                    temperature=0)
        await anext(gen)
        assert client.pid is not None
        os.kill(client.pid, signal.SIGKILL)
        failure: BaseException | None = None
        try:
            async with asyncio.timeout(10):
                async for _ in gen:
                    pass
        except WorkerDead as e:
            failure = e
        text, _ = await greedy(client, max_tokens=3)
        return failure, text

    failure, text = worker.run(go())
    assert isinstance(failure, WorkerDead) and failure.status == 503
    assert text
    assert client.restarts >= 1



def test_worker_stops_when_the_pop_that_started_it_is_killed(tmp_path: Path) -> None:
    """The PoP (here: a parent process) is SIGKILLed; its worker must not linger."""
    import subprocess
    import sys
    import time

    script = ("import asyncio, sys\n"
              "from gpu_worker.client import WorkerClient\n"
              "async def main():\n"
              f"    c = WorkerClient.spawning({str(tmp_path / 'w.sock')!r})\n"
              "    await c.start()\n"
              "    print(c.pid, flush=True)\n"
              "    await asyncio.sleep(60)\n"
              "asyncio.run(main())\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    worker_pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    parent.stdout.close()
    for _ in range(100):
        try:
            os.kill(worker_pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(worker_pid, signal.SIGKILL)
    pytest.fail("the worker outlived the process that started it")


def test_a_socket_nobody_serves_is_said_once_while_waiting(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A PoP pointed at a worker it does not run (``[ai] socket``) says what it waits
    for, once, instead of nothing until its start times out."""
    sock = str(tmp_path / "nobody.sock")

    async def go() -> None:
        client = WorkerClient(sock)
        await client.start(wait=False)
        await asyncio.sleep(1.0)  # five tries
        await client.close()

    with caplog.at_level("WARNING", logger="edgefn.gpu_worker.client"):
        asyncio.run(go())
    said = [r.getMessage() for r in caplog.records if "nothing serves" in r.getMessage()]
    assert said == [f"model worker: nothing serves {sock} yet; waiting for it"]


def test_a_call_to_a_worker_nobody_serves_is_refused_in_seconds(tmp_path: Path) -> None:
    """With ``--ai-socket`` and nothing serving it, every model call waited the 30 s
    meant for a restart the PoP runs, which never comes here."""
    from gpu_worker.client import RECONNECT_S, WorkerDead

    async def go() -> float:
        client = WorkerClient(str(tmp_path / "nobody.sock"))
        await client.start(wait=False)
        started = time.monotonic()
        with pytest.raises(WorkerDead, match="not running"):
            await client.ready()
        took = time.monotonic() - started
        await client.close()
        return took

    took = asyncio.run(go())
    assert RECONNECT_S - 0.1 <= took < RECONNECT_S + 1, took


def test_a_connection_the_worker_closes_is_made_again(worker: Harness) -> None:
    """The worker closes a connection that sends garbage (as it did for any request
    that raised an unexpected error); while the worker lives, the client connects
    again (it waited for a restart that never came: every call failed until the
    PoP restarted)."""
    import time

    from gpu_worker.client import RECONNECT_S

    pid, connects, restarts = worker.client.pid, worker.client.connects, worker.client.restarts

    async def go() -> float:
        assert worker.client.writer is not None
        worker.client.writer.write(b"\xff\xff\xff\xff")  # a frame length past the limit
        dropped = time.monotonic()
        while worker.client.connects == connects and time.monotonic() - dropped < 5:
            await asyncio.sleep(0.01)
        text, _ = await greedy(worker.client, max_tokens=4)
        assert text
        return time.monotonic() - dropped

    took = worker.run(go())
    assert worker.client.connects == connects + 1, "it did not connect again"
    assert worker.client.pid == pid and worker.client.restarts == restarts  # the same worker
    assert took < RECONNECT_S + 2


def test_a_request_that_raises_unexpectedly_fails_alone(worker: Harness) -> None:
    """An input no check foresaw (a tool call that is a string) is that request's
    500; the worker keeps the connection (it closed it, taking every model call down)."""
    from edgefn_core.errors import WorkerError

    connects = worker.client.connects
    odd = [*HELLO, {"role": "assistant", "content": None, "tool_calls": [{"function": "x"}]}]

    async def go() -> str:
        with pytest.raises(WorkerError) as e:
            await greedy(worker.client, messages=odd, max_tokens=4)
        assert e.value.status in (400, 500)
        text, _ = await greedy(worker.client, max_tokens=4)
        return text

    assert worker.run(go())
    assert worker.client.connects == connects


@pytest.mark.parametrize("kind", ["text", "messages"])
def test_a_prompt_no_context_can_hold_is_refused_before_it_is_tokenized(
        worker: Harness, kind: str) -> None:
    """15 MB of text held the worker's loop for ~7 s, and 200 000 messages for
    minutes; both are refused at once, and the worker answers the next call."""
    import time

    from edgefn_core.errors import WorkerError

    async def go() -> float:
        args: dict[str, Any] = ({"prompt": "word " * 3_000_000} if kind == "text" else
                                {"messages": [{"role": "user", "content": "x"}] * 200_000})
        started = time.monotonic()
        with pytest.raises(WorkerError) as e:
            await (await worker.client.generate(CHAT, max_tokens=4, **args)).collect()
        took = time.monotonic() - started
        assert (e.value.code, e.value.status) == ("context_length_exceeded", 400)
        text, _ = await greedy(worker.client, max_tokens=2)
        assert text
        return took

    assert worker.run(go()) < 3  # most of it the 15 MB on the socket
