"""The llama.cpp scheduler thread (`gpu_worker.engines.llama_driver`) over a fake
model: no llama.cpp and no socket, a real thread and event loop."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from edgefn_core.errors import EngineError
from gpu_worker.engines.batching import Item, Scheduler, Seq, Shaping
from gpu_worker.engines.llama_driver import Driver, LoadAdapter, Mailbox, UnloadAdapter, covering
from gpu_worker.metrics import Metrics
from gpu_worker.protocol import Generate, TokenLogprob
from gpu_worker.stops import StopText

EOG = 0


class FakeSampler:
    """A seeded draw per token, as llama.cpp's dist sampler: its state moves on."""

    def __init__(self, temperature: float, seed: int) -> None:
        self.rng = random.Random(seed) if temperature > 0 else None

    def draw(self) -> int:
        return self.rng.randrange(5) if self.rng is not None else 0


class FakeModel:
    """Samples ``prompt[0] + n`` for a sequence's n-th output token; a prompt of
    `EOG` tokens samples `EOG`, which ends a generation; token t's text is
    ``"<t>"``. Records each decode as (adapter, items).

    Keeps KV cells per slot, `kv_tokens` at most: a token must come at its slot's
    next position, and a slot is cleared by `forget` (`faults` lists each breach;
    its decode fails). With `history`, a token is sampled from every token in its
    slot's cells up to its row (and the sampler's seeded draw), as a model does."""

    def __init__(self, sched: Scheduler, fail_decode: int = 0, per_seq: bool = False,
                 history: bool = False) -> None:
        self.sched = sched
        self.history = history
        self.kv: dict[int, list[int]] = {}  # slot -> the tokens in its cells, by position
        self.faults: list[str] = []
        self.per_seq = per_seq
        self.selected: dict[int, tuple[str | None, float]] = {}  # slot -> (adapter, scale)
        self.fail_decode = fail_decode
        self.decodes: list[tuple[str | None, list[Item]]] = []
        self.adapter: str | None = None
        self.forgotten: list[int] = []
        self.made: list[Any] = []
        self.freed: list[Any] = []
        self.adapters: list[str] = []
        self.unloaded: list[tuple[str, list[int]]] = []  # (adapter, requests running then)
        self.decode_sleep = 0.0

    def sampler(self, temperature: float, top_p: float, top_k: int, seed: int,
                shaping: Any = None) -> Any:
        if shaping is not None and shaping.grammar == "refused":
            raise EngineError("invalid_request", 400, "llama.cpp refused the grammar")
        self.made.append(FakeSampler(temperature, seed))
        return self.made[-1]

    def free_sampler(self, sampler: Any) -> None:
        self.freed.append(sampler)

    def use_adapter(self, name: str | None, scale: float) -> None:
        self.adapter = name

    def use_adapters(self, seqs: list[tuple[int, str | None, float]]) -> None:
        assert self.per_seq
        self.selected = {slot: (name, scale) for slot, name, scale in seqs}

    def decode(self, items: list[Item]) -> int:
        time.sleep(self.decode_sleep)  # a step wedged in llama.cpp (seconds, minutes)
        if self.per_seq:  # every token's sequence had its adapter chosen for this call
            assert {slot for _, _, slot, _ in items} <= set(self.selected)
        self.decodes.append((self.adapter, list(items)))
        for tok, pos, slot, _ in items:
            cells = self.kv.setdefault(slot, [])
            if pos != len(cells):
                self.faults.append(f"slot {slot} fed position {pos} after {len(cells)} cells")
                return -1
            cells.append(tok)
        if sum(map(len, self.kv.values())) > self.sched.kv_tokens:
            self.faults.append("the KV cache overflowed")
            return 1
        return self.fail_decode

    def sample(self, sampler: Any, index: int) -> int:
        _, pos, slot, _ = self.decodes[-1][1][index]
        if self.history:
            cells = self.kv[slot][:pos + 1]
            return 10 + sum((i + 1) * t for i, t in enumerate(cells)) % 97 + sampler.draw()

        s = next(s for s in self.sched.running.values() if s.slot == slot)
        return EOG if s.prompt[0] == EOG else s.prompt[0] + s.generated + 1

    def is_eog(self, token: int) -> bool:
        return token == EOG

    def piece_bytes(self, token: int) -> bytes:
        return f"<{token}>".encode()

    def forget(self, seq: int) -> None:
        self.forgotten.append(seq)
        self.kv.pop(seq, None)

    def load_adapter(self, name: str, path: str) -> None:
        if not path.endswith(".gguf"):
            raise EngineError("invalid_request", 400, f"{path} is not a LoRA adapter")
        self.adapters.append(name)

    def unload_adapter(self, name: str) -> None:
        self.unloaded.append((name, sorted(s.rid for s in self.sched.running.values())))


