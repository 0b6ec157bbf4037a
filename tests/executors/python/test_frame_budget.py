"""The memory Python isolates' large frames hold in the PoP while they arrive
(`frame_budget.FrameBudget`), owner by owner, and the channels that wait for it:
a frame that does not fit waits with its socket unread, and is read on, whole and in
order, once one before it ends or goes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from runtime.executors.python import frame_budget, wire
from runtime.executors.python.channel import RECV_SIZE, Channel
from runtime.executors.python.frame_budget import COUNTED_FROM, FrameBudget
from tests.executors.python.test_channel import Recorder, settle
from tests.support import pop_thread, python_function

MIB = 1 << 20


def test_an_owner_counts_at_most_its_share_and_the_reserve_is_for_owners_counting_none() -> None:
    b = FrameBudget(100)  # 37 an owner, 20 in reserve
    assert (b.per_owner, b.reserve) == (37, 20)
    assert b.ask("a", 30, lambda: None) and not b.may_take("a", 8)  # 38 > its 37
    assert b.may_take("a", 7)
    assert b.ask("b", 37, lambda: None) and b.in_use == 67
    assert b.ask("c", 13, lambda: None) and b.in_use == 80  # 100 - the reserve
    assert not b.may_take("a", 1)  # under its share, but past 80: only for owners
    assert b.may_take("d", 20) and not b.may_take("d", 21)  # counting none, to the 100
    assert b.counted(500) == 37 and b.counted(12) == 12  # a frame counts a share at most


def test_an_owners_frames_add_up_and_go_one_by_one() -> None:
    b = FrameBudget(100)
    assert b.ask("a", 10, lambda: None) and b.ask("a", 20, lambda: None)
    assert b.held == {"a": 30} and b.ask("d", 37, lambda: None) and b.ask("e", 6, lambda: None)
    assert b.may_take("a", 7)  # to exactly 100 - the reserve (80), under a's share
    b.give_back("a", 10)
    assert b.held == {"a": 20, "d": 37, "e": 6} and b.in_use == 63
    b.give_back("a", 20)
    assert b.held == {"d": 37, "e": 6}


def test_a_budget_takes_any_positive_size_and_auto_is_a_quarter_of_the_memory() -> None:
    assert FrameBudget(1).total == 1
    with pytest.raises(ValueError, match=r"^a frame budget of -1 bytes$"):
        FrameBudget(-1)
    machine = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert frame_budget.auto_bytes() == machine // 4
    assert isinstance(frame_budget.auto_bytes(), int)


def test_waiting_frames_are_granted_in_order_each_as_soon_as_it_fits() -> None:
    b = FrameBudget(100)
    granted: list[str] = []
    assert b.ask("a", 37, lambda: None) and b.ask("b", 37, lambda: None)
    assert not b.ask("a", 10, lambda: granted.append("a2"))  # a at its share
    assert not b.ask("c", 30, lambda: granted.append("c"))  # 104 > 100
    assert b.ask("d", 6, lambda: None)  # one that fits does not wait behind them (80)
    b.give_back("b", 37)  # 43 in use: c (73) fits; a's second does not (47 > 37)
    assert granted == ["c"] and b.held == {"a": 37, "c": 30, "d": 6}
    b.give_back("a", 37)
    assert granted == ["c", "a2"] and b.in_use == 46 and not b.waiting


def test_a_withdrawn_wait_is_never_granted_and_frees_its_place() -> None:
    b = FrameBudget(100)
    granted: list[str] = []
    assert b.ask("a", 37, lambda: None) and b.ask("b", 37, lambda: None)

    class Chan:  # withdrawn by a bound method, as a channel's `_granted`
        def granted(self) -> None:
            granted.append("x")

    chan = Chan()
    assert not b.ask("x", 30, chan.granted)
    b.withdraw(chan.granted)
    b.give_back("a", 37)
    assert granted == [] and b.held == {"b": 37}
    with pytest.raises(ValueError):
        FrameBudget(0)


def frame(n: int, fill: bytes) -> bytes:
    return wire.frame(wire.RESPONSE, fill * (n - 1))


def sending(peer: socket.socket, data: bytes) -> threading.Thread:
    """`data` sent on a thread (the loop reads it meanwhile, or the send blocks)."""
    t = threading.Thread(target=peer.sendall, args=(data,))
    t.start()
    return t


async def until(check: Callable[[], bool]) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.002)
    raise AssertionError("not there in 1 s")


def test_channels_whose_large_frames_do_not_fit_wait_unread_and_then_arrive_whole() -> None:
    """A budget of 8 MiB (3 MiB an owner): owner a's 3 MiB frame counts; its second
    channel's 2 MiB frame waits (its owner at its share), unread past one read; b's
    2 MiB frame arrives meanwhile, and small frames are never counted. Once a's first
    frame is whole, its second is read on; every byte comes back counted out."""
    async def go() -> None:
        loop = asyncio.get_running_loop()
        frame_budget._budgets[loop] = budget = FrameBudget(8 * MIB)
        pairs = []
        for owner in ("a", "a", "b"):
            ours, peer = socket.socketpair()
            receiver = Recorder()
            channel = receiver.channel = Channel(ours, receiver, 16 * MIB, owner)
            channel.attach(loop)
            pairs.append((channel, receiver, peer))
        (a1, ra1, pa1), (a2, ra2, pa2), (_, rb1, pb1) = pairs
        big = frame(3 * MIB, b"1")
        first = sending(pa1, big[:MIB])  # begun: counts 3 MiB at once
        await until(lambda: len(a1.reader.buf) == MIB)
        assert budget.held == {"a": 3 * MIB} and a1.reading

        second = sending(pa2, frame(2 * MIB, b"2"))  # blocks: a2 stops after a read
        await until(lambda: a2.asking == 2 * MIB)
        await settle()
        assert not a2.reading and len(a2.reader.buf) <= RECV_SIZE
        assert budget.held == {"a": 3 * MIB}

        other = sending(pb1, frame(2 * MIB, b"b") + frame(COUNTED_FROM - 1, b"s"))
        await until(lambda: len(rb1.frames) == 2)
        assert [len(p) for _, p in rb1.frames] == [2 * MIB - 1, COUNTED_FROM - 2]
        assert budget.held == {"a": 3 * MIB} and ra2.frames == [] and not a2.reading

        first.join()
        rest = sending(pa1, big[MIB:])
        await until(lambda: bool(ra2.frames))
        for t in (rest, second, other):
            t.join()
        assert ra1.frames == [(wire.RESPONSE, b"1" * (3 * MIB - 1))]
        assert ra2.frames == [(wire.RESPONSE, b"2" * (2 * MIB - 1))]
        assert budget.in_use == 0 and budget.held == {} and not budget.waiting

        again = sending(pa1, big[:MIB])  # begun when its channel closes: given back at once
        await until(lambda: budget.in_use == 3 * MIB)
        again.join()
        a1.close()
        assert budget.in_use == 0
        for channel, _, peer in pairs:
            channel.close()
            peer.close()

    asyncio.run(go())


def test_a_paused_channel_granted_its_frame_stays_paused_until_resumed() -> None:
    """The job's reader paused it (backpressure) while its frame waited for the
    budget: the grant does not read on for it; its `resume_reading` does."""
    async def go() -> None:
        loop = asyncio.get_running_loop()
        frame_budget._budgets[loop] = budget = FrameBudget(8 * MIB)
        assert budget.ask("a", 3 * MIB, lambda: None)
        ours, peer = socket.socketpair()
        receiver = Recorder()
        channel = receiver.channel = Channel(ours, receiver, 16 * MIB, "a")
        channel.attach(loop)
        sender = sending(peer, frame(2 * MIB, b"x"))
        await until(lambda: channel.asking == 2 * MIB)
        assert not channel.reading
        channel.pause_reading()
        channel.resume_reading()  # resumed while it waits: still waiting
        assert not channel.reading
        channel.pause_reading()
        budget.give_back("a", 3 * MIB)  # granted while paused
        assert channel.counting == 2 * MIB and not channel.reading
        channel.resume_reading()
        await until(lambda: bool(receiver.frames))
        sender.join()
        assert [len(p) for _, p in receiver.frames] == [2 * MIB - 1] and budget.in_use == 0
        channel.close()
        peer.close()

    asyncio.run(go())


def test_configure_sets_the_bytes_of_budgets_made_after_it() -> None:
    async def made() -> int:
        return frame_budget.budget_of(asyncio.get_running_loop()).total

    before = frame_budget._total
    try:
        frame_budget.configure(64 * MIB)
        assert asyncio.run(made()) == 64 * MIB
        frame_budget.configure(0)
        assert asyncio.run(made()) == frame_budget.auto_bytes()
    finally:
        frame_budget.configure(before)


BIG = """
from edgefn import Response

