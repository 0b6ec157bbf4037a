"""The llama.cpp engine's batching policy (`gpu_worker.engines.batching`) without a
model, a thread or a socket: admission, the KV budget, chunked prefill, credit."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_worker.engines.batching import STEP_TOKENS, Scheduler, Seq
from gpu_worker.protocol import Generate


def seq(rid: int, prompt_len: int = 4, max_tokens: int = 4, window: int = 8,
        adapter: str | None = None, stop: list[str] | None = None) -> Seq:
    req = Generate(rid, "m", prompt="unused", max_tokens=max_tokens, window=window,
                   stop=stop or [])
    return Seq(req, None, list(range(100, 100 + prompt_len)), adapter)  # type: ignore[arg-type]


def running(sched: Scheduler) -> list[int]:
    return list(sched.running)


def waiting(sched: Scheduler) -> list[int]:
    return [s.rid for s in sched.waiting]


def prefill_all(sched: Scheduler) -> None:
    """Plan steps until every running sequence is past its prompt."""
    while not all(s.prefilled for s in sched.running.values()):
        for group in sched.groups():
            sched.plan(group)


# -- admission -------------------------------------------------------------------------------

def test_admission_is_fifo_into_free_slots() -> None:
    sched = Scheduler(slots=2, kv_tokens=1000)
    sched.add([seq(1), seq(2), seq(3)])
    admitted = sched.admit()
    assert [s.rid for s in admitted] == [1, 2]
    assert running(sched) == [1, 2] and waiting(sched) == [3]
    assert sorted(s.slot for s in admitted) == [0, 1]
    assert sched.admit() == []  # no slot free: nothing moves
    sched.release(sched.running[1])
    assert [s.rid for s in sched.admit()] == [3]
    assert sched.running[3].slot == admitted[0].slot  # the freed slot is reused


def test_a_request_over_the_kv_budget_waits_and_blocks_those_behind_it() -> None:
    sched = Scheduler(slots=4, kv_tokens=100)
    sched.add([seq(1, prompt_len=30, max_tokens=30),   # reserves 60
               seq(2, prompt_len=30, max_tokens=20),   # 50: 110 > 100, refused
               seq(3, prompt_len=1, max_tokens=1)])    # would fit, but must not overtake
    assert [s.rid for s in sched.admit()] == [1]
    assert sched.reserved == 60
    assert waiting(sched) == [2, 3]
    assert sched.admit() == []


def test_a_request_that_exactly_fills_the_budget_is_admitted() -> None:
    sched = Scheduler(slots=4, kv_tokens=100)
    sched.add([seq(1, prompt_len=30, max_tokens=30), seq(2, prompt_len=20, max_tokens=20)])
    assert [s.rid for s in sched.admit()] == [1, 2]
    assert sched.reserved == 100


def test_a_lone_request_is_admitted_whatever_its_size() -> None:
    sched = Scheduler(slots=2, kv_tokens=10)
    sched.add([seq(1, prompt_len=50, max_tokens=50), seq(2, prompt_len=1, max_tokens=1)])
    assert [s.rid for s in sched.admit()] == [1]
    assert waiting(sched) == [2]


def test_a_finished_sequence_frees_its_budget_and_slot() -> None:
    sched = Scheduler(slots=2, kv_tokens=100)
    first, second = seq(1, prompt_len=40, max_tokens=40), seq(2, prompt_len=30, max_tokens=30)
    sched.add([first, second])
    assert [s.rid for s in sched.admit()] == [1]
    sched.release(first)
    assert sched.reserved == 0 and sorted(sched.free_slots) == [0, 1]
    assert running(sched) == []
    assert [s.rid for s in sched.admit()] == [2]
    assert sched.reserved == 60


def test_release_of_a_sequence_not_running_raises() -> None:
    sched = Scheduler(slots=1, kv_tokens=100)
    with pytest.raises(KeyError):
        sched.release(seq(1))


def test_unqueue_takes_only_a_waiting_sequence() -> None:
    sched = Scheduler(slots=1, kv_tokens=100)
    sched.add([seq(1), seq(2), seq(3)])
    sched.admit()
    assert sched.unqueue(1) is None  # running, not waiting
    removed = sched.unqueue(2)
    assert removed is not None and removed.rid == 2
    assert waiting(sched) == [3] and sched.unqueue(2) is None


# -- credit ----------------------------------------------------------------------------------

def test_sequences_without_credit_sit_out_the_step() -> None:
    sched = Scheduler(slots=3, kv_tokens=1000)
    sched.add([seq(1), seq(2), seq(3)])
    sched.admit()
    sched.running[2].credit = 0
    assert [[s.rid for s in g] for g in sched.groups()] == [[1, 3]]
    sched.running[1].credit = sched.running[3].credit = 0
    assert sched.groups() == []
    assert not sched.has_work()
    sched.credit(2, 1)
    sched.credit(99, 5)  # unknown ids are ignored
    assert [[s.rid for s in g] for g in sched.groups()] == [[2]]
    assert sched.has_work()


def test_credit_reaches_only_running_sequences() -> None:
    sched = Scheduler(slots=1, kv_tokens=1000)
    sched.add([seq(1, window=1), seq(2, window=1)])
    sched.admit()
    sched.credit(1, 3)
    sched.credit(2, 3)
    assert sched.running[1].credit == 4 and sched.waiting[0].credit == 1


def test_has_work_when_something_waits_for_a_free_slot() -> None:
    sched = Scheduler(slots=1, kv_tokens=1000)
    assert not sched.has_work()
    sched.add([seq(1, window=0), seq(2)])
    assert sched.has_work()  # a waiting sequence and a free slot
    sched.admit()
    assert not sched.has_work()  # no slot for 2, and 1 has no credit


def test_groups_split_by_adapter_in_running_order() -> None:
    sched = Scheduler(slots=4, kv_tokens=1000)
    sched.add([seq(1, adapter="a"), seq(2), seq(3, adapter="a"), seq(4, adapter="b")])
    sched.admit()
    assert [[s.rid for s in g] for g in sched.groups()] == [[1, 3], [2], [4]]
    assert [[s.rid for s in g] for g in sched.groups(per_seq=True)] == [[1, 2, 3, 4]]


# -- steps -----------------------------------------------------------------------------------

def test_a_long_prompt_is_fed_in_chunks_of_the_step_budget() -> None:
    sched = Scheduler(slots=1, kv_tokens=10_000)
    s = seq(1, prompt_len=2 * STEP_TOKENS + 100)
    sched.add([s])
    sched.admit()
    sizes, sampled = [], []
    while not s.prefilled:
        step = sched.plan([s])
        sizes.append(len(step.items))
        sampled.append([row for _, row in step.outputs])
    assert sizes == [STEP_TOKENS, STEP_TOKENS, 100]
    assert sampled == [[], [], [99]]  # only the prompt's last token is sampled
    assert s.pos == s.fed == len(s.prompt)


def test_prefill_items_carry_tokens_positions_and_slot() -> None:
    sched = Scheduler(slots=2, kv_tokens=1000, step_tokens=3)
    s = seq(1, prompt_len=5)
    sched.add([s])
    sched.admit()
    first, second = sched.plan([s]), sched.plan([s])
    assert first.items == [(100, 0, s.slot, False), (101, 1, s.slot, False),
                           (102, 2, s.slot, False)]
    assert second.items == [(103, 3, s.slot, False), (104, 4, s.slot, True)]
    assert second.outputs == [(s, 1)]


def test_running_streams_decode_first_and_prompts_share_the_rest_of_the_budget() -> None:
    sched = Scheduler(slots=4, kv_tokens=10_000, step_tokens=10)
    a, b = seq(1, prompt_len=2), seq(2, prompt_len=2)
    sched.add([a, b])
    sched.admit()
    prefill_all(sched)
    a.last, b.last = 7, 8
    c, d = seq(3, prompt_len=6), seq(4, prompt_len=6)
    sched.add([c, d])
    sched.admit()
    step = sched.plan([a, c, b, d])
    # one token each for the streams already running, then 8 prompt tokens: 6 of c, 2 of d
    assert [(tok, pos) for tok, pos, _, _ in step.items[:2]] == [(7, 2), (8, 2)]
    assert len(step.items) == 10
    assert (c.fed, d.fed) == (6, 2)
    assert [(s.rid, row) for s, row in step.outputs] == [(1, 0), (2, 1), (3, 7)]
    step = sched.plan([a, c, b, d])
    assert (d.fed, len(step.items)) == (6, 7)  # 3 streams + d's last 4 prompt tokens


def test_a_full_step_budget_leaves_prompts_for_later() -> None:
    sched = Scheduler(slots=4, kv_tokens=10_000, step_tokens=2)
    a, b = seq(1, prompt_len=1), seq(2, prompt_len=1)
    sched.add([a, b])
    sched.admit()
    prefill_all(sched)
    c = seq(3, prompt_len=3)
    sched.add([c])
    sched.admit()
    step = sched.plan([a, b, c])
    assert c.fed == 0 and len(step.items) == 2


# -- tokens ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("pieces", "max_tokens", "stop", "expected"), [
    ([b"a", b"b", None], 10, [], [("a", None), ("b", None), ("", "stop")]),
    ([b"a", b"b", b"c"], 3, [], [("a", None), ("b", None), ("c", "length")]),
    ([b"he", b"llo", b" END", b"x"], 10, [" END"],
     [("he", None), ("llo", None), ("", "stop")]),
    ([b"ok ", b"EN", b"D"], 10, ["END"], [("ok ", None), ("", None), ("", "stop")]),
])
def test_advance_reports_text_and_finish_reason(pieces: list[bytes | None], max_tokens: int,
                                                stop: list[str], expected: list[Any]) -> None:
    s = seq(1, max_tokens=max_tokens, stop=stop)
    got = []
    for token, piece in enumerate(pieces, start=1):
        got.append(s.advance(token, piece))
        if got[-1][1] is not None:
            break
    assert got == expected
    assert s.generated == len(expected)


def test_advance_keeps_the_token_to_decode_next() -> None:
    s = seq(1)
    s.advance(41, b"x")
    assert s.last == 41


def test_no_work_while_the_queue_head_does_not_fit_and_nothing_runs_with_credit() -> None:
    """The scheduler thread must sleep, not spin, while a request waits for KV budget
    that only running sequences (paused for credit) can free."""
    sched = Scheduler(slots=4, kv_tokens=100)
    sched.add([seq(1, prompt_len=30, max_tokens=30, window=0),  # reserves 60, no credit
               seq(2, prompt_len=30, max_tokens=20)])           # 50 more does not fit
    assert [s.rid for s in sched.admit()] == [1]
    assert not sched.has_work()  # slots are free, but admit() would take nothing
    sched.credit(1, 1)
    assert sched.has_work()  # the running one may go on
    sched.release(sched.running[1])
    assert sched.has_work() and [s.rid for s in sched.admit()] == [2]
