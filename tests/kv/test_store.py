"""KV store: unit cases, a stateful property test against a dict model, bad input."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from edgefn_core.errors import InvalidValue, LimitExceeded, StoreClosed, UnknownNamespace
from kv import KVStore
from kv.store import Limits


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
    with pytest.raises(InvalidValue, match="cursor does not belong"):
        store.list("ns", b"zzz", page_cursor(store))


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
    with pytest.raises(InvalidValue, match="not a decimal integer"):
        store.increment("ns", b"k")


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
    with pytest.raises(InvalidValue, match="ttl must be positive"):
        s.put("ns", b"k", b"x", ttl=0)
    with pytest.raises(InvalidValue, match="invalid namespace name"):
        s.create_namespace("Bad Name")
    with pytest.raises(LimitExceeded, match="batch of 1001 ops"):
        s.batch([("get", "ns", b"k")] * 1001)
    assert s.get("ns", b"k") is None  # nothing was written by the failures
    s.close()
    with pytest.raises(StoreClosed):
        s.get("ns", b"k")


KEYS = st.sampled_from([b"a", b"b", b"ab", b"abc", b"b1", b"c"])


class KVModel(RuleBasedStateMachine):
    """The store against a dict {key: (value, version, expires_at)} with a fake clock."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp()
        self.clock = Clock()
        self.store = KVStore(self.dir, clock=self.clock, sync=False)
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
        try:
            base = int(current[0].decode("ascii")) if current else 0
        except (UnicodeDecodeError, ValueError):
            with pytest.raises(InvalidValue):
                self.store.increment("m", key, delta)
            return
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
