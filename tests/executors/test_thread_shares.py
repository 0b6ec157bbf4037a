"""The WASM worker threads as owners take them (`engine.ThreadShares`): an owner's
first thread may be any free one, a further one only while more than `RESERVE` are
free. Three owners at their share held all 16 threads, and a fourth owner's request
waited 7 s for one."""

from __future__ import annotations

import asyncio

from runtime.executors.wasm.engine import (
    RESERVE,
    TENANT_SHARE,
    WORKER_THREADS,
    Taken,
    ThreadShares,
)


def test_owners_beyond_two_at_their_share_still_find_a_thread_each() -> None:
    async def go() -> None:
        shares = ThreadShares()
        held = {o: [await shares.acquire(o) for _ in range(TENANT_SHARE)] for o in "ab"}
        assert shares.free == RESERVE == WORKER_THREADS - 2 * TENANT_SHARE > 0
        c = [await shares.acquire("c")]  # its first: from the reserve
        second = asyncio.ensure_future(shares.acquire("c"))  # a further one: it waits
        await asyncio.sleep(0.01)
        assert not second.done()
        others = [await shares.acquire(o) for o in "defghijk"[:RESERVE - 1]]  # a first each
        assert shares.free == 0
        late = asyncio.ensure_future(shares.acquire("z"))  # none free: it waits
        await asyncio.sleep(0.01)
        assert not late.done()
        held["a"].pop().release()  # one free: the owner holding none takes it, not "c"
        await asyncio.sleep(0.01)
        assert late.done() and not second.done() and shares.free == 0
        for t in held["a"][:RESERVE + 1]:  # more than RESERVE free: "c" may take another
            t.release()
        await asyncio.sleep(0.01)
        assert second.done() and shares.held["c"] == 2
        for t in [*c, second.result(), late.result(), *others, *held["b"],
                  *held["a"][RESERVE + 1:]]:
            t.release()
        assert shares.free == WORKER_THREADS and shares.held == {}

    asyncio.run(go())


def test_a_waiter_that_gives_up_is_forgotten_and_wakes_no_one() -> None:
    async def go() -> None:
        shares = ThreadShares()
        taken: list[Taken] = [await shares.acquire(str(n)) for n in range(WORKER_THREADS)]
        waiter = asyncio.ensure_future(shares.acquire("late"))
        await asyncio.sleep(0.01)
        waiter.cancel()
        await asyncio.sleep(0.01)
        assert shares.waiting == []
        taken.pop().release()
        assert shares.free == 1 and "late" not in shares.held

    asyncio.run(go())