class Sink:
    """Records output; a second terminal call fails the test."""

    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.end: tuple[Any, ...] | None = None
        self.ended = asyncio.Event()

    def chunk(self, text: str, tokens: int) -> None:
        assert self.end is None and tokens == 1
        self.chunks.append(text)

    def done(self, reason: str, prompt_tokens: int, completion_tokens: int) -> None:
        self._end(("done", reason, prompt_tokens, completion_tokens))

    def error(self, code: str, message: str, status: int) -> None:
        self._end(("error", code, message, status))

    def _end(self, what: tuple[Any, ...]) -> None:
        assert self.end is None, f"second terminal call {what}"
        self.end = what
        self.ended.set()

    async def result(self) -> tuple[Any, ...]:
        await asyncio.wait_for(self.ended.wait(), 2)
        assert self.end is not None
        return self.end


class Rig:
    """A driver over a fake model, started on the running event loop."""

    def __init__(self, slots: int = 4, kv_tokens: int = 1000, fail_decode: int = 0,
                 per_seq: bool = False, max_wait: float | None = None,
                 step_limit: float = 60.0, history: bool = False,
                 pause_grace: float = 1.0) -> None:
        self.sched = Scheduler(slots, kv_tokens, max_wait=max_wait, pause_grace=pause_grace)
        self.lm = FakeModel(self.sched, fail_decode, per_seq, history)
        self.wedged: list[float] = []
        self.driver = Driver(self.lm, self.sched, Metrics(), "test-llama", step_limit,
                             self.wedged.append)
        self.driver.start()

    def submit(self, rid: int, first: int, prompt_len: int = 3, adapter: str | None = None,
               shaping: Shaping | None = None, **params: Any) -> Sink:
        """Queue a generation whose prompt is `prompt_len` tokens `first`."""
        sink = Sink()
        req = Generate(rid, "m", prompt="unused", **params)
        self.driver.mailbox.post_seq(Seq(req, sink, [first] * prompt_len, adapter,
                                         shaping=shaping))
        return sink

    def close(self) -> None:
        self.driver.stop(2)
        assert not self.driver.thread.is_alive()


# -- tests -----------------------------------------------------------------------------------

def test_a_sampler_the_model_refuses_fails_only_its_request() -> None:
    async def go() -> None:
        r = Rig()
        bad = r.submit(1, first=10, shaping=Shaping("refused", {}, 0, 0, 3), max_tokens=3)
        good = r.submit(2, first=10, max_tokens=2)
        assert await bad.result() == ("error", "invalid_request",
                                      "llama.cpp refused the grammar", 400)
        assert await good.result() == ("done", "length", 3, 2)
        assert r.sched.in_use == 0 and not r.sched.running and len(r.sched.free_ids) == 8
        assert len({item[2] for _, items in r.lm.decodes for item in items}) == 1  # good's
        r.close()

    asyncio.run(go())


