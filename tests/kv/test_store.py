"""KV store: unit cases, a stateful property test against a dict model, bad input."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import lmdb
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from edgefn_core.errors import InvalidValue, LimitExceeded, StoreClosed, UnknownNamespace
from kv import KVStore
from kv.quota import Quota
from kv.store import MAX_TTL_S, Entry, KeyInfo, Limits, Page, _ttl_key


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = KVStore(tmp_path / "kv", clock=Clock())
    s.create_namespace("ns")
    yield s
    s.close()


def test_ttl_expiry_hides_and_purge_reclaims(store: KVStore) -> None:
    clock: Clock = store.clock  # type: ignore[assignment]
    store.put("ns", b"short", b"1", ttl=10)
    store.put("ns", b"long", b"2", ttl=100)
    store.put("ns", b"forever", b"3")
    clock.now += 11
    assert store.get("ns", b"short") is None
    assert [k.key for k in store.list("ns").keys] == [b"forever", b"long"]
    assert store.stats()["namespaces"]["ns"] == 3  # still on disk until purged
    assert store.purge_expired() == 1
    assert store.stats()["namespaces"]["ns"] == 2
    store.put("ns", b"long", b"again")  # rewrite without ttl: no longer expires
    clock.now += 1000
    assert store.purge_expired() == 0 and store.get("ns", b"long") == b"again"


def test_only_an_empty_namespace_is_removed(store: KVStore) -> None:
    """What a failed deploy created for its warm-up goes with it, unless a write was
    acknowledged in it meanwhile (an `edgefn kv put` during the warm-up was lost)."""
    clock: Clock = store.clock  # type: ignore[assignment]
    store.create_namespace("gone")
    store.create_namespace("written")
    store.put("written", b"k", b"v", ttl=10)
    store.put("ns", b"k", b"v", ttl=10)
    kept = store.remove_empty_namespaces(["gone", "written", "never-was"])
    assert kept == ["written"] and store.namespaces() == ["ns", "written"]
    assert store.get("written", b"k") == b"v" and store.usage(["gone"]) == 0
    with pytest.raises(UnknownNamespace):
        store.get("gone", b"k")
    clock.now += 11
    assert store.purge_expired() == 2  # ns's and written's
    assert store.remove_empty_namespaces(["written"]) == []  # empty now: it goes
    assert store.namespaces() == ["ns"]


def test_prefix_listing_with_cursor_pages(store: KVStore) -> None:
    for i in range(25):
        store.put("ns", b"user:%03d" % i, b"x", metadata={"i": i})
    store.put("ns", b"other", b"x")
    seen: list[bytes] = []
    cursor = None
    while True:
        page = store.list("ns", b"user:", cursor, limit=10)
        seen += [k.key for k in page.keys]
        assert all(k.metadata == {"i": int(k.key[5:])} for k in page.keys)
        if page.cursor is None:
            break
        cursor = page.cursor
    assert seen == [b"user:%03d" % i for i in range(25)]
    with pytest.raises(InvalidValue, match=r"^cursor does not belong to this prefix$"):
        store.list("ns", b"zzz", page_cursor(store))
    with pytest.raises(InvalidValue, match=r"^invalid cursor 'a'$"):
        store.list("ns", b"user:", "a")
    for bad in ("!!!", "dXNlcjowMDE=!", "===="):  # were decoded leniently: b"" began again
        with pytest.raises(InvalidValue, match=r"^invalid cursor "):
            store.list("ns", b"", bad)


def test_a_list_reads_past_a_bounded_number_of_expired_keys(tmp_path: Path) -> None:
    """`list` skipped expired keys without counting them: one ``list("", None, 1)``
    read every expired key not purged yet (240k: 150-200 ms a call)."""
    clock = Clock()
    s = KVStore(tmp_path / "kv", clock=clock, sync=False, limits=Limits(max_list_expired=10))
    s.create_namespace("ns")
    s.put("ns", b"a", b"x")
    s.batch([("put", "ns", b"b%02d" % i, b"", {"ttl": 1}) for i in range(25)])
    s.put("ns", b"c", b"x")
    clock.now += 2
    pages = []
    cursor = None
    while True:
        page = s.list("ns", b"", cursor, limit=2)
        pages.append([k.key for k in page.keys])
        if page.cursor is None:
            break
        cursor = page.cursor
    # [a, then 10 expired: cut], [10 expired: cut], [5 expired, c]
    assert pages == [[b"a"], [], [b"c"]]
    assert s.list("ns", b"b").keys == [] and s.list("ns", b"b").cursor is not None
    assert s.list("ns", b"b", s.list("ns", b"b").cursor).cursor is not None
    assert s.purge_expired() == 25 and s.list("ns", b"b") == Page()
    s.close()


def page_cursor(store: KVStore) -> str:
    cursor = store.list("ns", b"user:", limit=1).cursor
    assert cursor is not None
    return cursor


def test_cas_with_a_version_from_before_a_delete_fails(store: KVStore) -> None:
    v1 = store.put("ns", b"k", b"a")
    store.delete("ns", b"k")
    store.put("ns", b"k", b"b")  # a new key with the same name
    assert store.cas("ns", b"k", v1, b"stale write") is None
    assert store.get("ns", b"k") == b"b"


def test_cas_and_increment(store: KVStore) -> None:
    assert store.cas("ns", b"k", None, b"a") == 1  # create-only
    assert store.cas("ns", b"k", None, b"b") is None
    assert store.cas("ns", b"k", 1, b"c") == 2
    assert store.cas("ns", b"k", 1, b"d") is None
    assert store.get("ns", b"k") == b"c"
    assert [store.increment("ns", b"n") for _ in range(3)] == [1, 2, 3]
    assert store.increment("ns", b"n", -10) == -7
    with pytest.raises(InvalidValue, match="cannot increment key 'k' in 'ns': its value is not "
                                           "a decimal integer"):  # the key as text, not b'k'
        store.increment("ns", b"k")
    for loose in (b" 1_000 ", b"1_000", b"\xd9\xa1", b"", b"1e3", b"0x10"):  # int() took some
        store.put("ns", b"loose", loose)
        with pytest.raises(InvalidValue, match="not a decimal integer"):
            store.increment("ns", b"loose")
    store.put("ns", b"signed", b"+41")
    assert store.increment("ns", b"signed") == 42
    store.put("ns", b"max", str((1 << 63) - 1).encode())
    with pytest.raises(InvalidValue, match="would leave the 64-bit signed range"):
        store.increment("ns", b"max")  # a WASM guest saw it wrap to -2**63
    assert store.increment("ns", b"max", -1) == (1 << 63) - 2
    with pytest.raises(InvalidValue, match="64-bit"):
        store.increment("ns", b"min", -(1 << 63) - 1)


def test_batch_is_atomic(store: KVStore) -> None:
    assert store.batch([("put", "ns", b"a", b"1"), ("increment", "ns", b"c", 2),
                        ("get", "ns", b"a"), ("delete", "ns", b"a")]) == [1, 2, b"1", True]
    with pytest.raises(UnknownNamespace):
        store.batch([("put", "ns", b"x", b"1"), ("put", "nope", b"y", b"2")])
    assert store.get("ns", b"x") is None  # the first op was rolled back


def test_bad_input_gets_clear_errors(tmp_path: Path) -> None:
    s = KVStore(tmp_path / "kv", limits=Limits(max_value_bytes=100))
    s.create_namespace("ns")
    with pytest.raises(UnknownNamespace, match="unknown namespace 'missing'"):
        s.get("missing", b"k")
    with pytest.raises(LimitExceeded, match="exceeds the limit of 100 bytes"):
        s.put("ns", b"k", b"x" * 101)
    with pytest.raises(LimitExceeded, match="keys must be 1 to 511 bytes"):
        s.put("ns", b"k" * 600, b"x")
    with pytest.raises(LimitExceeded, match="metadata"):
        s.put("ns", b"k", b"x", metadata={"big": "y" * 2000})
    for ttl in (0, -1, float("nan"), float("inf"), 1e30):
        with pytest.raises(InvalidValue, match="ttl must be a number of seconds above 0"):
            s.put("ns", b"k", b"x", ttl=ttl)
    # an empty key: LMDB's own error (MDB_BAD_VALSIZE) named nothing
    with pytest.raises(InvalidValue, match="key of 0 bytes in 'ns': keys must be 1 to 511"):
        s.get("ns", b"")
    with pytest.raises(InvalidValue, match="key of 0 bytes in 'ns': keys must be 1 to 511"):
        s.delete("ns", b"")
    assert s.get("ns", b"k" * 512) is None and not s.delete("ns", b"k" * 512)  # never stored
    for write in (lambda k: s.increment("ns", k), lambda k: s.cas("ns", k, None, b"x"),
                  lambda k: s.cas("ns", k, 1, b"x"), lambda k: s.batch([("increment", "ns",
                                                                            k, 1)])):
        with pytest.raises(InvalidValue, match="key of 0 bytes in 'ns': keys must be 1 to"):
            write(b"")  # (LMDB's MDB_BAD_VALSIZE)
        with pytest.raises(LimitExceeded, match="key of 512 bytes in 'ns': keys must be 1"):
            write(b"k" * 512)  # (a cas said None: "someone else wrote first")
    with pytest.raises(InvalidValue, match="invalid namespace name"):
        s.create_namespace("Bad Name")
    with pytest.raises(LimitExceeded, match="batch of 1001 ops"):
        s.batch([("get", "ns", b"k")] * 1001)
    assert s.get("ns", b"k") is None  # nothing was written by the failures
    with pytest.raises(InvalidValue, match=r"^unknown batch op 'nope'$"):
        s.batch([("nope", "ns", b"k")])
    s.close()
    with pytest.raises(StoreClosed, match=r"^KV store is closed$"):
        s.get("ns", b"k")


KEYS = st.sampled_from([b"a", b"b", b"ab", b"abc", b"b1", b"c"])


class KVModel(RuleBasedStateMachine):
    """The store against a dict {key: (value, version, expires_at)} with a fake clock."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp()
        self.clock = Clock()
        # pages cut short after 2 expired keys: their cursors must still give every key
        self.store = KVStore(self.dir, clock=self.clock, sync=False,
                             limits=Limits(max_list_expired=2))
        self.store.create_namespace("m")
        self.model: dict[bytes, tuple[bytes, int, float | None]] = {}
        self.counter = 0  # the namespace's version counter

    def live(self) -> dict[bytes, tuple[bytes, int, float | None]]:
        return {k: v for k, v in self.model.items() if v[2] is None or v[2] > self.clock.now}

    def _write(self, key: bytes, value: bytes, ttl: float | None) -> int:
        self.counter += 1  # every write, of any key, takes the next version
        self.model[key] = (value, self.counter, self.clock.now + ttl if ttl else None)
        return self.counter

    @rule(key=KEYS, value=st.binary(max_size=20), ttl=st.none() | st.integers(1, 50))
    def put(self, key: bytes, value: bytes, ttl: int | None) -> None:
        assert self.store.put("m", key, value, ttl=ttl) == self._write(key, value, ttl)

    @rule(key=KEYS)
    def delete(self, key: bytes) -> None:
        existed = key in self.live()
        self.model.pop(key, None)
        assert self.store.delete("m", key) == existed

    @rule(key=KEYS, value=st.binary(max_size=5), guess=st.none() | st.integers(1, 4))
    def cas(self, key: bytes, value: bytes, guess: int | None) -> None:
        current = self.live().get(key)
        expected = (current[1] if current else None) if guess is None else guess
        ok = (current[1] if current else None) == expected
        got = self.store.cas("m", key, expected, value)
        assert got == (self._write(key, value, None) if ok else None)

    @rule(key=KEYS, delta=st.integers(-5, 5))
    def increment(self, key: bytes, delta: int) -> None:
        current = self.live().get(key)
        # a decimal integer: a sign, then ASCII digits only (int() also takes b"\t0")
        if current and not re.fullmatch(rb"[-+]?[0-9]+", current[0]):
            with pytest.raises(InvalidValue):
                self.store.increment("m", key, delta)
            return
        base = int(current[0]) if current else 0
        ttl = current[2] - self.clock.now if current and current[2] else None
        result = self.store.increment("m", key, delta)
        assert result == base + delta
        self._write(key, str(base + delta).encode(), ttl)

    @rule(seconds=st.integers(1, 30))
    def tick(self, seconds: int) -> None:
        self.clock.now += seconds

    @precondition(lambda self: True)
    @rule()
    def purge(self) -> None:
        self.store.purge_expired()

    @rule(prefix=st.sampled_from([b"", b"a", b"ab", b"b", b"z"]), limit=st.integers(1, 4))
    def list_prefix(self, prefix: bytes, limit: int) -> None:
        got, cursor = [], None
        while True:
            page = self.store.list("m", prefix, cursor, limit)
            got += [(k.key, k.version) for k in page.keys]
            if page.cursor is None:
                break
            cursor = page.cursor
        want = sorted((k, v[1]) for k, v in self.live().items() if k.startswith(prefix))
        assert got == want

    @invariant()
    def reads_match(self) -> None:
        live = self.live()
        for key in (b"a", b"b", b"ab", b"abc", b"b1", b"c"):
            entry = self.store.get_entry("m", key)
            if key in live:
                assert entry is not None and (entry.value, entry.version) == live[key][:2]
            else:
                assert entry is None

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestKVModel = KVModel.TestCase
TestKVModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_review_regressions(tmp_path: Path) -> None:
    clock = Clock()
    s = KVStore(tmp_path / "kv", clock=clock, limits=Limits(max_value_bytes=10))
    s.create_namespace("ns")
    s.close()
    s = KVStore(tmp_path / "kv", clock=clock, limits=Limits(max_value_bytes=10))
    with pytest.raises(LimitExceeded):  # an aborted first write must not break the namespace
        s.put("ns", b"k", b"x" * 11)
    assert s.put("ns", b"k", b"1", ttl=10) == 1 and s.get("ns", b"k") == b"1"
    before = s.get_entry("ns", b"k")
    s.increment("ns", b"k")
    after = s.get_entry("ns", b"k")
    assert before and after and after.expires_at == before.expires_at  # expiry kept exactly
    with pytest.raises(InvalidValue, match="limit must be"):
        s.list("ns", limit=0)
    s.close()


