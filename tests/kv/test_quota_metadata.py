"""The per-owner KV quota counts what usage is charged for a write: the key and the
whole new record (20-byte head, metadata and value), less the key and the whole
record it replaces. The check counted only the key and the new value less the old
record: a value exactly as long as the old record, with 1 KiB of metadata each time,
"added" nothing and went unchecked, yet grew the record ~1 KiB a put (an owner held
3.96 MB against a 1 MiB quota); a cas did the same."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefn_core.errors import LimitExceeded
from kv.quota import Quota
from kv.store import KVStore

MIB = 1 << 20
HEAD = 20  # u64 version | u64 expires_at_ms | u32 meta_len
META = {"m": "z" * 1000}
META_LEN = len(json.dumps(META, separators=(",", ":")))  # 1008


@pytest.fixture
def kv(tmp_path: Path) -> Iterator[KVStore]:
    with KVStore(tmp_path / "kv", sync=False) as s:
        s.create_namespace("ns")
        yield s


def counted(s: KVStore, ns: str = "ns") -> int:
    """What the namespace's keys and records take, counted afresh from LMDB."""
    with s.env.begin() as txn:
        return sum(len(k) + len(v) for k, v in txn.cursor(db=s._db(ns)))


def fill(s: KVStore, quota: Quota, leave: int) -> None:
    """Fill namespace "ns" to `leave` bytes under the quota's limit."""
    n = 0
    while (room := quota.limit - s.usage(["ns"]) - leave) > 0:
        value = min(room, 64 * 1024) - 4 - HEAD  # a new 4-byte key each time
        assert value >= 0
        s.put("ns", b"f%03d" % n, b"f" * value, quota=quota)
        n += 1
    assert s.usage(["ns"]) == quota.limit - leave


def test_a_value_as_long_as_the_old_record_with_metadata_cannot_grow_past_the_quota(
        kv: KVStore) -> None:
    """The QA loop at the store level: refused once the quota is reached, with the
    record and usage left as they were, and usage never past the quota."""
    quota = Quota(("ns",), MIB, "atk")
    kv.put("ns", b"g", b"y" * 10, quota=quota)
    fill(kv, quota, leave=20_000)
    size = 30
    refused = None
    for _ in range(100):  # ~20 puts fit; the old check let every one of them through
        before = kv.get_entry("ns", b"g")
        try:
            kv.put("ns", b"g", b"y" * size, metadata=META, quota=quota)
        except LimitExceeded as e:
            refused = e
            assert kv.get_entry("ns", b"g") == before  # nothing written
            break
        assert kv.usage(["ns"]) <= MIB
        size += HEAD + META_LEN
    assert refused is not None, f"usage {kv.usage(['ns'])} against a quota of {MIB}"
    assert "owner 'atk'" in str(refused) and "kv_owner_quota_mb" in str(refused)
    assert f"{HEAD + META_LEN} more would pass its quota of {MIB} bytes" in str(refused)
    assert kv.usage(["ns"]) <= MIB
    assert kv.usage(["ns"]) == counted(kv)  # the charge is what LMDB holds


def test_cas_with_metadata_is_held_to_the_quota(kv: KVStore) -> None:
    quota = Quota(("ns",), MIB, "atk")
    version = kv.put("ns", b"g", b"y" * 10, quota=quota)
    fill(kv, quota, leave=20_000)
    size = 30
    for _ in range(100):
        try:
            version = kv.cas("ns", b"g", version, b"y" * size, metadata=META, quota=quota)
        except LimitExceeded as e:
            assert f"{HEAD + META_LEN} more would pass" in str(e)
            break
        assert version is not None and kv.usage(["ns"]) <= MIB
        size += HEAD + META_LEN
    else:
        pytest.fail(f"usage {kv.usage(['ns'])} against a quota of {MIB}")
    assert kv.get_entry("ns", b"g").version == version
    assert kv.usage(["ns"]) <= MIB and kv.usage(["ns"]) == counted(kv)
    # a new key by cas counts its key, head, metadata and value
    with pytest.raises(LimitExceeded, match=f"{3 + HEAD + META_LEN + 1} more would pass"):
        kv.cas("ns", b"new", None, b"v", metadata=META,
               quota=Quota(("ns",), kv.usage(["ns"]), "atk"))
    assert kv.get("ns", b"new") is None