def test_sequences_stream_until_max_tokens_or_end_of_generation() -> None:
    async def go() -> None:
        r = Rig()
        a = r.submit(1, first=10, max_tokens=3)
        b = r.submit(2, first=EOG)
        assert await a.result() == ("done", "length", 3, 3)
        assert a.chunks == ["<11>", "<12>", "<13>"]
        assert await b.result() == ("done", "stop", 3, 1)
        assert b.chunks == []
        assert len(r.lm.forgotten) == 2
        assert len(r.lm.made) == len(r.lm.freed) == 2  # each sampler made is freed once
        assert {id(x) for x in r.lm.freed} == {id(x) for x in r.lm.made}
        assert r.sched.in_use == 0 and not r.sched.running
        r.close()

    asyncio.run(go())


def test_a_step_feeds_the_sampled_token_back_at_the_next_position() -> None:
    async def go() -> None:
        r = Rig()
        sink = r.submit(1, first=10, prompt_len=2, max_tokens=3)
        await sink.result()
        r.close()
        items = [items for _, items in r.lm.decodes]
        slot = items[0][0][2]
        assert items == [[(10, 0, slot, False), (10, 1, slot, True)],
                         [(11, 2, slot, True)], [(12, 3, slot, True)]]

    asyncio.run(go())


def test_a_stream_out_of_credit_stops_until_credit_arrives() -> None:
    async def go() -> None:
        r = Rig()
        sink = r.submit(1, first=10, max_tokens=5, window=2)
        await asyncio.sleep(0.1)
        assert sink.chunks == ["<11>", "<12>"] and sink.end is None
        steps = len(r.lm.decodes)
        await asyncio.sleep(0.05)
        assert len(r.lm.decodes) == steps  # no decode while it has no credit
        r.driver.mailbox.post_credit(1, 10)
        assert await sink.result() == ("done", "length", 3, 5)
        r.close()

    asyncio.run(go())


def test_cancel_ends_a_running_or_waiting_sequence_and_frees_its_slot() -> None:
    async def go() -> None:
        r = Rig(slots=1)
        a = r.submit(1, first=10, max_tokens=50, window=1)
        b = r.submit(2, first=20, max_tokens=1)
        c = r.submit(3, first=30, max_tokens=1)
        await asyncio.sleep(0.05)
        assert a.chunks == ["<11>"] and b.end is None  # a holds the only slot
        r.driver.mailbox.post_cancel(3)
        assert await c.result() == ("done", "cancelled", 3, 0)
        r.driver.mailbox.post_cancel(1)
        assert await a.result() == ("done", "cancelled", 3, 1)
        assert await b.result() == ("done", "length", 3, 1)
        assert b.chunks == ["<21>"]
        r.close()

    asyncio.run(go())


def test_a_request_that_waits_past_max_wait_for_a_slot_gets_overloaded() -> None:
    """The only slot is held by a stream whose client reads nothing (the thread
    sleeps: no step to run); the request behind it is told at `max_wait`, not at
    the PoP's timeout minutes later, and a later one keeps its own clock."""
    async def go() -> None:
        r = Rig(slots=1, max_wait=0.3)
        a = r.submit(1, first=10, max_tokens=50, window=1)
        b = r.submit(2, first=20, max_tokens=1)
        started = asyncio.get_running_loop().time()
        await asyncio.sleep(0.15)
        c = r.submit(3, first=30, max_tokens=1)
        end = await b.result()
        waited = asyncio.get_running_loop().time() - started
        assert end[:2] == ("error", "overloaded") and end[3] == 503, end
        assert "within 0.3 s (1 requests still waiting, 1 running)" in end[2]
        assert 0.3 <= waited < 0.3 + 0.1, waited
        assert c.end is None and a.end is None  # c has waited 0.15 s of its 0.3
        c_end = await c.result()
        assert c_end[:2] == ("error", "overloaded") and "(0 requests still waiting" in c_end[2]
        assert asyncio.get_running_loop().time() - started >= 0.15 + 0.3
        assert a.chunks == ["<11>"] and r.sched.running and not r.sched.waiting
        counted = r.driver.metrics.snapshot()
        assert (counted["requests_total"], counted["errors_total"]) == (3, 2)  # each once
        r.driver.mailbox.post_cancel(1)
        assert (await a.result())[:2] == ("done", "cancelled")
        r.close()

    asyncio.run(go())


