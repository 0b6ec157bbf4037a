"""The llama.cpp engine's batching policy (`gpu_worker.engines.batching`) without a
model, a thread or a socket: admission, the KV budget, chunked prefill, credit."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.engines.batching import STEP_TOKENS, Scheduler, Seq, seq_ids_for
from gpu_worker.protocol import Generate


def seq(rid: int, prompt_len: int = 4, max_tokens: int = 4, window: int = 8,
        adapter: str | None = None, stop: list[str] | None = None,
        client: str | None = None) -> Seq:
    req = Generate(rid, "m", prompt="unused", max_tokens=max_tokens, window=window,
                   stop=stop or [], client=client)
    return Seq(req, None, list(range(100, 100 + prompt_len)), adapter)  # type: ignore[arg-type]


def running(sched: Scheduler) -> list[int]:
    return list(sched.running)


def waiting(sched: Scheduler) -> list[int]:
    return [s.rid for s in sched.waiting]


def generate(sched: Scheduler, steps: int, check: bool = True) -> list[Seq]:
    """Run `steps` steps as the driver does (preempt to make room, admit, plan,
    then a token for each sampled row: 1000 + how many it generated before);
    returns the sequences preempted. With `check`, the cells in use after each
    step fit in the KV cache (a lone sequence aside)."""
    preempted: list[Seq] = []
    for _ in range(steps):
        preempted += sched.evict_paused(0.0)
        preempted += sched.rebalance()
        sched.admit()
        preempted += sched.make_room()
        for group in sched.groups():
            step = sched.plan(group)
            for s, _ in step.outputs:
                if s.advance(1000 + s.generated, b"x")[1] is not None:
                    sched.release(s)
        if check and len(sched.running) > 1:
            assert sum(s.pos for s in sched.running.values()) <= sched.kv_tokens
    return preempted


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


def test_admission_counts_kv_use_not_max_tokens() -> None:
    """Prompts plus the headroom (16) must fit next to what runs; a huge max_tokens
    reserves nothing (it reserved the whole cache and held every other chat)."""
    sched = Scheduler(slots=4, kv_tokens=100)
    sched.add([seq(1, prompt_len=30, max_tokens=10_000),
               seq(2, prompt_len=30, max_tokens=10_000),  # 30 + 30 + 16 <= 100
               seq(3, prompt_len=30, max_tokens=1),       # 60 + 30 + 16 > 100: waits
               seq(4, prompt_len=1, max_tokens=1)])       # would fit, but must not overtake
    assert [s.rid for s in sched.admit()] == [1, 2]
    assert sched.in_use == 60
    assert waiting(sched) == [3, 4]
    assert sched.admit() == []


def test_a_prompt_that_exactly_fills_the_budget_with_its_headroom_is_admitted() -> None:
    sched = Scheduler(slots=4, kv_tokens=100)
    sched.add([seq(1, prompt_len=30), seq(2, prompt_len=54), seq(3, prompt_len=1)])
    assert [s.rid for s in sched.admit()] == [1, 2]
    assert sched.in_use == 84


def test_the_headroom_is_a_token_per_slot_at_least() -> None:
    assert Scheduler(slots=4, kv_tokens=100, headroom=2).headroom == 4
    assert Scheduler(slots=4, kv_tokens=100, headroom=20).headroom == 20


def test_kv_use_grows_as_sequences_generate() -> None:
    sched = Scheduler(slots=4, kv_tokens=100)
    sched.add([seq(1, prompt_len=40, max_tokens=100)])
    sched.admit()
    generate(sched, 11)
    assert sched.in_use == 50  # its prompt and the 10 tokens fed back since
    sched.add([seq(2, prompt_len=35)])  # 50 + 35 + 16 > 100; it fit before
    assert sched.admit() == []


def test_a_lone_request_is_admitted_whatever_its_size() -> None:
    sched = Scheduler(slots=2, kv_tokens=10)
    sched.add([seq(1, prompt_len=50, max_tokens=50), seq(2, prompt_len=1, max_tokens=1)])
    assert [s.rid for s in sched.admit()] == [1]
    assert waiting(sched) == [2]


def test_a_finished_sequence_frees_its_kv_and_slot() -> None:
    sched = Scheduler(slots=2, kv_tokens=100)
    first, second = seq(1, prompt_len=40), seq(2, prompt_len=50)
    sched.add([first, second])
    assert [s.rid for s in sched.admit()] == [1]
    sched.release(first)
    assert sched.in_use == 0 and sorted(sched.free_ids) == [0, 1, 2, 3]
    assert running(sched) == []
    assert [s.rid for s in sched.admit()] == [2]
    assert sched.in_use == 50


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


def test_the_prompt_with_the_fewest_tokens_left_is_fed_first() -> None:
    """A long prompt under way, and a short one arriving: the short one is fed whole
    in the next step (its first token sampled there), the long one gets the rest of
    the budget; it no longer waits for the long prompt's whole prefill."""
    sched = Scheduler(slots=4, kv_tokens=10_000, step_tokens=10)
    long = seq(1, prompt_len=40)
    sched.add([long])
    sched.admit()
    sched.plan([long])
    short = seq(2, prompt_len=3)
    sched.add([short])
    sched.admit()
    step = sched.plan([long, short])
    assert (short.fed, long.fed, len(step.items)) == (3, 17, 10)
    assert [(s.rid, row) for s, row in step.outputs] == [(2, 2)]
    assert [slot for _, _, slot, _ in step.items[:3]] == [short.slot] * 3