def ttl_index_size(store: KVStore) -> int:
    """Entries in the expiry index: each is one key's expiry until it is purged."""
    with store.env.begin() as txn:
        entries: int = txn.stat(store._ttl)["entries"]
        return entries


def test_limits_are_inclusive(tmp_path: Path) -> None:
    s = KVStore(tmp_path / "kv", limits=Limits(max_value_bytes=100), sync=False)
    s.create_namespace("x" * 64)
    for name in ("", "x" * 65, "__ttl__", "a/b"):
        with pytest.raises(InvalidValue, match="invalid namespace name"):
            s.create_namespace(name)
    s.put("x" * 64, b"k" * 511, b"v" * 100, metadata={"m": "y" * 1016})  # 1024 bytes of JSON
    with pytest.raises(LimitExceeded, match="key of 512 bytes"):
        s.put("x" * 64, b"k" * 512, b"v")
    with pytest.raises(LimitExceeded, match="metadata of 1025 bytes"):
        s.put("x" * 64, b"k", b"v", metadata={"m": "y" * 1017})
    assert s.batch([("get", "x" * 64, b"k")] * 1000) == [None] * 1000
    assert len(s.list("x" * 64, limit=1000).keys) == 1
    s.batch([("put", "x" * 64, b"%03d" % i, b"v") for i in range(100)])
    page = s.list("x" * 64)  # 100 keys a page by default
    assert len(page.keys) == 100 and page.cursor is not None
    with pytest.raises(InvalidValue, match=r"limit must be 1\.\.1000, got 1001"):
        s.list("x" * 64, limit=1001)
    s.close()