def test_a_step_that_runs_past_step_limit_is_reported_once_and_a_normal_one_is_not() -> None:
    """A step wedged inside llama.cpp cannot be stopped; the worker's loop still
    answers pings: the watchdog is what sees it (in the worker: exit 70, restart)."""
    async def go() -> None:
        r = Rig(step_limit=0.2)
        sink = r.submit(1, first=10, max_tokens=3)
        assert (await sink.result())[:2] == ("done", "length")
        await asyncio.sleep(0.3)
        assert r.wedged == []  # fast steps, then idle: nothing to report
        r.lm.decode_sleep = 0.6
        started = time.perf_counter()
        r.submit(2, first=10, max_tokens=1)
        while not r.wedged and time.perf_counter() - started < 2:
            await asyncio.sleep(0.01)
        assert len(r.wedged) == 1 and 0.2 <= r.wedged[0] < 0.2 + 0.1, r.wedged
        assert time.perf_counter() - started < 0.2 + 0.1
        await asyncio.sleep(0.7)
        assert len(r.wedged) == 1  # once
        r.close()

    asyncio.run(go())


def test_without_max_wait_a_request_waits_for_its_slot() -> None:
    async def go() -> None:
        r = Rig(slots=1)
        a = r.submit(1, first=10, max_tokens=50, window=1)
        b = r.submit(2, first=20, max_tokens=1)
        await asyncio.sleep(0.4)
        assert b.end is None
        r.driver.mailbox.post_cancel(1)
        assert await b.result() == ("done", "length", 3, 1)
        assert (await a.result())[:2] == ("done", "cancelled")
        r.close()

    asyncio.run(go())


