"""`max_wait` and the choices of one request (OpenAI's ``n``): each choice is its
own `Generate` (the same request id, client and prompt) and prefills the whole
prompt, so with a long prompt they may fit in the KV cache only one after
another. Once one of them is admitted the request got its turn: the others wait
for room their siblings hold, and are never turned away as overloaded (an idle
PoP answered n=3 with a 5k-token prompt 503 after 60 s). No model: the policy
(`gpu_worker.engines.batching`) and the driver over a fake model."""

from __future__ import annotations

import asyncio

from gpu_worker.engines.batching import Scheduler, Seq
from gpu_worker.protocol import Generate
from tests.gpu_worker.test_llama_driver import Rig


def choice(rid: int, request_id: str | None = "req-1", prompt_len: int = 60,
           client: str | None = "alice", first: int = 100, max_tokens: int = 4) -> Seq:
    req = Generate(rid, "m", prompt="unused", max_tokens=max_tokens, request_id=request_id,
                   client=client)
    return Seq(req, None, list(range(first, first + prompt_len)))  # type: ignore[arg-type]


def run_to_end(sched: Scheduler, s: Seq) -> None:
    """Feed running `s` its prompt and tokens until it ends, then release it."""
    while True:
        step = sched.plan([s])
        for seq, _ in step.outputs:
            if seq.advance(1000 + seq.generated, b"x")[1] is not None:
                sched.release(seq)
                return


def test_the_later_choices_of_an_admitted_request_are_never_overdue() -> None:
    sched = Scheduler(slots=4, kv_tokens=100, max_wait=1.0)
    first, second, third = choice(1), choice(2), choice(3)
    sched.add([first, second, third])
    assert sched.admit() == [first]  # 60 + 60 + 16 > 100: one at a time
    late = first.submitted + 60.0
    assert sched.overdue(late) == [] and sched.next_wake() is None
    run_to_end(sched, first)
    # between one choice's end and the next one's admission, none of them runs
    assert not sched.running and sched.overdue(late) == []
    assert sched.admit() == [second]
    assert sched.overdue(late + 60.0) == [] and [s.rid for s in sched.waiting] == [3]
    run_to_end(sched, second)
    assert sched.admit() == [third]


def test_a_choice_that_arrives_after_its_sibling_was_admitted_is_not_overdue() -> None:
    """The worker may take the choices in separate mailbox drains."""
    sched = Scheduler(slots=4, kv_tokens=100, max_wait=1.0)
    first = choice(1)
    sched.add([first])
    assert sched.admit() == [first]
    second = choice(2)
    sched.add([second])
    assert sched.admit() == []
    assert sched.overdue(second.submitted + 60.0) == [] and sched.next_wake() is None


def test_a_request_none_of_whose_choices_was_admitted_is_overdue_whole() -> None:
    """Another client's stream holds the only slot: the model is busy for this
    request, and each of its choices is told so at `max_wait`."""
    sched = Scheduler(slots=1, kv_tokens=1000, max_wait=1.0)
    holder = choice(1, request_id="other", client="bob", prompt_len=10, max_tokens=500)
    sched.add([holder])
    assert sched.admit() == [holder]
    choices = [choice(rid) for rid in (2, 3, 4)]
    sched.add(choices)
    assert sched.admit() == []
    assert sched.next_wake() == choices[0].submitted + 1.0
    assert sched.overdue(choices[-1].submitted + 1.0) == choices
    assert not sched.waiting


def test_only_the_same_request_id_client_and_prompt_make_siblings() -> None:
    """A request id a client reuses (or a warm-up's), another client's request
    with the same id, or a request without one keeps its own clock."""
    sched = Scheduler(slots=4, kv_tokens=100, max_wait=1.0)
    first = choice(1)
    sched.add([first])
    assert sched.admit() == [first]
    others = [choice(2, prompt_len=59),  # the same id, another prompt
              choice(3, first=200),  # the same length, other tokens
              choice(4, client="bob"),  # the same id and prompt, another client
              choice(5, request_id=None), choice(6, request_id="req-2")]
    sched.add(others)
    assert sched.admit() == []
    assert sched.next_wake() == others[0].submitted + 1.0
    assert sched.overdue(others[-1].submitted + 1.0) == others


def test_a_preempted_choice_still_lets_its_siblings_wait() -> None:
    """Preempted, the admitted choice waits at the queue's front: its siblings
    behind it were not turned away meanwhile."""
    sched = Scheduler(slots=4, kv_tokens=100, max_wait=1.0)
    first = choice(1, prompt_len=40, max_tokens=500)
    sched.add([first])
    assert sched.admit() == [first]
    sched._preempt(first)  # (as `make_room` or `rebalance` do)
    second = choice(2, prompt_len=40, max_tokens=500)
    sched.add([second])
    assert sched.overdue(second.submitted + 60.0) == [] and sched.next_wake() is None


def test_the_driver_runs_the_choices_one_after_another_past_max_wait() -> None:
    """Through the scheduler thread over a fake model: three choices whose prompts
    fit in the KV cache only one at a time, each running longer than `max_wait`."""
    async def go() -> None:
        r = Rig(slots=4, kv_tokens=100, max_wait=0.2)
        r.lm.decode_sleep = 0.03  # ~0.3 s a choice
        sinks = [r.submit(rid, first=10, prompt_len=60, max_tokens=10, request_id="req-1",
                          client="alice", seed=rid) for rid in (1, 2, 3)]
        ends = [await s.result() for s in sinks]
        assert ends == [("done", "length", 60, 10)] * 3, ends
        assert len(r.lm.faults) == 0
        r.close()

    asyncio.run(go())


def test_overloaded_says_the_kv_cache_held_a_request_back_where_a_slot_was_free() -> None:
    """Slots were free: "no batch slot came free" misled; the cache was the limit."""
    async def go() -> None:
        r = Rig(slots=4, kv_tokens=100, max_wait=0.2)
        holder = r.submit(1, first=10, prompt_len=60, max_tokens=50, window=1,
                          client="bob")  # reads nothing: it holds its cells
        waiting = r.submit(2, first=20, prompt_len=50, max_tokens=1, client="alice")
        end = await waiting.result()
        assert end[:2] == ("error", "overloaded") and end[3] == 503, end
        assert end[2] == ("the model is busy: no room in its KV cache came free within 0.2 s "
                          "for a 50-token prompt (60 of its 100 tokens held by 1 running, 0 "
                          "requests still waiting); retry later"), end[2]
        r.driver.mailbox.post_cancel(1)
        assert (await holder.result())[:2] == ("done", "cancelled")
        r.close()

    asyncio.run(go())
