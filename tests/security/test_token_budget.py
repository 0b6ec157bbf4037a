"""Token budgets without a model: the stores (memory and a real Redis), the
sliding-window arithmetic, reservations, refunds, stream caps and their errors."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from edgefn_core.errors import Rejected
from runtime.security.principal import Principal
from runtime.security.ratelimit import native
from runtime.security.ratelimit.admission import TokenBudgets
from runtime.security.ratelimit.budget import (
    BudgetStore,
    MemoryBudgetStore,
    Refusal,
    SharedBudgetStore,
)
from runtime.security.ratelimit.redis_budget import PREFIX, RedisBudgetStore
from runtime.security.settings import RateLimitSettings, TenantLimits

from .redis_server import RedisServer, redis_server  # noqa: F401


class Clock:
    def __init__(self, now: float = 6000.0) -> None:  # the start of a minute
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "shared", "redis"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path
               ) -> Iterator[Callable[[], BudgetStore]]:
    """A factory of stores that share counts (one PoP's memory, the table the PoP
    processes of ``workers = N`` share, or one Redis server seen by several PoPs);
    each test uses its own bucket names."""
    if request.param == "memory":
        store = MemoryBudgetStore()
        yield lambda: store
        return
    if request.param == "shared":  # two workers' stores on one table, in turn
        assert native.create_table(tmp_path / "table", 64)
        workers = [SharedBudgetStore(native.counters(table=str(tmp_path / "table")),
                                     worker=(i, 2)) for i in range(2)]
        turn = iter(range(1 << 30))
        yield lambda: workers[next(turn) % 2]
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    yield lambda: RedisBudgetStore(server.url)


def run[T](coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())


def fresh() -> str:
    return uuid.uuid4().hex


async def close(*stores: BudgetStore) -> None:
    for s in stores:
        await s.close()


def test_reservations_fit_until_the_limit(make_store: Callable[[], BudgetStore]) -> None:
    async def main() -> None:
        store, b = make_store(), fresh()
        assert isinstance(await store.reserve([b], [100], 60), int)
        assert isinstance(await store.reserve([b], [100], 40), int)  # exactly full
        refused = await store.reserve([b], [100], 1)
        assert isinstance(refused, Refusal) and refused.index == 0
        assert refused.used == pytest.approx(100, abs=1) and 0 <= refused.retry_after <= 60
        await close(store)

    run(main())


def test_a_reservation_is_all_or_nothing(make_store: Callable[[], BudgetStore]) -> None:
    async def main() -> None:
        store, key, tenant = make_store(), fresh(), fresh()
        assert isinstance(await store.reserve([tenant], [50], 45), int)
        refused = await store.reserve([key, tenant], [1000, 50], 10)
        assert isinstance(refused, Refusal) and refused.index == 1
        # nothing was charged to the key: its whole 10 is still free
        assert isinstance(await store.reserve([key], [10], 10), int)
        # and an admitted one is charged to every bucket
        other, team = fresh(), fresh()
        assert isinstance(await store.reserve([other, team], [100, 100], 60), int)
        assert isinstance(await store.reserve([team], [100], 41), Refusal)
        assert isinstance(await store.reserve([other], [100], 41), Refusal)
        await close(store)

    run(main())


def test_a_refund_makes_room_again(make_store: Callable[[], BudgetStore]) -> None:
    async def main() -> None:
        store, b = make_store(), fresh()
        window = await store.reserve([b], [100], 90)
        assert isinstance(window, int)
        assert isinstance(await store.reserve([b], [100], 20), Refusal)
        await store.settle([b], window, 12 - 90)  # 12 used of 90
        assert isinstance(await store.reserve([b], [100], 88), int)
        assert isinstance(await store.reserve([b], [100], 1), Refusal)
        await close(store)

    run(main())


def test_stream_slots_are_capped_and_given_back(make_store: Callable[[], BudgetStore]) -> None:
    async def main() -> None:
        store, key, tenant = make_store(), fresh(), fresh()
        assert await store.acquire([key, tenant], [2, 3]) is None
        assert await store.acquire([key, tenant], [2, 3]) is None
        assert await store.acquire([key, tenant], [2, 3]) == 0
        assert await store.acquire([fresh(), tenant], [2, 3]) is None  # the tenant's 3rd
        assert await store.acquire([fresh(), tenant], [2, 3]) == 1
        await store.release([key, tenant])
        assert await store.acquire([key, tenant], [2, 3]) is None
        await close(store)

    run(main())


def test_the_stream_slots_of_a_pop_that_died_come_back_within_its_lease(
        redis_server: RedisServer) -> None:  # noqa: F811
    """A PoP worker killed mid-stream left its slots counted in Redis for an hour: the
    key's clients got 429 too_many_streams meanwhile (helper 71)."""
    async def main() -> None:
        dead, alive = RedisBudgetStore(redis_server.url, lease_s=1), RedisBudgetStore(
            redis_server.url, lease_s=1)
        key = fresh()
        assert await dead.acquire([key], [2]) is None
        assert await dead.acquire([key], [2]) is None
        assert dead.renewer is not None
        dead.renewer.cancel()  # as its process is gone: no renewal, no release
        assert await alive.acquire([key], [2]) == 0  # its lease still runs
        await asyncio.sleep(0.6)  # a live holder's lease is renewed meanwhile
        assert await alive.acquire([key], [3]) is None
        await asyncio.sleep(1.2)
        assert await alive.acquire([key], [2]) is None  # the dead one's two are gone
        assert await alive.acquire([key], [2]) == 0  # alive's two, renewed, still count
        for _ in range(2):
            await alive.release([key])
        await close(dead)
        await close(alive)

    run(main())