def test_a_step_that_samples_feeds_at_most_prefill_chunk_prompt_tokens() -> None:
    """Streams running beside a long prompt: each step feeds the prompt only
    `prefill_chunk` tokens, so their next token waits for a small chunk, not for the
    whole step budget of the prompt."""
    sched = Scheduler(slots=4, kv_tokens=10_000, step_tokens=20, prefill_chunk=5)
    a, b = seq(1, prompt_len=2), seq(2, prompt_len=2)
    sched.add([a, b])
    sched.admit()
    prefill_all(sched)
    long = seq(3, prompt_len=12)
    sched.add([long])
    sched.admit()
    sizes = []
    while not long.prefilled:
        sizes.append(len(sched.plan([a, b, long]).items))
    assert sizes == [2 + 5, 2 + 5, 2 + 2]
    assert long.fed == 12


def test_a_short_prompt_and_a_long_one_share_prefill_chunk() -> None:
    """A short prompt whose first token the step samples: the long one under way gets
    what is left of `prefill_chunk`, not the rest of the step budget."""
    sched = Scheduler(slots=4, kv_tokens=10_000, step_tokens=20, prefill_chunk=6)
    long = seq(1, prompt_len=60)
    sched.add([long])
    sched.admit()
    assert len(sched.plan([long]).items) == 20  # alone: the whole budget
    short = seq(2, prompt_len=4)
    sched.add([short])
    sched.admit()
    step = sched.plan([long, short])
    assert (short.fed, long.fed, len(step.items)) == (4, 22, 6)
    assert [(s.rid, row) for s, row in step.outputs] == [(2, 3)]
    step = sched.plan([long, short])  # short now decodes: the long prompt gets the chunk
    assert (long.fed, len(step.items)) == (28, 1 + 6)


def test_prompts_alone_take_the_whole_step_budget_whatever_the_chunk() -> None:
    """No sequence samples until the step's first prompt ends: two prompts, neither
    done, share the whole budget; a prompt longer than the chunk is fed whole in the
    step its first token is sampled in, when it comes first."""
    sched = Scheduler(slots=4, kv_tokens=10_000, step_tokens=10, prefill_chunk=2)
    a, b = seq(1, prompt_len=7), seq(2, prompt_len=30)
    sched.add([a, b])
    sched.admit()
    step = sched.plan([a, b])
    assert (a.fed, b.fed, len(step.items)) == (7, 0, 7)
    assert [(s.rid, row) for s, row in step.outputs] == [(1, 6)]