def test_namespaces_fit_in_the_databases_opened_for_them(tmp_path: Path) -> None:
    with KVStore(tmp_path / "two", max_namespaces=2, sync=False) as s:
        s.create_namespace("a")
        s.create_namespace("b")
        with pytest.raises(lmdb.DbsFullError):
            s.create_namespace("c")
    with KVStore(tmp_path / "default", sync=False) as s:
        for i in range(126):
            s.create_namespace(f"n{i}")
        with pytest.raises(lmdb.DbsFullError):
            s.create_namespace("one-too-many")


def test_map_size_and_a_nested_path(tmp_path: Path) -> None:
    with KVStore(tmp_path / "a" / "b" / "kv") as s:
        assert s.stats() == {"map_size": 1 << 30, "namespaces": {}}
    with KVStore(tmp_path / "small", map_size=1 << 24) as s:
        assert s.stats()["map_size"] == 1 << 24


def test_expiry_is_exact_to_the_millisecond(store: KVStore) -> None:
    clock: Clock = store.clock  # type: ignore[assignment]
    start = clock.now
    store.put("ns", b"gone", b"1", ttl=10)
    store.put("ns", b"del", b"2", ttl=10)
    store.put("ns", b"cas", b"3", ttl=10)
    store.put("ns", b"tiny", b"4", ttl=0.0001)  # rounds up to one millisecond
    store.put("ns", b"half", b"5", ttl=0.5)
    assert store.get_entry("ns", b"tiny").expires_at == start + 0.001  # type: ignore[union-attr]
    assert [(k.key, k.expires_at) for k in store.list("ns").keys] == [
        (b"cas", start + 10), (b"del", start + 10), (b"gone", start + 10),
        (b"half", start + 0.5), (b"tiny", start + 0.001)]
    clock.now = start + 10  # the expiry instant itself: expired
    assert store.get("ns", b"gone") is None and store.list("ns").keys == []
    assert store.delete("ns", b"del") is False
    assert store.cas("ns", b"cas", None, b"new") is not None  # absent, so create-only wins
    assert store.get_entry("ns", b"cas").expires_at is None  # type: ignore[union-attr]
    assert ttl_index_size(store) == 3  # gone, tiny, half: the others were rewritten or deleted
    assert store.purge_expired() == 3
    assert ttl_index_size(store) == 0 and store.stats()["namespaces"]["ns"] == 1


