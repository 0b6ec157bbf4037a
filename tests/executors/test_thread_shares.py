"""`ThreadShares`: each owner's cap, the reserve for owners holding no thread, the
order waiting requests are served in, and cancellation, on a real event loop."""

from __future__ import annotations

import asyncio

import pytest

from runtime.executors.wasm.shares import ThreadShares


def test_an_owner_stops_at_its_share_and_others_go_on() -> None:
    async def go() -> None:
        shares = ThreadShares(total=8, per_owner=3, reserve=2)
        for _ in range(3):
            await shares.acquire("a")
        assert not shares.may_take("a") and shares.may_take("b")
        waiting = asyncio.ensure_future(shares.acquire("a"))
        await asyncio.sleep(0)
        assert not waiting.done() and shares.held == {"a": 3}
        await asyncio.wait_for(shares.acquire("b"), 1)  # not behind a's waiting request
        shares.release("b")
        assert not waiting.done()
        shares.release("a")
        await asyncio.wait_for(waiting, 1)
        assert shares.held == {"a": 3} and shares.in_use == 3

    asyncio.run(go())


def test_the_reserve_goes_to_owners_holding_none() -> None:
    async def go() -> None:
        shares = ThreadShares(total=8, per_owner=3, reserve=2)
        for owner in ("a", "a", "a", "b", "b", "b"):  # 6 = total - reserve
            await shares.acquire(owner)
        assert not shares.may_take("a")  # its cap
        await shares.acquire("c")  # none held: one of the reserve
        assert not shares.may_take("c")  # it holds one now, and the shared part is used
        second = asyncio.ensure_future(shares.acquire("c"))
        await asyncio.sleep(0)
        assert not second.done()
        await asyncio.wait_for(shares.acquire("d"), 1)  # the last thread
        assert shares.in_use == 8 and not shares.may_take("e")
        fifth = asyncio.ensure_future(shares.acquire("e"))
        await asyncio.sleep(0)
        shares.release("a")  # 7 in use: e (none held) may take it, c (one held) may not
        await asyncio.wait_for(fifth, 1)
        assert not second.done() and shares.held["e"] == 1
        shares.release("b")
        shares.release("b")  # 6 in use, the reserve's holders counted: not under 8 - 2
        await asyncio.sleep(0)
        assert not second.done()
        shares.release("b")  # 5: c's second one goes
        await asyncio.wait_for(second, 1)
        assert shares.held == {"a": 2, "c": 2, "d": 1, "e": 1} and shares.in_use == 6

    asyncio.run(go())


def test_waiting_requests_are_served_in_order() -> None:
    async def go() -> list[str]:
        shares = ThreadShares(total=2, per_owner=2, reserve=0)
        await shares.acquire("x")
        await shares.acquire("x")
        served: list[str] = []

        async def ask(owner: str) -> None:
            await shares.acquire(owner)
            served.append(owner)

        tasks = [asyncio.ensure_future(ask(o)) for o in ("a", "b", "c")]
        await asyncio.sleep(0)
        for _ in range(3):
            shares.release(served[-1] if served else "x")
            await asyncio.sleep(0)
        await asyncio.gather(*tasks[:2])
        return served

    assert asyncio.run(go())[:2] == ["a", "b"]


def test_a_cancelled_wait_takes_nothing() -> None:
    async def go() -> ThreadShares:
        shares = ThreadShares(total=1, per_owner=1, reserve=0)
        await shares.acquire("a")
        waiting = asyncio.ensure_future(shares.acquire("b"))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not shares.waiting
        granted_then_cancelled = asyncio.ensure_future(shares.acquire("c"))
        await asyncio.sleep(0)
        shares.release("a")  # granted to c; c's task is cancelled before it runs again
        granted_then_cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await granted_then_cancelled
        return shares

    shares = asyncio.run(go())
    assert shares.in_use == 0 and shares.held == {} and not shares.waiting


@pytest.mark.parametrize("total,per_owner,reserve,memory", [
    (4, 4, 1, 0), (4, 0, 0, 0), (4, 2, 4, 0), (4, 2, -1, 0), (4, 2, 1, -1)])
def test_shares_that_do_not_fit_are_refused(total: int, per_owner: int, reserve: int,
                                            memory: int) -> None:
    with pytest.raises(ValueError, match="do not fit"):
        ThreadShares(total, per_owner, reserve, memory)


def test_memory_bounds_the_requests_on_threads_together_and_per_owner() -> None:
    async def go() -> None:
        # 16 threads for anyone, 4 more in reserve; 1600 MiB: 600 an owner, 320 kept
        shares = ThreadShares(total=20, per_owner=6, reserve=4, memory_mb=1600)
        assert (shares.memory_per_owner, shares.memory_reserve) == (600, 320)
        assert shares.counted(1024) == 600 and shares.counted(64) == 64
        await shares.acquire("a", 300)
        await shares.acquire("a", 300)
        assert not shares.may_take("a", 1)  # its 600
        assert shares.may_take("a", 0)  # a request that counts nothing: threads only
        await shares.acquire("b", 600)
        await shares.acquire("c", 80)  # 1280: the part for anyone
        assert not shares.may_take("c", 1)  # it holds a thread: not the reserve's memory
        later = asyncio.ensure_future(shares.acquire("c", 10))
        await asyncio.sleep(0)
        assert shares.may_take("d", 320) and not shares.may_take("d", 321)  # the reserve
        await shares.acquire("d", 320)
        assert shares.mb_in_use == 1600 and not later.done()
        shares.release("a", 300)  # 1300 + 10: still past 1280
        await asyncio.sleep(0)
        assert not later.done()
        shares.release("b", 600)
        await asyncio.wait_for(later, 1)
        assert shares.held_mb == {"a": 300, "c": 90, "d": 320} and shares.mb_in_use == 710
        for owner, mb in (("a", 300), ("c", 80), ("c", 10), ("d", 320)):
            shares.release(owner, mb)
        assert shares.mb_in_use == 0 and shares.held_mb == {} and shares.held == {}

    asyncio.run(go())


def test_memory_shares_are_whole_mib_and_the_part_for_anyone_is_inclusive() -> None:
    async def go() -> ThreadShares:
        shares = ThreadShares(total=20, per_owner=6, reserve=4, memory_mb=1001)
        assert (shares.memory_per_owner, shares.memory_reserve) == (375, 200)
        assert shares.counted(1024) == 375 and type(shares.counted(1024)) is int
        await shares.acquire("a", 375)
        await shares.acquire("b", 300)
        await shares.acquire("e", 100)  # 775: 801 - 775 = 26 left for anyone
        assert shares.may_take("e", 26) and not shares.may_take("e", 27)  # up to 801 itself
        granted = asyncio.ensure_future(shares.acquire("f", 226))  # all but the reserve's 0
        await asyncio.wait_for(granted, 1)
        waiting = asyncio.ensure_future(shares.acquire("e", 50))
        await asyncio.sleep(0)
        shares.release("a", 375)  # granted to e; its task is cancelled before it runs again
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        return shares

    shares = asyncio.run(go())
    assert shares.held_mb == {"b": 300, "e": 100, "f": 226} and shares.mb_in_use == 626
    assert shares.held == {"b": 1, "e": 1, "f": 1}


def test_without_a_memory_bound_requests_count_nothing() -> None:
    shares = ThreadShares(total=20, per_owner=6, reserve=4)
    assert shares.memory == 0 and shares.counted(1024) == 0 and shares.may_take("a", 0)