def test_a_prompt_alone_in_its_group_is_chunked_when_another_group_samples() -> None:
    """On a stock llama.cpp each adapter's group is its own call, one after another:
    a stream in one group waited for a whole budget of another group's prompt."""
    sched = Scheduler(slots=4, kv_tokens=10_000, step_tokens=20, prefill_chunk=5)
    long = seq(1, prompt_len=60, adapter="a")
    sched.add([long])
    sched.admit()
    assert len(sched.plan([long], sampling=True).items) == 5
    assert len(sched.plan([long]).items) == 20


def test_prefill_chunk_must_be_positive() -> None:
    with pytest.raises(ValueError, match="prefill_chunk must be at least 1, got 0"):
        Scheduler(slots=1, kv_tokens=100, prefill_chunk=0)


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
    """The scheduler thread must sleep, not spin, while a request waits for KV room
    that only running sequences (paused for credit, not for long) can free."""
    sched = Scheduler(slots=4, kv_tokens=100, pause_grace=1.0)
    sched.add([seq(1, prompt_len=60, window=0),   # no credit
               seq(2, prompt_len=30)])            # 60 + 30 + 16 does not fit
    assert [s.rid for s in sched.admit()] == [1]
    paused_at = sched.running[1].paused_at
    assert not sched.has_work(paused_at + 0.5)  # slots are free, but admit() takes nothing
    assert sched.next_wake() == paused_at + 1.0  # when 1 may yield to 2
    sched.credit(1, 1)
    assert sched.has_work(paused_at + 0.5)  # the running one may go on
    sched.release(sched.running[1])
    assert sched.has_work() and [s.rid for s in sched.admit()] == [2]


# -- preemption ------------------------------------------------------------------------------

def test_a_full_cache_preempts_the_most_recently_admitted() -> None:
    """Two sequences grow until the next step's tokens do not fit: the newer one
    gives way, to the front of the queue, with its output as part of its prompt."""
    sched = Scheduler(slots=4, kv_tokens=100)
    old, new = seq(1, prompt_len=30, max_tokens=500), seq(2, prompt_len=20, max_tokens=500)
    sched.add([old, new])
    assert generate(sched, 26) == []  # 26 steps fill the 100 cells: 30 + 20 + 2 * 25
    assert sum(s.pos for s in sched.running.values()) == 100
    sched.add([seq(3, prompt_len=1)])
    assert generate(sched, 1) == [new]
    assert running(sched) == [1] and waiting(sched) == [2, 3]
    assert new.prompt == list(range(100, 120)) + [1000 + n for n in range(26)]
    assert (new.fed, new.pos, new.generated, new.prompt_tokens) == (0, 0, 26, 20)
    assert sched.preempted == {2: new}
    assert sched.take_dropped() == [new.slot]  # its cells: the room was wanted
    assert new.slot in sched.free_ids and not sched.parked


def test_a_sequence_paused_for_credit_is_preempted_first() -> None:
    sched = Scheduler(slots=4, kv_tokens=100)
    old, new = seq(1, prompt_len=30, max_tokens=500), seq(2, prompt_len=20, max_tokens=500)
    sched.add([old, new])
    generate(sched, 10)
    old.credit = 0  # its reader fell behind: it sits steps out, holding 39 cells
    assert generate(sched, 32) == []  # new grows alone: 39 + 20 + 41 = 100 cells
    assert generate(sched, 1) == [old]
    assert running(sched) == [2] and waiting(sched) == [1]


def test_a_lone_sequence_is_never_preempted() -> None:
    sched = Scheduler(slots=2, kv_tokens=10)
    sched.add([seq(1, prompt_len=20, max_tokens=50)])
    assert generate(sched, 5, check=False) == []
    assert running(sched) == [1]


def test_a_preempted_sequence_resumes_first_and_where_it_stopped() -> None:
    """Readmitted before a newer request, it feeds its prompt and output at their
    old positions, samples its next token from the last of them, and counts on."""
    sched = Scheduler(slots=4, kv_tokens=100, step_tokens=1000)
    old, new = seq(1, prompt_len=30, max_tokens=40), seq(2, prompt_len=20, max_tokens=500)
    sched.add([old, new])
    [preempted] = generate(sched, 27)
    assert preempted is new and new.generated == 26
    sched.add([seq(3, prompt_len=1)])
    assert sched.admit() == []  # no room: 3 does not overtake it
    generate(sched, 13)  # old reaches max_tokens and leaves
    assert old.generated == 40 and not sched.running
    assert [s.rid for s in sched.admit()] == [2, 3]
    step = sched.plan([new])
    assert [(tok, pos) for tok, pos, _, _ in step.items] == [
        *((100 + n, n) for n in range(20)), *((1000 + n, 20 + n) for n in range(26))]
    assert step.outputs == [(new, 45)]  # the last output token's row: its next token
    assert new.advance(1026, b"x") == ("x", None) and new.generated == 27
    assert sched.plan([new]).items == [(1026, 46, new.slot, True)]