def test_overwriting_or_deleting_a_key_drops_its_old_expiry(store: KVStore) -> None:
    clock: Clock = store.clock  # type: ignore[assignment]
    store.put("ns", b"a", b"1", ttl=10)
    store.put("ns", b"b", b"1", ttl=10)
    store.put("ns", b"a", b"2", ttl=20)
    assert ttl_index_size(store) == 2
    store.put("ns", b"a", b"3")
    store.delete("ns", b"b")
    assert ttl_index_size(store) == 0
    clock.now += 100
    assert store.purge_expired() == 0 and store.get("ns", b"a") == b"3"


def test_metadata_and_expiry_survive_every_kind_of_write(store: KVStore) -> None:
    now = store.clock()
    meta = {"i": 1, "tag": "x"}
    store.put("ns", b"p", b"value", ttl=5, metadata=meta)
    assert store.get_entry("ns", b"p") == Entry(b"value", 1, now + 5, meta)
    assert store.list("ns").keys == [KeyInfo(b"p", 1, now + 5, meta)]
    assert store.cas("ns", b"c", None, b"v", ttl=7, metadata=meta) == 2
    assert store.get_entry("ns", b"c") == Entry(b"v", 2, now + 7, meta)
    store.put("ns", b"n", b"41", ttl=9, metadata=meta)
    assert store.increment("ns", b"n") == 42
    assert store.get_entry("ns", b"n") == Entry(b"42", 4, now + 9, meta)
    assert store.increment("ns", b"fresh", 1, initial=10) == 11
    store.put("ns", b"e", b"v", metadata={})  # empty metadata is no metadata
    assert store.get_entry("ns", b"e").metadata is None  # type: ignore[union-attr]
    assert store.batch([
        ("put", "ns", b"b", b"7", {"ttl": 3, "metadata": meta}),
        ("get", "ns", b"b"), ("get", "ns", b"missing"), ("increment", "ns", b"b"),
    ]) == [7, b"7", None, 8]
    assert store.get_entry("ns", b"b") == Entry(b"8", 8, now + 3, meta)