def test_an_older_edgefns_stream_counter_on_the_same_redis_is_left_alone(
        redis_server: RedisServer) -> None:  # noqa: F811
    """Slots were plain counters (INCR) under the same key: the hash commands failed on
    them (WRONGTYPE, an outage), and an older PoP's on the new hashes (review; helper
    74). The two versions now count their streams apart."""
    key = fresh()
    client = redis_server.client()
    client.set(PREFIX + key, 2)  # an older PoP holding its cap of 2

    async def main() -> None:
        store = RedisBudgetStore(redis_server.url)
        assert await store.acquire([key], [2]) is None
        await store.release([key])
        await close(store)

    run(main())
    assert client.get(PREFIX + key) == b"2"  # the older PoP's counter, untouched
    client.close()


def test_the_previous_window_decays_linearly() -> None:
    clock = Clock()
    store = MemoryBudgetStore(clock)
    assert isinstance(store.reserve_now(["b"], [100], 80), int)
    clock.now += 60  # the next window's start: all 80 still count
    assert isinstance(store.reserve_now(["b"], [100], 21), Refusal)
    clock.now += 30  # half way: 40 count
    refused = store.reserve_now(["b"], [100], 61)
    assert isinstance(refused, Refusal) and refused.used == pytest.approx(40)
    assert refused.retry_after == pytest.approx(0.75)  # when 80 * (1 - f) <= 39
    assert isinstance(store.reserve_now(["b"], [100], 60), int)
    clock.now += 120  # two windows on: nothing counts
    assert isinstance(store.reserve_now(["b"], [100], 100), int)


# -- TokenBudgets: who pays, what is reserved, what is refused --------------------------------
SETTINGS = RateLimitSettings(default_max_tokens=50, tenants={
    "acme": TenantLimits(tpm=1000, max_streams=3), "tiny": TenantLimits(tpm=100)})


def counter(n: int) -> Callable[[], Awaitable[int]]:
    async def count() -> int:
        return n

    return count


def test_a_reservation_is_the_prompt_plus_max_tokens() -> None:
    async def main() -> None:
        budgets = TokenBudgets(SETTINGS, MemoryBudgetStore())
        payer = budgets.payer(Principal("key", "acme", key_id="k", tpm=500))
        assert payer.buckets == ["key:k", "tenant:acme"] and payer.limits == [500, 1000]
        ticket = await budgets.admit(payer, counter(30), 100, stream=False)
        assert (ticket.prompt, ticket.reserved) == (30, 130)
        default = await budgets.admit(payer, counter(30), None, stream=False)
        assert default.reserved == 30 + 50  # default_max_tokens
        await ticket.settle(40)
        await default.settle(35)
        # 75 in use of the key's 500: 425 fit, 426 do not
        assert (await budgets.admit(payer, counter(25), 400, stream=False)).reserved == 425
        with pytest.raises(Rejected) as e:
            await budgets.admit(payer, counter(1), 0, stream=False)
        assert e.value.status == 429 and e.value.code == "token_budget"
        headers = dict(e.value.headers)
        assert headers[b"ratelimit-policy"] == b'"key-tpm";q=500;w=60'
        assert headers[b"ratelimit"].startswith(b'"key-tpm";r=0;t=')
        assert 1 <= int(headers[b"retry-after"]) <= 60

    run(main())


def test_no_limit_no_payer() -> None:
    budgets = TokenBudgets(SETTINGS, MemoryBudgetStore())
    assert not budgets.payer(None)
    assert not budgets.payer(Principal("key", "other", key_id="k"))
    assert budgets.payer(None, "acme").buckets == ["tenant:acme"]  # an ai binding's tenant


def test_a_reservation_over_the_whole_budget_is_a_400_without_counting_twice() -> None:
    async def main() -> None:
        budgets = TokenBudgets(SETTINGS, MemoryBudgetStore())
        payer = budgets.payer(Principal("key", "tiny", key_id="k"))
        with pytest.raises(Rejected) as e:
            await budgets.admit(payer, counter(10), 10**9, stream=False)
        assert e.value.status == 400 and "lower max_tokens" in str(e.value)
        with pytest.raises(Rejected) as e:  # sets none: says what was reserved instead
            await budgets.admit(payer, counter(60), None, stream=False)
        assert "(its prompt plus 50, [ratelimit] default_max_tokens, as it sets no " \
            "max_tokens)" in str(e.value) and "set a lower max_tokens" in str(e.value)
        # nothing was reserved by the refused requests
        assert (await budgets.admit(payer, counter(10), 90, stream=False)).reserved == 100

    run(main())