def test_a_preempted_sequence_without_credit_waits_for_it_and_lets_others_in() -> None:
    sched = Scheduler(slots=4, kv_tokens=100)
    old, new = seq(1, prompt_len=30, max_tokens=500), seq(2, prompt_len=20, max_tokens=500)
    sched.add([old, new])
    generate(sched, 10)
    old.credit = 0
    assert generate(sched, 33) == [old]
    assert waiting(sched) == [1]
    sched.release(new)
    sched.add([seq(3, prompt_len=5)])
    assert [s.rid for s in sched.admit()] == [3]  # 1 would only pause again
    sched.credit(1, 2)
    assert old.credit == 2
    assert [s.rid for s in sched.admit()] == [1]


def test_a_sequence_paused_past_the_grace_yields_its_slot_to_the_queue() -> None:
    sched = Scheduler(slots=1, kv_tokens=1000, pause_grace=1.0)
    slow = seq(1, prompt_len=10, max_tokens=50)
    sched.add([slow])
    generate(sched, 3)
    slow.spend(100.0)
    slow.credit = 0
    slow.paused_at = 100.0
    sched.add([seq(2)])
    assert sched.evict_paused(100.5) == [] and not sched.has_work(100.5)
    assert sched.next_wake() == 101.0
    assert sched.has_work(101.0)
    assert sched.evict_paused(101.0) == [slow]
    assert [s.rid for s in sched.admit()] == [2]
    # it keeps its 12 cells (prompt and 2 tokens fed back) while 2 needs none of them
    assert waiting(sched) == [1] and sched.parked == {1: slow} and slow.pos == 12


def test_a_grace_that_ends_between_has_work_and_next_wake_still_wakes_the_thread() -> None:
    """`Mailbox.take` asks `has_work`, then `next_wake`, at two instants: a grace
    ending between them left no wake-up time, and the thread slept until other news
    (helper 110's review)."""
    sched = Scheduler(slots=1, kv_tokens=100, pause_grace=1.0)
    slow = seq(1, prompt_len=60, window=0)
    sched.add([slow])
    sched.admit()
    slow.paused_at = 10.0
    sched.add([seq(2, prompt_len=60)])
    assert not sched.has_work(10.9999)
    assert sched.next_wake() == 11.0  # also once 11.0 has passed
    assert sched.has_work(11.0) and sched.evict_paused(11.0) == [slow]


def test_paused_sequences_yield_only_when_that_lets_the_head_in() -> None:
    sched = Scheduler(slots=4, kv_tokens=100, pause_grace=1.0)
    paused, busy = seq(1, prompt_len=10, window=0), seq(2, prompt_len=60, window=0)
    sched.add([paused, busy, seq(3, prompt_len=30)])  # 10 + 60 + 30 + 16 > 100
    assert [s.rid for s in sched.admit()] == [1, 2]
    now = paused.paused_at + 5
    busy.paused_at = now - 0.5
    assert sched.evict_paused(now) == []  # without 1: 60 + 30 + 16 > 100 still
    assert not sched.has_work(now) and sched.next_wake() == pytest.approx(now + 0.5)
    assert sched.evict_paused(now + 0.6) == [paused, busy]  # both may yield now
    assert [s.rid for s in sched.admit()] == [3]  # 1 and 2 wait for their readers
    assert sorted(waiting(sched)) == [1, 2] and sorted(sched.preempted) == [1, 2]