def handle(request, env):
    return Response(bytes([int(request.query["i"])]) * (40 << 20))
"""


def test_a_pop_with_a_small_budget_serves_large_responses_whole_in_turn(tmp_path: Path) -> None:
    """`[python] max_frame_memory_mb = 64` (24 MiB an owner): three isolates answer
    40 MiB each at once; each counts 24 MiB, so they arrive one by one, every one
    whole, and nothing stays counted."""
    with contextlib.ExitStack() as stack:
        pop = stack.enter_context(pop_thread(tmp_path / "data",
                                             **{"python.max_frame_memory_mb": 64}))
        # (CPU: 40 MiB made and framed took past the default 50 ms on a loaded CI machine)
        pop.deploy(python_function(tmp_path, "big", BIG,
                                   limits="max_response_mb = 64\ncpu_ms = 5000",
                                   pool="min = 3\nmax = 3\nstandby = false"))
        budget = frame_budget.budget_of(pop.loop)
        assert (budget.total, budget.per_owner) == (64 * MIB, 24 * MIB)
        with concurrent.futures.ThreadPoolExecutor(3) as workers:
            got = list(workers.map(lambda i: pop.get(f"/big?i={i}", timeout=60), (1, 2, 3)))
        for i, (status, _, body) in enumerate(got, 1):
            assert status == 200 and body == bytes([i]) * (40 << 20)
        assert budget.in_use == 0 and not budget.waiting
