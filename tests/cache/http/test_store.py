"""The tiered store: the memory LRU keeps to its byte budget, the LMDB tier to
its own (oldest written first out), and the purge index follows both."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefn_core.errors import StoreClosed
from runtime.cache.http.store import OVERHEAD, Entry, TieredStore


def entry(nbytes: int, tag: str = "t") -> Entry:
    return Entry(200, [], b"x" * (nbytes - OVERHEAD), 0.0, 0.0, 60.0, 0.0, 0.0, False, False,
                 False, None, None, [], "", [tag], 1.0)


def test_memory_lru_keeps_its_budget_and_evicts_the_least_recent() -> None:
    s = TieredStore(memory_bytes=3000)
    for k in (b"a", b"b", b"c"):
        s.put(k, [entry(1000)])
    assert s.get(b"a") is not None  # a is now the most recent
    s.put(b"d", [entry(1000)])
    assert s.memory_used == 3000 and s.get(b"b") is None
    assert {k for k, _ in s.items()} == {b"a", b"c", b"d"}


def test_an_entry_over_every_budget_is_not_kept() -> None:
    s = TieredStore(memory_bytes=1000)
    s.put(b"big", [entry(1001)])
    assert s.get(b"big") is None and not s.index and s.memory_used == 0


def test_disk_tier_keeps_what_memory_dropped_within_its_own_budget(tmp_path: Path) -> None:
    s = TieredStore(memory_bytes=1000, disk=tmp_path, disk_bytes=2000)
    for k in (b"a", b"b", b"c"):
        s.put(k, [entry(1000, tag=k.decode())])
    assert s.disk_used == 2000 and list(s.disk) == [b"b", b"c"]
    assert s.get(b"a") is None  # out of both tiers
    got = s.get(b"b")  # from disk, back into memory
    assert got is not None and got[0].tags == ["b"] and list(s.memory) == [b"b"]
    assert dict(s.items()) == {b"b": frozenset({"b"}), b"c": frozenset({"c"})}
    assert s.delete(b"c") and not s.delete(b"c")
    s.close()
    reopened = TieredStore(memory_bytes=1000, disk=tmp_path, disk_bytes=2000)
    assert dict(reopened.items()) == {b"b": frozenset({"b"})} and reopened.disk_used == 1000
    reopened.close()


def test_closed_store_says_so(tmp_path: Path) -> None:
    s = TieredStore(memory_bytes=1000, disk=tmp_path, disk_bytes=1000)
    s.close()
    with pytest.raises(StoreClosed):
        s.put(b"a", [entry(500)])


def test_a_full_disk_tier_never_fails_a_put(tmp_path: Path) -> None:
    """Each of a PoP's workers keeps its own disk budget in one LMDB file: three of
    them filled a map sized for one, and MDB_MAP_FULL turned every cacheable 200
    into a 502. The map now has room for every writer, and a failed write keeps
    the entry in memory only."""
    s = TieredStore(memory_bytes=1 << 20, disk=tmp_path, disk_bytes=1 << 20, writers=3)
    assert s.env is not None and s.env.info()["map_size"] >= 6 << 20
    import lmdb

    for i in range(10_000):  # what the other writers stored, until the map is full
        try:
            with s.env.begin(write=True) as txn:
                txn.put(b"other%d" % i, b"y" * 65536)
        except lmdb.MapFullError:
            break
    s.put(b"k", [entry(50_000, tag="k")])  # does not raise
    assert s.write_failed and b"k" not in s.disk
    got = s.get(b"k")
    assert got is not None and got[0].tags == ["k"]  # served from memory
    s.put(b"k2", [entry(2000)])  # and the next put goes on too
    assert s.get(b"k2") is not None
    s.close()


@pytest.mark.parametrize("writers", [1, 2])
def test_a_record_written_before_stamps_is_still_read(tmp_path: Path, writers: int) -> None:
    """Records now start with their writer's stamp (see the module doc); a disk
    tier left by an earlier edgefn holds plain msgpack records."""
    import lmdb
    import msgspec

    env = lmdb.open(str(tmp_path), map_size=16 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"old", msgspec.msgpack.encode([entry(600, tag="old")]))
    env.close()
    s = TieredStore(memory_bytes=1000, disk=tmp_path, disk_bytes=1000, writers=writers)
    assert dict(s.items()) == {b"old": frozenset({"old"})}
    got = s.get(b"old")
    assert got is not None and got[0].tags == ["old"]
    assert s.delete(b"old") and s.get(b"old") is None
    s.close()


def test_a_shared_record_is_deleted_once_whichever_workers_read_it(tmp_path: Path) -> None:
    """Each worker that had read it counted it: a purge of one URL with two workers said
    "purged 2 entries". (Another worker's delete is one of its record, made here
    through the same LMDB: one process cannot open it twice.)"""
    s = TieredStore(memory_bytes=1 << 20, disk=tmp_path, disk_bytes=1 << 20, writers=2)
    assert s.env is not None
    s.put(b"k", [entry(600, tag="k")])
    assert s.delete(b"k") and s.get(b"k") is None
    s.put(b"k", [entry(600, tag="k")])
    assert s.get(b"k") is not None
    with s.env.begin(write=True) as txn:  # the other worker's purge went first
        assert txn.delete(b"k")
    assert not s.delete(b"k") and not dict(s.items())  # its copy dropped, not counted
    s.close()