def test_a_smaller_value_with_larger_metadata_counts_the_metadata(kv: KVStore) -> None:
    """Replacing a 1000-byte value (no metadata) by a 10-byte one with 1008 bytes of
    metadata grows the record by 18 bytes: refused at the quota (the old check saw the
    value shrink by 990 and let it through), passed with exactly 18 bytes of room."""
    kv.put("ns", b"k", b"x" * 1000)
    used = kv.usage(["ns"])
    assert used == 1 + HEAD + 1000
    grows = (HEAD + META_LEN + 10) - (HEAD + 1000)
    assert grows == 18
    with pytest.raises(LimitExceeded, match=f"hold {used} bytes; {grows} more would pass"):
        kv.put("ns", b"k", b"s" * 10, metadata=META, quota=Quota(("ns",), used, "o"))
    with pytest.raises(LimitExceeded, match=f"{grows} more would pass its quota"):
        kv.put("ns", b"k", b"s" * 10, metadata=META,
               quota=Quota(("ns",), used + grows - 1, "o"))
    assert kv.get_entry("ns", b"k").metadata is None and kv.usage(["ns"]) == used
    kv.put("ns", b"k", b"s" * 10, metadata=META, quota=Quota(("ns",), used + grows, "o"))
    assert kv.usage(["ns"]) == used + grows == counted(kv)
    # dropping the metadata again frees it: passes even over the quota
    kv.put("ns", b"k", b"s" * 10, quota=Quota(("ns",), 1, "o"))
    assert kv.usage(["ns"]) == 1 + HEAD + 10 == counted(kv)


def test_a_write_at_exactly_the_quota_passes_one_byte_more_does_not(kv: KVStore) -> None:
    """New keys and replacements with metadata: `used + adding == limit` passes."""
    kv.put("ns", b"a", b"x" * 100)
    used = kv.usage(["ns"])
    new = 2 + HEAD + META_LEN + 50  # key "bb", head, metadata, value
    with pytest.raises(LimitExceeded, match=f"{new} more would pass"):
        kv.put("ns", b"bb", b"v" * 50, metadata=META, quota=Quota(("ns",), used + new - 1, "o"))
    kv.put("ns", b"bb", b"v" * 50, metadata=META, quota=Quota(("ns",), used + new, "o"))
    assert kv.usage(["ns"]) == used + new == counted(kv)
    used = kv.usage(["ns"])
    grows = (HEAD + META_LEN + 100) - (HEAD + 100)  # "a" gains metadata
    with pytest.raises(LimitExceeded, match=f"{grows} more would pass"):
        kv.put("ns", b"a", b"x" * 100, metadata=META,
               quota=Quota(("ns",), used + grows - 1, "o"))
    kv.put("ns", b"a", b"x" * 100, metadata=META, quota=Quota(("ns",), used + grows, "o"))
    assert kv.usage(["ns"]) == used + grows == counted(kv)


def test_increment_counts_its_digits_and_the_metadata_it_keeps(kv: KVStore) -> None:
    """A new counter counts its key, head and digits; one that keeps metadata grows
    by a byte from 9 to 10, and that byte is held to the quota too."""
    with pytest.raises(LimitExceeded, match="22 more would pass its quota of 21 bytes"):
        kv.increment("ns", b"n", quota=Quota(("ns",), 21, "o"))  # 1 + 20 + len(b"1")
    assert kv.increment("ns", b"n", quota=Quota(("ns",), 22, "o")) == 1
    kv.put("ns", b"c", b"9", metadata=META)
    used = kv.usage(["ns"])
    with pytest.raises(LimitExceeded, match="1 more would pass"):
        kv.increment("ns", b"c", quota=Quota(("ns",), used, "o"))
    assert kv.get_entry("ns", b"c").value == b"9"
    assert kv.increment("ns", b"c", quota=Quota(("ns",), used + 1, "o")) == 10
    assert kv.get_entry("ns", b"c").metadata == META
    assert kv.usage(["ns"]) == used + 1 == counted(kv)