def test_adapter_groups_decode_in_separate_calls() -> None:
    async def go() -> None:
        r = Rig()
        sinks = [r.submit(1, first=10, max_tokens=2),
                 r.submit(2, first=20, max_tokens=2, adapter="x"),
                 r.submit(3, first=30, max_tokens=2)]
        for s in sinks:
            await s.result()
        r.close()
        assert {adapter for adapter, _ in r.lm.decodes} == {None, "x"}
        for adapter, items in r.lm.decodes:
            firsts = {tok // 10 for tok, *_ in items}
            assert firsts <= ({2} if adapter == "x" else {1, 3})

    asyncio.run(go())


def test_a_prompt_on_another_adapter_is_chunked_while_a_stream_runs() -> None:
    """One call per adapter (a stock llama.cpp): a stream on the base model waited for
    the whole 512-token call of a long prompt on adapter x each iteration; that prompt
    is fed `prefill_chunk` tokens a call while the stream runs."""
    async def go() -> None:
        r = Rig(kv_tokens=5000)
        r.lm.decode_sleep = 0.001
        stream = r.submit(1, first=10, max_tokens=300, window=1000)
        while not stream.chunks:
            await asyncio.sleep(0.001)
        long = r.submit(2, first=20, prompt_len=1000, max_tokens=1, adapter="x")
        assert (await long.result())[:2] == ("done", "length")
        assert stream.end is None  # it ran beside the whole prefill
        await stream.result()
        r.close()
        sizes = [len(items) for adapter, items in r.lm.decodes if adapter == "x"]
        assert sum(sizes) == 1000 and max(sizes) == r.sched.prefill_chunk, sizes

    asyncio.run(go())


def test_adapters_chosen_per_sequence_share_one_decode_call() -> None:
    async def go() -> None:
        r = Rig(per_seq=True)
        sinks = [r.submit(1, first=10, max_tokens=3),
                 r.submit(2, first=20, max_tokens=3, adapter="x"),
                 r.submit(3, first=30, max_tokens=3, adapter="y")]
        firsts = [await s.result() for s in sinks]
        r.close()
        assert firsts == [("done", "length", 3, 3)] * 3
        assert sinks[1].chunks == ["<21>", "<22>", "<23>"]
        assert r.lm.adapter is None  # the context-wide adapter was never set
        # all three in each call (they were admitted together), each with its adapter
        assert [sorted({tok // 10 for tok, *_ in items}) for _, items in r.lm.decodes] == [
            [1, 2, 3]] * 3
        last = r.lm.decodes[-1][1]  # which request each token is -> the adapter its slot had
        assert {tok // 10: r.lm.selected[slot] for tok, _, slot, _ in last} == {
            1: (None, 1.0), 2: ("x", 1.0), 3: ("y", 1.0)}

    asyncio.run(go())


def test_a_failed_decode_fails_the_group_with_an_internal_error() -> None:
    async def go() -> None:
        r = Rig(fail_decode=-3)
        sink = r.submit(1, first=10)
        code, message, status = (await sink.result())[1:]
        assert (code, status) == ("internal", 500) and "status -3" in message
        assert not r.sched.running and r.sched.in_use == 0
        r.close()

    asyncio.run(go())


def test_adapter_loads_resolve_on_the_loop() -> None:
    async def go() -> None:
        r = Rig()
        loop = asyncio.get_running_loop()
        ok, bad = loop.create_future(), loop.create_future()
        r.driver.mailbox.post_command(LoadAdapter("a", "/tmp/a.gguf", ok))
        r.driver.mailbox.post_command(LoadAdapter("b", "/tmp/b.txt", bad))
        await asyncio.wait_for(ok, 2)
        with pytest.raises(EngineError, match="not a LoRA adapter"):
            await asyncio.wait_for(bad, 2)
        assert r.lm.adapters == ["a"]
        r.close()

    asyncio.run(go())


def test_a_removed_adapter_is_unloaded_once_no_sequence_uses_it() -> None:
    async def go() -> None:
        r = Rig(per_seq=True)
        on_x = r.submit(1, first=10, max_tokens=2, adapter="x", stream=True, window=1)
        other = r.submit(2, first=20, max_tokens=6, adapter="y")
        while not on_x.chunks:  # request 1 runs on x, then waits for credit
            await asyncio.sleep(0.01)
        r.driver.mailbox.post_command(UnloadAdapter("x"))
        await other.result()
        assert r.lm.unloaded == []  # request 1 still runs on it
        r.driver.mailbox.post_credit(1, 5)
        await on_x.result()
        r.driver.mailbox.post_command(UnloadAdapter("z"))  # nothing left: at once
        for _ in range(100):
            if len(r.lm.unloaded) == 2:
                break
            await asyncio.sleep(0.01)
        r.close()
        assert r.lm.unloaded == [("x", []), ("z", [])]

    asyncio.run(go())


def test_mailbox_take_waits_for_mail_or_work_and_returns_none_once_stopped() -> None:
    box = Mailbox()
    box.post_credit(1, 2)
    box.post_credit(1, 3)
    box.post_cancel(4)
    mail = box.take(lambda: False)
    assert mail is not None and mail.credits == {1: 5} and mail.cancels == {4}
    empty = box.take(lambda: True)  # busy: it does not wait for mail
    assert empty is not None and empty == ([], set(), {}, [])
    box.post_stop()
    assert box.take(lambda: False) is None


def test_logprobs_sent_with_a_stopped_text_are_only_its_own_tokens() -> None:
    """Stop "abc": "a", "b" held (a prefix of it), then a token "abc": the text sent
    is "ab"; the stop string's token was listed after it."""
    stop = StopText(["abc"])
    entries = [TokenLogprob(t, -0.1) for t in (b"a", b"b", b"abc")]
    texts = [stop.feed(e.token) for e in entries]
    assert texts == ["", "", "ab"] and stop.stopped
    assert covering(entries, "ab") == entries[:2]
    assert covering(entries, "") == []
    straddle = [TokenLogprob(b"xab", -0.1), TokenLogprob(b"c", -0.1)]
    assert covering(straddle, "x") == straddle[:1]  # its text began in that token


# -- preemption ------------------------------------------------------------------------------

async def streamed(r: Rig, **params: Any) -> list[tuple[list[str], tuple[Any, ...]]]:
    """Two generations of 40 tokens on `r`, read as they come: each one's chunks and end."""
    sinks = [r.submit(1, first=10, max_tokens=40, **params),
             r.submit(2, first=20, max_tokens=40, **params)]
    return [(s.chunks, await s.result()) for s in sinks]


@pytest.mark.parametrize("params", [{"temperature": 0.0}, {"temperature": 0.8, "seed": 7}],
                         ids=["greedy", "seeded"])
def test_a_preempted_sequence_streams_what_an_uninterrupted_one_does(
        params: dict[str, Any]) -> None:
    """60 KV cells hold both prompts (3 each) but not both outputs: the newer one is
    preempted at 27 tokens and recomputed once the older one ends. Each token is
    drawn from all the tokens in its cells and a seeded sampler that moves on, so
    a wrong re-fed prompt or a sampler made again would change the text."""
    async def go() -> None:
        roomy, tight = Rig(slots=2, history=True), Rig(slots=2, kv_tokens=60, history=True)
        alone, preempted = await streamed(roomy, **params), await streamed(tight, **params)
        roomy.close()
        tight.close()
        assert preempted == alone
        assert [end for _, end in alone] == [("done", "length", 3, 40)] * 2
        assert len(set(alone[1][0])) > 10  # a varied text, not one token over and over
        assert [(r.driver.metrics.snapshot()["preemptions_total"],
                 r.driver.metrics.snapshot()["recomputes_total"]) for r in (roomy, tight)
                ] == [(0, 0), (1, 1)]
        assert tight.lm.faults == [] and len(tight.lm.made) == 2  # the sampler was kept
        assert len(tight.lm.freed) == 2

    asyncio.run(go())


def test_a_slow_reader_yields_its_slot_and_its_stream_goes_on_unchanged() -> None:
    """The only slot is held by a stream whose reader stopped: after the pause grace
    it gives the slot to the request behind it, waits (however long: it is not
    turned away at max_wait, it has streamed already) for its reader, then goes
    on with the text an undisturbed stream has."""
    async def go() -> None:
        r = Rig(slots=1, max_wait=0.3, pause_grace=0.05, history=True)
        slow = r.submit(1, first=10, max_tokens=6, window=2, temperature=0.0)
        while len(slow.chunks) < 2:
            await asyncio.sleep(0.01)
        started = time.perf_counter()
        other = r.submit(2, first=20, max_tokens=3)
        assert (await other.result())[:2] == ("done", "length")
        assert time.perf_counter() - started < 0.05 + 0.1
        await asyncio.sleep(0.4)  # past max_wait
        assert slow.end is None and list(r.sched.preempted) == [1]
        r.driver.mailbox.post_credit(1, 10)
        assert await slow.result() == ("done", "length", 3, 6)
        r.close()
        fast = Rig(slots=1, history=True)
        alone = fast.submit(1, first=10, max_tokens=6, temperature=0.0)
        await alone.result()
        fast.close()
        assert slow.chunks == alone.chunks and r.lm.faults == []
        figures = r.driver.metrics.snapshot()  # it kept its cells: other needed a slot only
        assert (figures["preemptions_total"], figures["recomputes_total"]) == (1, 0)

    asyncio.run(go())


def test_a_preempted_sequence_cancelled_while_it_waits_ends_with_its_tokens() -> None:
    async def go() -> None:
        r = Rig(slots=1, pause_grace=0.05)
        slow = r.submit(1, first=10, max_tokens=50, window=2)
        other = r.submit(2, first=20, max_tokens=1)
        await other.result()
        r.driver.mailbox.post_cancel(1)
        assert await slow.result() == ("done", "cancelled", 3, 2)
        assert slow.chunks == ["<11>", "<12>"]
        assert {id(x) for x in r.lm.freed} == {id(x) for x in r.lm.made}  # its sampler too
        r.close()
        assert r.lm.kv == {}  # and the cells it kept, parked, while other ran
        assert r.driver.metrics.snapshot()["recomputes_total"] == 0  # dropped, not recomputed

    asyncio.run(go())