def test_a_reopened_store_keeps_records_and_version_counters(tmp_path: Path) -> None:
    with KVStore(tmp_path / "kv") as s:
        s.create_namespace("ns")
        assert s.put("ns", b"k", b"v", metadata={"a": 1}) == 1
        s.create_namespace("ns")  # again: a no-op, the counter is kept
        assert s.put("ns", b"j", b"w") == 2
    with KVStore(tmp_path / "kv") as s:
        assert s.namespaces() == ["ns"]
        assert s.get_entry("ns", b"k") == Entry(b"v", 1, None, {"a": 1})
        assert s.put("ns", b"k", b"x") == 3


CREATE_LATE = """
import sys
from kv import KVStore
with KVStore(sys.argv[1]) as s:
    s.create_namespace("late")
    s.put("late", b"k", b"v", ttl=60)
    s.put("late", b"t", b"v", ttl=60)
"""


def test_a_namespace_another_process_created_serves_every_operation(tmp_path: Path) -> None:
    clock = Clock()
    s = KVStore(tmp_path / "kv", clock=clock, limits=Limits(max_value_bytes=10))
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    subprocess.run([sys.executable, "-c", CREATE_LATE, str(tmp_path / "kv")], env=env,
                   check=True, timeout=60)
    # the child's TTLs count from its own clock: read it after it wrote (under `make
    # mutate` its start took over a second, and nothing had expired 61 s after the start)
    clock.now = time.time()
    # Writes first: each opens the namespace inside its own transaction.
    with pytest.raises(LimitExceeded):  # an aborted write leaves no dead handle behind
        s.put("late", b"big", b"x" * 11)
    assert s.put("late", b"w", b"1") == 3
    assert s.cas("late", b"c", None, b"1") == 4
    assert s.increment("late", b"n") == 1
    assert s.delete("late", b"w") is True
    assert s.batch([("put", "late", b"b", b"1"), ("get", "late", b"k"),
                    ("increment", "late", b"b", 2), ("delete", "late", b"b")]) == [6, b"v", 3, True]
    clock.now += 61
    assert s.purge_expired() == 2
    assert s.get("late", b"n") == b"1" and s.get("late", b"k") is None
    s.close()


def test_open_known_opens_what_another_process_created_and_skips_the_rest(
        tmp_path: Path) -> None:
    """What a worker following a deploy calls (`Bindings.prepare(create=False)`), off
    its loop: no read on a request's path then opens a handle."""
    s = KVStore(tmp_path / "kv")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    subprocess.run([sys.executable, "-c", CREATE_LATE, str(tmp_path / "kv")], env=env,
                   check=True, timeout=60)
    assert "late" not in s._dbs
    s.open_known(["late", "never"])
    assert "late" in s._dbs and "never" not in s._dbs
    assert s.get("late", b"k") == b"v"
    s.close()


def test_a_stored_version_s_bindings_open_its_namespaces_handles(tmp_path: Path) -> None:
    """`Bindings.prepare(create=False)` (a worker loading a version another process
    deployed, in a thread): the handles of its namespaces are open when it returns."""
    from runtime.bindings import Bindings, Stores
    from runtime.functions import manifest
    from tests.support import python_function

    stores = Stores(tmp_path / "data")
    try:
        kv = stores.kv  # opened now, before the namespace exists
        root = Path(__file__).resolve().parents[2]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
        subprocess.run([sys.executable, "-c", CREATE_LATE, str(tmp_path / "data" / "kv")],
                       env=env, check=True, timeout=60)
        d = python_function(tmp_path, "f", "", extra='[bindings]\nkv = ["late"]')
        Bindings.prepare(stores, manifest.load(d), create=False)
        assert "late" in kv._dbs
    finally:
        stores.close()


FIRST_GET_DURING_A_WRITE = """
import sys, threading, time
from kv import KVStore
s = KVStore(sys.argv[1])  # opened before another process created "late"
print("open", flush=True)
sys.stdin.readline()  # "late" was created meanwhile
ready = threading.Event()
def writer():  # a binding thread: holds the writer lock, then needs the GIL to commit
    with s.env.begin(write=True) as txn:
        ready.set()
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            pass
        txn.put(b"x", b"1")
t = threading.Thread(target=writer)
t.start()
ready.wait()
print(s.get("late", b"k"))  # the first get of "late" opens its handle meanwhile
t.join()
s.close()
"""