def test_overdue_never_turns_away_a_preempted_sequence() -> None:
    """It has streamed output already: a 503 now would cut a stream its client
    reads; its wait is not for admission."""
    sched = Scheduler(slots=4, kv_tokens=100, max_wait=1.0)
    old, new = seq(1, prompt_len=30, max_tokens=500), seq(2, prompt_len=20, max_tokens=500)
    sched.add([old, new])
    assert generate(sched, 27) == [new]
    late = seq(3, prompt_len=1)
    sched.add([late])
    now = late.submitted + 1.0
    assert sched.next_wake() == now  # 2 submitted earlier, but never overdue
    assert sched.overdue(now) == [late]
    assert waiting(sched) == [2] and sched.next_wake() is None


def test_a_preempted_sequence_can_be_unqueued() -> None:
    sched = Scheduler(slots=4, kv_tokens=100)
    sched.add([seq(1, prompt_len=30, max_tokens=500), seq(2, prompt_len=20, max_tokens=500)])
    [preempted] = generate(sched, 27)
    assert sched.unqueue(2) is preempted
    assert not sched.waiting and not sched.preempted
    sched.credit(2, 1)  # ignored: it is gone


# -- parked cells ----------------------------------------------------------------------------

def paused(sched: Scheduler, s: Seq) -> None:
    """Queue `s`, run a step (it is admitted, its prompt fed), then stop its reader."""
    sched.add([s])
    generate(sched, 1)
    s.credit, s.paused_at = 0, 0.0


def test_parked_cells_go_back_when_wanted_those_a_reader_holds_up_first() -> None:
    """Preempted for a slot alone, sequences keep their cells until a running one
    needs the room: then one whose reader gave no credit goes first (it is not
    readmitted before it does), though another was parked longer."""
    sched = Scheduler(slots=1, kv_tokens=100, pause_grace=0.0, seq_ids=3)
    first, second = seq(1, prompt_len=30, max_tokens=500), seq(2, prompt_len=30, max_tokens=500)
    paused(sched, first)
    paused(sched, second)  # first yields its slot, keeping its 30 cells
    third = seq(3, prompt_len=10, max_tokens=500)
    sched.add([third])
    generate(sched, 1)  # second yields too: 10 + 16 + 60 parked fit
    assert sched.parked == {1: first, 2: second} and running(sched) == [3]
    sched.credit(1, 5)  # first may run again, once there is a slot
    generate(sched, 30)  # third grows to 40 cells: the 60 parked still fit
    assert sched.take_dropped() == [] and (first.pos, second.pos) == (30, 30)
    generate(sched, 1)
    assert sched.take_dropped() == [second.slot] and sched.parked == {1: first}
    assert (second.pos, len(second.prompt)) == (0, 31)  # recomputed when readmitted
    generate(sched, 29)  # 30 cells are enough for third until it holds 70
    assert sched.take_dropped() == []
    generate(sched, 1)
    assert sched.take_dropped() == [first.slot] and not sched.parked


def test_a_new_sequence_takes_a_parked_ones_id_when_none_is_free() -> None:
    sched = Scheduler(slots=1, kv_tokens=100, pause_grace=0.0, seq_ids=1)
    first = seq(1, prompt_len=30)
    paused(sched, first)
    sched.add([second := seq(2)])
    generate(sched, 1)
    assert sched.take_dropped() == [0] and second.slot == 0 and first.pos == 0
    with pytest.raises(ValueError, match="3 sequence ids for 4 batch slots"):
        Scheduler(slots=4, kv_tokens=100, seq_ids=3)
    assert (seq_ids_for(4), seq_ids_for(200)) == (8, 256)  # llama.cpp's bound


def test_an_unqueued_parked_sequence_gives_its_cells_back() -> None:
    sched = Scheduler(slots=1, kv_tokens=100, pause_grace=0.0)
    first = seq(1, prompt_len=30)
    paused(sched, first)
    sched.add([seq(2)])
    generate(sched, 1)
    assert sched.parked == {1: first}
    assert sched.unqueue(1) is first
    assert sched.take_dropped() == [first.slot] and not sched.parked
    assert first.slot in sched.free_ids


# -- clients ---------------------------------------------------------------------------------

