"""A KV binding call never holds the PoP's event loop on LMDB's writer lock: a read
of a namespace whose handle this process has not opened yet (another process created
it after this one opened the store) opens it, which waits for the lock; such a read
runs off the loop. Real LMDB, a real second process holding the lock."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from kv import KVStore
from runtime.bindings import Bindings, Stores
from runtime.bindings.kv import KVBinding
from runtime.bindings.vectors import VectorsBinding

ROOT = Path(__file__).resolve().parents[2]
# creates namespace "late" with k=v, then holds the writer lock until stdin says go
# (or 3 s pass: a loop that waits for the lock never says go)
CREATE_AND_HOLD = """
import select
import sys
import lmdb
from kv import KVStore
s = KVStore(sys.argv[1])
s.create_namespace("late")
s.put("late", b"k", b"v")
s.close()
env = lmdb.open(sys.argv[1], max_dbs=200)
txn = env.begin(write=True)
print("held", flush=True)
select.select([sys.stdin], [], [], 3)
txn.abort()
"""


def test_the_first_read_of_a_namespace_created_elsewhere_leaves_the_loop_free(
        tmp_path: Path) -> None:
    stores = Stores(tmp_path / "data")
    kv: KVStore = stores.kv  # opened before "late" exists
    bindings = Bindings("f", KVBinding(stores, "f", frozenset({"late", "ns"})),
                        VectorsBinding(stores, "f", frozenset()))
    kv.create_namespace("ns")
    kv.put("ns", b"k", b"here")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen([sys.executable, "-c", CREATE_AND_HOLD, str(tmp_path / "data" / "kv")], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    async def main() -> tuple[float, float, object, object]:
        assert child.stdout is not None
        assert await asyncio.to_thread(child.stdout.readline) == b"held\n"
        assert not kv.opened("late") and kv.opened("ns")
        # an opened namespace: answered on the loop, now, though the lock is held
        here = bindings.call("kv.get", {"namespace": "ns", "key": "k"})
        t0 = time.perf_counter()
        pending = bindings.call("kv.get", {"namespace": "late", "key": "k"})
        returned = time.perf_counter() - t0
        assert asyncio.isfuture(pending) or asyncio.iscoroutine(pending), pending
        ticks = time.perf_counter()
        await asyncio.sleep(0.05)  # the loop turns while the read waits for the lock
        turned = time.perf_counter() - ticks
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        child.stdin.flush()
        late = await asyncio.wait_for(pending, 10)
        return returned, turned, here, late

    try:
        returned, turned, here, late = asyncio.run(main())
    finally:
        child.kill()
        child.communicate()  # waits, and closes its pipes
        stores.close()
    # (the old code held the call until the lock went, 3 s; a loaded machine, not that)
    assert returned < 1.0 and turned < 2.0, (returned, turned)
    assert here == {"value": "aGVyZQ==", "metadata": None, "version": 1, "expires_at": None}
    assert isinstance(late, dict) and late["value"] == "dg==", late
