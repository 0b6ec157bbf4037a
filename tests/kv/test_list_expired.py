"""A function's ``kv.list`` over many expired keys not purged yet: each call reads past
at most `Limits.max_list_expired` of them and runs off the PoP's loop, so a handler
looping on it stalls no one else (it read every expired key, on the loop: 240k took
150-200 ms a call)."""

from __future__ import annotations

import asyncio
import inspect
import time
from pathlib import Path
from typing import Any

from runtime.bindings import Bindings, Stores
from runtime.functions import manifest
from tests.support import function_dir, reactor

KEYS = 100_000  # ~65 ms a call when one call read them all


def lister(tmp_path: Path) -> tuple[Bindings, Stores]:
    """The bindings of a function bound to KV namespace ``ns``, which holds `KEYS`
    expired keys and one live key after them (the caller closes the stores)."""
    d = function_dir(tmp_path, "lister", reactor(""), extra='[bindings]\nkv = ["ns"]')
    stores = Stores(tmp_path / "data")
    bindings = Bindings.prepare(stores, manifest.load(d))
    for i in range(0, KEYS, 1000):
        stores.kv.batch([("put", "ns", b"k%07d" % j, b"", {"ttl": 0.001})
                         for j in range(i, i + 1000)])
    stores.kv.put("ns", b"live", b"x")
    time.sleep(0.01)
    return bindings, stores


async def listed(bindings: Bindings, args: dict[str, Any]) -> Any:
    result = bindings.call("kv.list", {"namespace": "ns", **args})
    return await result if inspect.isawaitable(result) else result


def test_listing_past_expired_keys_leaves_the_loop_answering(tmp_path: Path) -> None:
    bindings, stores = lister(tmp_path)

    async def go() -> list[float]:
        pending = bindings.call("kv.list", {"namespace": "ns", "limit": 1})
        assert inspect.isawaitable(pending), "kv.list ran on the loop"  # on a worker thread
        await pending
        stop = False

        async def hostile() -> None:  # a handler looping on kv.list("", None, 1)
            while not stop:
                await listed(bindings, {"limit": 1})
                await asyncio.sleep(0)

        tasks = [asyncio.create_task(hostile()) for _ in range(8)]
        gaps = []
        last = started = time.perf_counter()
        while last - started < 1.0:
            await asyncio.sleep(0.001)
            gaps.append(time.perf_counter() - last)
            last += gaps[-1]
        stop = True
        await asyncio.gather(*tasks)
        return sorted(gaps)

    try:
        gaps = asyncio.run(go())
        print(f"loop gaps: p50 {gaps[len(gaps) // 2] * 1000:.1f} ms, "
              f"p90 {gaps[len(gaps) * 9 // 10] * 1000:.1f} ms, max {gaps[-1] * 1000:.1f} ms")
        assert gaps[len(gaps) * 9 // 10] < 0.03
        # the short pages' cursors lead to the live key
        cursor, keys, calls = None, [], 0
        while True:
            page = asyncio.run(listed(bindings, {"limit": 1, "cursor": cursor}))
            keys += [k["key"] for k in page["keys"]]
            calls += 1
            if page["cursor"] is None:
                break
            cursor = page["cursor"]
        assert keys == ["live"] and calls == KEYS // 1000 + 1
    finally:
        stores.close()