def test_admission_takes_the_request_of_the_client_using_least_first() -> None:
    """One client's queued requests do not hold another's behind all of them;
    within a client the queue is FIFO."""
    sched = Scheduler(slots=3, kv_tokens=1000)
    sched.add([seq(1, client="a"), seq(2, client="a"), seq(3, client="a"),
               seq(4, client="b")])
    assert [s.rid for s in sched.admit()] == [1, 4, 2]  # a tie at 0: the first queued
    assert waiting(sched) == [3]
    assert sched.use() == {"a": 8, "b": 4}


def test_the_client_using_fewer_kv_tokens_goes_first_not_the_one_running_fewer() -> None:
    sched = Scheduler(slots=4, kv_tokens=1000)
    sched.add([seq(1, prompt_len=300, client="a"), seq(2, prompt_len=5, client="b"),
               seq(3, prompt_len=5, client="b")])
    sched.admit()
    sched.add([seq(4, client="a"), seq(5, client="b")])
    assert [s.rid for s in sched.admit()] == [5]  # b runs two, but holds 10 cells to a's 300


def test_a_waiting_client_preempts_the_newest_of_a_client_holding_every_slot() -> None:
    """Three hogs of one client in all the slots: another client's short request
    takes the newest hog's slot at once, not after a hog ends (minutes)."""
    sched = Scheduler(slots=3, kv_tokens=1000)
    hogs = [seq(rid, prompt_len=20, max_tokens=10_000, client="a") for rid in (1, 2, 3)]
    sched.add(hogs)
    generate(sched, 5)
    sched.add([seq(4, client="a"), seq(5, client="b")])
    assert sched.has_work()
    assert sched.rebalance() == [hogs[2]]
    assert [s.rid for s in sched.admit()] == [5]
    assert running(sched) == [1, 2, 5] and waiting(sched) == [3, 4]
    # only a slot was wanted: the hog keeps its cells under its sequence id, parked
    assert sched.parked == {3: hogs[2]} and sched.running[5].slot != hogs[2].slot
    assert hogs[2].pos == 24 and sched.take_dropped() == []


def test_a_waiting_client_preempts_for_kv_room_but_never_past_a_fair_share() -> None:
    """b's request of 300 tokens may take cells from a only while a keeps as many
    as b then holds: a's 3 sequences of 150 give up one (450 - 150 >= 300), not
    a second for the 100 b's next request wants (300 - 150 < 300 + 100)."""
    sched = Scheduler(slots=8, kv_tokens=700)
    sched.add([seq(rid, prompt_len=150, max_tokens=10_000, client="a") for rid in (1, 2, 3)])
    sched.admit()
    sched.add([seq(4, prompt_len=300, client="b")])
    assert [s.rid for s in sched.rebalance()] == [3]
    assert [s.rid for s in sched.admit()] == [4]
    sched.add([seq(5, prompt_len=100, client="b")])  # 600 + 100 + 16 > 700
    assert sched.rebalance() == [] and sched.admit() == []
    assert waiting(sched) == [3, 5]


def test_one_client_never_preempts_its_own_for_admission() -> None:
    sched = Scheduler(slots=2, kv_tokens=1000)
    sched.add([seq(rid, max_tokens=100, client="a") for rid in (1, 2, 3)])
    sched.admit()
    assert sched.rebalance() == [] and waiting(sched) == [3]
    sched.add([seq(4, max_tokens=100)])  # anonymous is one client too
    sched.release(sched.running[2])
    sched.admit()
    assert running(sched) == [1, 4] and sched.rebalance() == []


def test_a_client_running_a_lone_sequence_keeps_it() -> None:
    sched = Scheduler(slots=1, kv_tokens=1000)
    sched.add([seq(1, max_tokens=100, client="a"), seq(2, client="b")])
    sched.admit()
    assert sched.rebalance() == [] and running(sched) == [1]


def test_a_full_cache_preempts_from_the_client_using_most_not_the_newest() -> None:
    """b's chat, admitted last, was the victim; a's long stream uses more."""
    sched = Scheduler(slots=4, kv_tokens=100)
    big, small = (seq(1, prompt_len=60, max_tokens=500, client="a"),
                  seq(2, prompt_len=10, max_tokens=500, client="b"))
    sched.add([big, small])
    assert generate(sched, 16) == []
    assert generate(sched, 1) == [big]
    assert running(sched) == [2] and waiting(sched) == [1]