def test_streams_over_the_cap_are_refused_and_slots_come_back() -> None:
    async def main() -> None:
        budgets = TokenBudgets(SETTINGS, MemoryBudgetStore())
        payer = budgets.payer(Principal("key", "acme", key_id="k", max_streams=2))
        a = await budgets.admit(payer, counter(1), 1, stream=True)
        await budgets.admit(payer, counter(1), 1, stream=True)
        await budgets.admit(payer, counter(1), 1, stream=False)  # not a stream: no slot
        with pytest.raises(Rejected) as e:
            await budgets.admit(payer, counter(1), 1, stream=True)
        assert (e.value.status, e.value.code) == (429, "too_many_streams")
        assert "at most 2" in str(e.value) and dict(e.value.headers)[b"retry-after"] == b"1"
        await a.settle(2)
        await a.settle(2)  # twice: the slot is given back once
        await budgets.admit(payer, counter(1), 1, stream=True)
        with pytest.raises(Rejected):
            await budgets.admit(payer, counter(1), 1, stream=True)

    run(main())


def test_a_stream_refused_for_tokens_gives_its_slot_back() -> None:
    async def main() -> None:
        budgets = TokenBudgets(SETTINGS, MemoryBudgetStore())
        payer = budgets.payer(Principal("key", "acme", key_id="k", max_streams=1, tpm=100))
        with pytest.raises(Rejected) as e:
            await budgets.admit(payer, counter(99), 2, stream=True)
        assert e.value.status == 400
        ticket = await budgets.admit(payer, counter(50), 50, stream=True)  # the slot is free
        assert ticket.reserved == 100

    run(main())


def test_an_abandoned_ticket_settles_on_the_loop() -> None:
    async def main() -> None:
        budgets = TokenBudgets(SETTINGS, MemoryBudgetStore())
        payer = budgets.payer(Principal("key", "acme", key_id="k", max_streams=1))
        ticket = await budgets.admit(payer, counter(1), 1, stream=True)
        ticket.abandon()
        await asyncio.sleep(0)
        assert ticket.settled
        await budgets.admit(payer, counter(1), 1, stream=True)  # its slot came back

    run(main())


# -- the property: concurrent reservations never exceed a bucket -------------------------------
@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limit=st.integers(10, 500), pops=st.integers(1, 3),
       amounts=st.lists(st.integers(1, 120), min_size=1, max_size=40),
       redis=st.booleans())
def test_concurrent_reservations_never_overspend(redis_server: RedisServer,  # noqa: F811
                                                 limit: int, pops: int, amounts: list[int],
                                                 redis: bool) -> None:
    windows: set[int] = set()

    async def main() -> tuple[int, int]:
        shared = MemoryBudgetStore()
        stores: list[BudgetStore] = [RedisBudgetStore(redis_server.url) if redis else shared
                                     for _ in range(pops)]
        bucket = fresh()

        async def one(i: int, amount: int) -> int:
            got = await stores[i % pops].reserve([bucket], [limit], amount)
            if isinstance(got, int):
                windows.add(got)
                return amount
            return 0

        admitted = await asyncio.gather(*(one(i, a) for i, a in enumerate(amounts)))
        refused = [a for a, got in zip(amounts, admitted, strict=True) if not got]
        await close(*(s for s in stores if s is not shared))
        return sum(admitted), min(refused, default=0)

    total, smallest_refused = asyncio.run(main())
    # a burst across a minute's end may rightly admit more (the old window decays)
    assume(len(windows) <= 1)
    assert total <= limit
    if smallest_refused:  # a refusal means it truly did not fit: tight from below too
        assert total + smallest_refused > limit


def test_what_an_ended_generation_is_charged() -> None:
    """A worker that died mid-stream charged its client the prompt, what it read and
    a whole window unread (538 of 600 tokens for three cut streams)."""
    from edgefn_core.errors import WorkerDead, WorkerError
    from gpu_worker.client import Generation
    from runtime.security.ratelimit.admission import used_by

    async def main() -> None:
        budgets = TokenBudgets(SETTINGS, MemoryBudgetStore())
        payer = budgets.payer(Principal("key", "acme", key_id="k", max_streams=4))
        ticket = await budgets.admit(payer, counter(20), 150, stream=True)
        gen = Generation(None, 1, 64)  # type: ignore[arg-type]  # never sends: not asked to
        gen.tokens = 42
        assert used_by(ticket, gen, WorkerDead("died")) == 42
        # a timeout: the prompt was read and generation ran (free 504s would be a way
        # round the budget), but not the unread window
        assert used_by(ticket, gen, WorkerError("timeout", 504, "slow")) == 20 + 42
        assert used_by(ticket, gen, None) == 20 + 42 + 64  # the client left: read + a window
        fresh_gen = Generation(None, 2, 64)  # type: ignore[arg-type]
        assert used_by(ticket, fresh_gen, WorkerError("bad", 400, "refused")) == 0
        await ticket.settle(0)

    run(main())
