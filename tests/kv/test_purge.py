"""The expired-key sweep (`[stores] purge_interval`): in batches of write transactions,
on a worker thread, so the PoP's loop keeps answering while a tenant's mass of expired
keys is purged."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from edgefn_core.errors import InvalidValue
from runtime import app
from runtime.bindings import Stores

KEYS = 100_000  # ~0.3 s to purge: on the loop, one stall that long


def expired(stores: Stores, n: int) -> None:
    """`n` keys in namespace ``ns`` that expire within a millisecond, and one that lives."""
    kv = stores.kv
    kv.create_namespace("ns")
    for i in range(0, n, 1000):
        kv.batch([("put", "ns", b"k%07d" % j, b"", {"ttl": 0.001})
                  for j in range(i, min(n, i + 1000))])
    kv.put("ns", b"live", b"x")
    time.sleep(0.01)


def on_disk(stores: Stores) -> int:
    return int(stores.kv.stats()["namespaces"]["ns"])


async def ticks_until(done: Any, pop: Any) -> tuple[float, float]:
    """Run the sweep every 10 ms, ticking the loop every millisecond until `done()`:
    (the longest the loop went without a tick, seconds since the sweep began)."""
    purger = asyncio.get_running_loop().create_task(app._purge_expired(pop, 0.01))
    started = last = time.perf_counter()
    longest = 0.0
    try:
        while not done():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            longest, last = max(longest, now - last), now
            assert now - started < 60, "the sweep did not finish"
    finally:
        purger.cancel()
        await asyncio.wait([purger])
    return longest, time.perf_counter() - started


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Stores]:
    s = Stores(tmp_path)
    yield s
    s.close()


def test_the_loop_keeps_answering_while_expired_keys_are_purged(stores: Stores) -> None:
    expired(stores, KEYS)
    longest, took = asyncio.run(ticks_until(lambda: on_disk(stores) == 1,
                                            SimpleNamespace(stores=stores)))
    print(f"sweep of {KEYS} keys: {took * 1000:.0f} ms, "
          f"longest loop gap {longest * 1000:.1f} ms")
    assert longest < took / 4
    assert [k.key for k in stores.kv.list("ns").keys] == [b"live"]
    with stores.kv.env.begin() as txn:
        assert txn.stat(stores.kv._ttl)["entries"] == 0


def test_a_cancelled_sweep_stops_after_the_batch_in_flight(stores: Stores) -> None:
    """A shutdown cancels the sweep: it returns once its batch ends (the store closes
    next), and no batch follows."""
    expired(stores, KEYS)
    asyncio.run(ticks_until(lambda: on_disk(stores) < KEYS + 1,
                            SimpleNamespace(stores=stores)))
    left = on_disk(stores)
    time.sleep(0.05)
    assert 1 < left == on_disk(stores)


@pytest.mark.parametrize("n, transactions", [(250, 3), (200, 3), (99, 1)])
def test_a_purge_takes_its_keys_in_batches(stores: Stores, n: int, transactions: int) -> None:
    expired(stores, n)
    begun = []
    assert stores.kv.purge_expired(batch=100, stop=lambda: bool(begun.append(1))) == n
    assert len(begun) == transactions  # `stop` is asked before each transaction
    assert on_disk(stores) == 1


def test_a_stopped_purge_ends_between_batches(stores: Stores) -> None:
    expired(stores, 250)
    begun: list[int] = []
    assert stores.kv.purge_expired(batch=100, stop=lambda: len(begun) > 0 or
                                   bool(begun.append(1))) == 100
    assert on_disk(stores) == 151
    # the next sweep takes the rest; a key written again meanwhile stays
    stores.kv.put("ns", b"k0000150", b"again")
    assert stores.purge_expired() == 149 and on_disk(stores) == 2
    assert stores.kv.get("ns", b"k0000150") == b"again"


def test_a_purge_batch_is_at_least_one_key(stores: Stores) -> None:
    stores.kv.create_namespace("ns")
    with pytest.raises(InvalidValue, match=r"^a purge batch is at least 1 key, got 0$"):
        stores.kv.purge_expired(batch=0)