def test_within_the_client_using_most_one_paused_for_credit_goes_first() -> None:
    sched = Scheduler(slots=4, kv_tokens=100)
    a1, a2, b = (seq(1, prompt_len=30, max_tokens=500, client="a"),
                 seq(2, prompt_len=20, max_tokens=500, client="a"),
                 seq(3, prompt_len=5, max_tokens=500, client="b"))
    sched.add([a1, a2, b])
    generate(sched, 3)
    a1.credit = 0
    b.credit, b.paused_at = 0, 0.0  # paused longer, but its client uses less
    victims = generate(sched, 40)
    assert victims[0] is a1


# -- a model of the cache, random workloads --------------------------------------------------

Spec = tuple[int, int, int, int, int]  # prompt, max_tokens, arrival step, stall, client
Flood = tuple[int, int, int]  # every how many steps, prompt length, max_tokens


def simulate(specs: list[Spec], slots: int, kv_tokens: int, flood: Flood | None = None
             ) -> tuple[dict[int, list[int]], int, int, int]:
    """Run requests (prompt length, max_tokens, arrival step, steps its reader stalls
    once it has 3 chunks, client) as the driver does over a model that keeps each
    sequence id's cells (a token must come at its id's next position; `take_dropped`
    clears them) and samples from every token in them; with `flood`, client "flood"
    sends a request every so many steps until they have all ended. Returns each
    request's tokens, the preemptions, the sequences recomputed (cells dropped) and
    the step they had all ended by; checks that the cells never overflow (but for
    a lone running sequence)."""
    sched = Scheduler(slots=slots, kv_tokens=kv_tokens, step_tokens=32, pause_grace=2.0)
    cells: dict[int, list[int]] = {}
    out: dict[int, list[int]] = {rid: [] for rid in range(len(specs))}
    stalled: dict[int, int] = {}  # rid -> step its reader read again
    preemptions = dropped = 0
    for now in range(20_000):
        sched.add(seq(rid, prompt_len=p, max_tokens=m, client=str(c))
                  for rid, (p, m, at, _, c) in enumerate(specs) if at == now)
        if flood is not None and now % flood[0] == 0:
            out[1000 + now] = []
            sched.add([seq(1000 + now, prompt_len=flood[1], max_tokens=flood[2],
                           client="flood")])
        preempted = sched.evict_paused(float(now)) + sched.rebalance()
        sched.admit()
        preemptions += len(preempted + sched.make_room())
        for slot in sched.take_dropped():
            cells.pop(slot, None)
            dropped += 1  # none yet if it was preempted before its first step
        for group in sched.groups():
            step = sched.plan(group)
            for tok, pos, slot, _ in step.items:
                assert pos == len(cells.setdefault(slot, [])), "a position skipped or repeated"
                cells[slot].append(tok)
            if len(sched.running) > 1 or sched.parked:  # parked cells never overflow it
                assert sum(map(len, cells.values())) <= kv_tokens
            for s, row in step.outputs:
                history = cells[s.slot][:step.items[row][1] + 1]
                token = 10 + sum((i + 1) * t for i, t in enumerate(history)) % 97
                out[s.rid].append(token)
                reason = s.advance(token, b"x")[1]
                s.spend(float(now))
                if reason is not None:
                    sched.release(s)
                    del cells[s.slot]
        for rid in out:
            stall = specs[rid][3] if rid < len(specs) else 0
            if len(out[rid]) >= 3 and rid not in stalled:
                stalled[rid] = now + stall
            if stalled.get(rid, now + 1) <= now:
                sched.credit(rid, 1)  # its reader keeps up: a chunk read for each sent
        if all(len(out[rid]) == spec[1] for rid, spec in enumerate(specs)):
            return out, preemptions, dropped, now
    raise AssertionError(f"not all finished: {[len(o) for o in out.values()]}")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 60), st.integers(0, 40),
                          st.integers(0, 30), st.integers(0, 2)), min_size=1, max_size=8),
       st.integers(1, 4),
       st.none() | st.tuples(st.integers(1, 6), st.integers(1, 40), st.integers(1, 60)))