def test_the_first_get_of_a_namespace_created_elsewhere_waits_out_our_own_writer(
        tmp_path: Path) -> None:
    """A worker that follows a deploy opens a namespace another process created at
    its first get. py-lmdb's open_db without a transaction took the writer lock holding
    the GIL while one of the worker's binding threads held the lock, waiting for the
    GIL: both waited for good (the worker froze, every process's KV writes with it)."""
    KVStore(tmp_path / "kv").close()
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    child = subprocess.Popen([sys.executable, "-c", FIRST_GET_DURING_A_WRITE,
                              str(tmp_path / "kv")], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"open\n"
        subprocess.run([sys.executable, "-c", CREATE_LATE, str(tmp_path / "kv")], env=env,
                       check=True, timeout=60)
        out, _ = child.communicate(b"go\n", timeout=20)  # frozen: past this
    finally:
        child.kill()
    assert (child.returncode, out) == (0, b"b'v'\n")


# -- from kv/store.py's surviving mutants ---------------------------------------------------
def test_a_key_of_exactly_the_key_limit_reads_and_deletes(store: KVStore) -> None:
    """511 bytes is a key like any other: a get returns it and a delete removes it (only a
    longer key is "never stored", read as absent without asking LMDB)."""
    key = b"k" * 511
    store.put("ns", key, b"v")
    assert store.get("ns", key) == b"v"
    assert store.delete("ns", key) is True
    assert store.get("ns", key) is None


def test_the_ttl_and_the_counter_s_range_include_their_bounds(store: KVStore) -> None:
    """A ttl of exactly 10 years is allowed, and an increment may reach -2**63, the least
    64-bit signed integer; past it, the error names the key, the namespace and the delta."""
    now = store.clock()
    store.put("ns", b"decade", b"v", ttl=MAX_TTL_S)
    assert store.get_entry("ns", b"decade") == Entry(b"v", 1, now + MAX_TTL_S)
    assert store.increment("ns", b"min", -(1 << 63)) == -(1 << 63)
    assert store.get("ns", b"min") == str(-(1 << 63)).encode()
    with pytest.raises(InvalidValue, match=r"^cannot increment key 'min' in 'ns' by -1: the "
                                           r"result would leave the 64-bit signed range$"):
        store.increment("ns", b"min", -1)


def test_error_messages_name_the_namespace_and_the_key(store: KVStore) -> None:
    """A put's empty key (with a quota or without) names its namespace; a key that is not
    UTF-8 is shown as bytes; a purge batch under 1 says what it got."""
    quota = Quota(("ns",), 1 << 20, "o")
    for q in (None, quota):
        with pytest.raises(InvalidValue, match=r"^key of 0 bytes in 'ns': keys must be 1 to "
                                               r"511 bytes$"):
            store.put("ns", b"", b"v", quota=q)
    store.put("ns", b"\xff", b"text")
    with pytest.raises(InvalidValue, match=r"^cannot increment key b'\\xff' in 'ns': its "
                                           r"value is not a decimal integer$"):
        store.increment("ns", b"\xff")
    with pytest.raises(InvalidValue, match=r"^a purge batch is at least 1 key, got 0$"):
        store.purge_expired(batch=0)


def test_a_quota_counts_what_each_kind_of_write_adds(tmp_path: Path) -> None:
    """Under a quota a write counts what usage is charged: the key and the whole new
    record (its 20-byte head and metadata included), less the key and record it replaces:
    a rewrite that adds nothing passes even over the quota, one byte more does not; an
    increment counts its key, head and digits; a cas is checked like a put; a value of
    exactly `max_value_bytes` is not "past its limit"."""
    s = KVStore(tmp_path / "kv", sync=False, limits=Limits(max_value_bytes=100))
    s.create_namespace("ns")
    s.create_namespace("q")
    assert s.put("ns", b"k", b"x" * 10) == 1  # a 30-byte record
    used = s.usage(["ns"])
    assert used == 1 + 30
    over = Quota(("ns",), used - 1, "o")  # lowered under what the namespace holds
    s.put("ns", b"k", b"y" * 10, quota=over)  # 1 + 30 added, 1 + 30 replaced
    assert s.get("ns", b"k") == b"y" * 10
    at = Quota(("ns",), s.usage(["ns"]), "o")
    with pytest.raises(LimitExceeded, match="1 more would pass its quota"):
        s.put("ns", b"k", b"z" * 11, quota=at)  # 1 + 31 added, 1 + 30 replaced
    assert s.get("ns", b"k") == b"y" * 10
    with pytest.raises(LimitExceeded, match="24 more would pass its quota of 0 bytes"):
        s.cas("ns", b"new", None, b"v", quota=Quota(("ns",), 0, "o"))  # 3 + 20 + 1
    assert s.get("ns", b"new") is None
    with pytest.raises(LimitExceeded, match="22 more would pass its quota of 21 bytes"):
        s.increment("q", b"n", quota=Quota(("q",), 21, "o"))  # 1 + 20 + len(b"1")
    assert s.increment("q", b"n", quota=Quota(("q",), 22, "o")) == 1
    s.put("q", b"big", b"v" * 100, quota=Quota(("q",), 1 << 20, "o"))
    assert s.get("q", b"big") == b"v" * 100
    s.close()


def test_check_room_counts_only_the_new_namespaces_and_names_five(tmp_path: Path) -> None:
    """`max_namespaces` is inclusive; the refusal names at most five of the namespaces that
    would not fit, in order, with "..." only where there are more."""
    with KVStore(tmp_path / "kv", sync=False, max_namespaces=5) as s:
        s.create_namespace("ns")
        s.check_room(["ns", "a", "b", "c", "d"])  # 1 + 4 = 5: fits
        with pytest.raises(LimitExceeded, match=r"^the KV store holds at most 5 namespaces "
                                                r"and has 1; 5 more would not fit "
                                                r"\(a, b, c, d, e\)$"):
            s.check_room(["e", "d", "c", "b", "a", "ns"])
        with pytest.raises(LimitExceeded, match=r"; 6 more would not fit "
                                                r"\(a, b, c, d, e, \.\.\.\)$"):
            s.check_room(["f", "e", "d", "c", "b", "a"])


def test_a_cursor_is_url_safe_base64(store: KVStore) -> None:
    """A cursor is the last key in URL-safe base64 ("-" and "_"), and is read back so."""
    keys = [b"\xfb\xff" + bytes([i]) for i in range(3)]
    for key in keys:
        store.put("ns", key, b"v")
    seen, cursor = [], None
    while True:
        page = store.list("ns", b"\xfb", cursor, limit=1)
        seen += [k.key for k in page.keys]
        if page.cursor is None:
            break
        assert "-" in page.cursor or "_" in page.cursor
        cursor = page.cursor
    assert seen == keys


def test_a_page_ends_short_at_exactly_max_list_expired_expired_keys(tmp_path: Path) -> None:
    """Fewer expired keys than `max_list_expired` are read past within one page; as many
    end the page there, with a cursor."""
    clock = Clock()
    with KVStore(tmp_path / "kv", clock=clock, sync=False,
                 limits=Limits(max_list_expired=3)) as s:
        s.create_namespace("ns")
        s.batch([("put", "ns", b"a%d" % i, b"", {"ttl": 1}) for i in range(2)])
        s.batch([("put", "ns", b"b%d" % i, b"", {"ttl": 1}) for i in range(3)])
        s.put("ns", b"a9", b"live")
        s.put("ns", b"b9", b"live")
        clock.now += 2
        assert [k.key for k in s.list("ns", b"a").keys] == [b"a9"]
        assert s.list("ns", b"a").cursor is None
        page = s.list("ns", b"b")
        assert page.keys == [] and page.cursor is not None
        assert [k.key for k in s.list("ns", b"b", page.cursor).keys] == [b"b9"]


def test_a_purge_counts_every_batch_and_gives_back_the_usage(store: KVStore) -> None:
    """`purge_expired` returns the keys of all its batches (`stop` is asked before each
    transaction), a batch may be one key, and the bytes purged keys took are no longer
    counted against their namespace."""
    clock: Clock = store.clock  # type: ignore[assignment]
    store.put("ns", b"live", b"stays")
    live = store.usage(["ns"])
    store.batch([("put", "ns", b"k%d" % i, b"x" * 40, {"ttl": 1}) for i in range(5)])
    assert store.usage(["ns"]) > live
    clock.now += 2
    asked: list[int] = []

    def stop() -> bool:
        asked.append(1)
        return False

    assert store.purge_expired(batch=2, stop=stop) == 5
    assert len(asked) == 3  # 2 + 2 + 1
    assert store.usage(["ns"]) == live
    store.batch([("put", "ns", b"j%d" % i, b"", {"ttl": 1}) for i in range(3)])
    clock.now += 2
    assert store.purge_expired(batch=1) == 3
    assert store.usage(["ns"]) == live and store.get("ns", b"live") == b"stays"


def write_raw(store: KVStore, db: Any, key: bytes, value: bytes) -> None:
    """Write `key` in the store's database `db` with LMDB directly: a state the store's
    own operations never leave (an expiry index or a count out of step with the keys)."""
    with store.env.begin(write=True) as txn:
        txn.put(key, value, db=db)


def test_a_purge_deletes_only_a_key_whose_expiry_is_the_index_s(store: KVStore) -> None:
    """An expiry index entry with no key behind it, or for a key that no longer expires
    then, is dropped by the purge and deletes nothing."""
    clock: Clock = store.clock  # type: ignore[assignment]
    store.put("ns", b"live", b"v")
    soon = store._now_ms() + 1000
    write_raw(store, store._ttl, _ttl_key(soon, "ns", b"live"), b"")
    write_raw(store, store._ttl, _ttl_key(soon, "ns", b"absent"), b"")
    store.put("ns", b"due", b"v", ttl=1)
    clock.now += 2
    assert store.purge_expired() == 1  # "due" only
    assert store.get("ns", b"live") == b"v" and ttl_index_size(store) == 0


def test_removing_namespaces_skips_unknown_and_kept_ones_in_any_order(store: KVStore) -> None:
    """An unknown name or a namespace that holds keys, listed first, does not stop the
    empty ones after it from going."""
    store.create_namespace("empty")
    store.create_namespace("also-empty")
    store.put("ns", b"k", b"v")
    assert store.remove_empty_namespaces(["never-was", "ns", "empty", "also-empty"]) == ["ns"]
    assert store.namespaces() == ["ns"]


def test_a_removed_namespace_frees_its_database_for_another(tmp_path: Path) -> None:
    """A removed namespace's LMDB database is deleted, not just emptied: its slot among
    the store's `max_namespaces` takes a new namespace."""
    with KVStore(tmp_path / "kv", max_namespaces=2, sync=False) as s:
        s.create_namespace("a")
        s.create_namespace("b")
        assert s.remove_empty_namespaces(["b"]) == []
        s.create_namespace("c")
        s.put("c", b"k", b"v")
        assert s.namespaces() == ["a", "c"] and s.get("c", b"k") == b"v"


def test_a_removed_namespace_takes_its_expiries_and_usage_with_it(store: KVStore) -> None:
    """Whatever is filed under a removed namespace goes with it: an expiry index entry and
    a usage count left behind (written here with LMDB directly) are deleted; the expiry
    entries of other namespaces, whatever their keys' bytes, stay."""
    clock: Clock = store.clock  # type: ignore[assignment]
    store.create_namespace("gone")
    store.put("ns", b"\xff\xfe", b"v", ttl=10)  # not UTF-8
    write_raw(store, store._ttl, _ttl_key(store._now_ms() + 5000, "gone", b"k"), b"")
    write_raw(store, store._usage, b"gone", (123).to_bytes(8, "big"))
    assert store.usage(["gone"]) == 123 and ttl_index_size(store) == 2
    assert store.remove_empty_namespaces(["gone"]) == []
    assert ttl_index_size(store) == 1 and store.usage(["gone"]) == 0
    store.create_namespace("gone")
    assert store.usage(["gone"]) == 0
    clock.now += 11
    assert store.purge_expired() == 1 and ttl_index_size(store) == 0


def run_child(script: str, path: Path) -> None:
    """Run `script` with `path` as its argument in another Python process, on this tree."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    subprocess.run([sys.executable, "-c", script, str(path)], env=env, check=True, timeout=60)


CREATE_EMPTY_AND_FULL = """
import sys
from kv import KVStore
with KVStore(sys.argv[1]) as s:
    s.create_namespace("empty")
    s.create_namespace("full")
    s.put("full", b"k", b"v")
"""


def test_namespaces_another_process_created_take_quotas_and_are_removed(
        tmp_path: Path) -> None:
    """Namespaces created by another process since this store opened (no handle of them
    here yet): a write under a quota opens its handle in its own transaction, and
    removing them opens theirs in the removal's, dropping the empty one only."""
    s = KVStore(tmp_path / "kv")
    run_child(CREATE_EMPTY_AND_FULL, tmp_path / "kv")
    assert s.put("full", b"q", b"v", quota=Quota(("full",), 1 << 20, "o")) == 2
    assert s.remove_empty_namespaces(["empty", "full"]) == ["full"]
    assert s.namespaces() == ["full"]
    with pytest.raises(UnknownNamespace):
        s.get("empty", b"k")
    assert s.get("full", b"k") == b"v" and s.get("full", b"q") == b"v"
    s.close()
    with KVStore(tmp_path / "kv") as again:
        assert again.namespaces() == ["full"]


HOLD_THE_WRITER_LOCK = """
import sys
import lmdb
env = lmdb.open(sys.argv[1], max_dbs=200)
txn = env.begin(write=True)
print("held", flush=True)
sys.stdin.readline()
txn.abort()
"""


def test_a_read_of_an_opened_namespace_never_waits_for_a_writer(tmp_path: Path) -> None:
    """Once a namespace's handle is open (here: created by this store), a get does not
    wait while another process holds the writer lock: the handle is not opened again."""
    s = KVStore(tmp_path / "kv")
    s.create_namespace("ns")
    s.put("ns", b"k", b"v")
    child = subprocess.Popen([sys.executable, "-c", HOLD_THE_WRITER_LOCK, str(tmp_path / "kv")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    got: list[bytes | None] = []
    done = threading.Event()

    def read() -> None:
        got.append(s.get("ns", b"k"))
        done.set()

    reader = threading.Thread(target=read)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"held\n"
        reader.start()
        read_while_held = done.wait(10)
    finally:
        child.communicate(b"go\n", timeout=20)
    if reader.ident is not None:
        reader.join(20)
    s.close()
    assert read_while_held and got == [b"v"]