def test_random_workloads_all_finish_with_their_solo_output(
        specs: list[Spec], slots: int, flood: Flood | None) -> None:
    """Whatever arrives when, from which of three clients, however long its reader
    stalls, however often it is preempted, and while another client sends request
    after request without end: every request ends (no client starves), with the
    tokens it has alone."""
    together, *_ = simulate(specs, slots, kv_tokens=100, flood=flood)
    for rid, spec in enumerate(specs):
        alone, *_ = simulate([(*spec[:2], 0, 0, 0)], 1, kv_tokens=100)
        assert together[rid] == alone[0], rid


def test_a_random_workload_preempts() -> None:
    """The property above is not vacuous: such workloads do preempt."""
    specs = [(30, 60, 0, 0, 0), (20, 70, 1, 0, 0), (10, 50, 2, 25, 0), (5, 40, 30, 0, 0)]
    _, preemptions, _, _ = simulate(specs, 4, kv_tokens=100)
    assert preemptions >= 2


def test_a_parked_sequence_resumes_with_its_cells_and_its_solo_tokens() -> None:
    """A reader stalls 20 steps: its stream yields the one slot (after the 2-step
    grace) to another client's request, which ends with room to spare; the stream,
    read again, goes on from the cells it kept, with the tokens it has alone."""
    specs: list[Spec] = [(10, 30, 0, 20, 0), (5, 10, 4, 0, 1)]
    together, preemptions, dropped, _ = simulate(specs, 1, kv_tokens=100)
    alone, *_ = simulate([(10, 30, 0, 0, 0)], 1, kv_tokens=100)
    assert (preemptions, dropped) == (1, 0)
    assert together[0] == alone[0]


def test_a_flooding_client_leaves_the_others_their_share() -> None:
    """Client "flood" sends a 200-token request every step, without end: another
    client's three requests end within twice their time alone (half the slots),
    not behind the flood's queue (614 steps, FIFO)."""
    specs: list[Spec] = [(10, 40, 5, 0, 0)] * 3
    *_, alone = simulate(specs, 4, kv_tokens=200)
    _, preemptions, _, flooded = simulate(specs, 4, kv_tokens=200, flood=(1, 10, 200))
    assert flooded <= 2 * alone, (alone, flooded)
    assert preemptions >= 1


def test_a_chatty_client_does_not_make_another_clients_hog_recompute_per_request() -> None:
    """a's 4 hogs hold every slot; b sends 20 short chats, one at a time, 5 steps
    apart. Each takes the newest hog's slot at once (rebalance), and the hog takes
    it back once the chat ends; but the hog waits parked, its cells kept, so not a
    token is fed twice. It lost its cells each time and was recomputed for each
    chat: 20 times, 2.8x the tokens fed."""
    sched = Scheduler(slots=4, kv_tokens=4096)
    hogs = [seq(rid, prompt_len=200, max_tokens=3000, window=10**9, client="a")
            for rid in range(4)]
    sched.add(hogs)
    chats: list[Seq] = []
    preempted = fed = 0
    next_at, step = 50, 0
    while len(chats) < 20 or chats[-1].generated < 16:
        step += 1
        if step == next_at:
            chats.append(seq(100 + len(chats), prompt_len=20, max_tokens=16,
                             window=10**9, client="b"))
            sched.add([chats[-1]])
        preempted += len(sched.rebalance())
        sched.admit()
        preempted += len(sched.make_room())
        for group in sched.groups():
            planned = sched.plan(group)
            fed += len(planned.items)
            for s, _ in planned.outputs:
                if s.advance(1000 + s.generated, b"x")[1] is not None:
                    sched.release(s)
                    next_at = step + 5  # a chat ended: b sends the next one 5 steps on
    once = sum(s.prompt_tokens + s.generated for s in hogs + chats)  # each token fed once
    assert preempted == 20  # each chat took a hog's slot, not waited for a hog to end
    assert fed <= once, (fed, once)
    assert sched.take_dropped() == []
