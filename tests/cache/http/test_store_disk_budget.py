"""The tiered store's budgets at their edges: an entry larger than the disk tier's
whole budget stays in memory only (writing it would evict every record on disk
and still not fit), and an entry's size counts its header bytes, not its body
alone (a response of large headers and an empty body is not free)."""

from __future__ import annotations

from pathlib import Path

from runtime.cache.http.store import OVERHEAD, Entry, TieredStore
from tests.cache.http.test_store import entry


def with_headers(body: int, headers: list[tuple[bytes, bytes]]) -> Entry:
    return Entry(200, headers, b"x" * body, 0.0, 0.0, 60.0, 0.0, 0.0, False, False,
                 False, None, None, [], "", ["t"], 1.0)


def test_an_entry_over_the_disk_budget_stays_in_memory_and_evicts_nothing(
        tmp_path: Path) -> None:
    s = TieredStore(memory_bytes=10000, disk=tmp_path, disk_bytes=2000)
    try:
        s.put(b"a", [entry(1000, tag="a")])
        s.put(b"big", [entry(3000, tag="big")])  # must not raise
        big = s.get(b"big")
        assert big is not None and big[0].tags == ["big"]
        assert b"big" in s.memory and b"big" not in s.disk
        a = s.get(b"a")
        assert a is not None and a[0].tags == ["a"]
        assert list(s.disk) == [b"a"] and s.disk_used == 1000  # still on disk
        assert dict(s.items()) == {b"a": frozenset({"a"}), b"big": frozenset({"big"})}
    finally:
        s.close()
    reopened = TieredStore(memory_bytes=10000, disk=tmp_path, disk_bytes=2000)
    try:
        assert dict(reopened.items()) == {b"a": frozenset({"a"})}
    finally:
        reopened.close()


def test_an_entrys_size_counts_its_headers() -> None:
    headers = [(b"content-type", b"text/plain"), (b"x-large", b"h" * 900)]
    e = with_headers(100, headers)
    assert e.size == 100 + len(b"content-type") + len(b"text/plain") + len(b"x-large") \
        + 900 + OVERHEAD
    s = TieredStore(memory_bytes=2 * e.size)
    s.put(b"a", [e])
    assert s.memory_used == e.size
    s.put(b"b", [with_headers(100, headers)])
    s.put(b"c", [with_headers(100, headers)])  # three of them are over the budget
    assert s.get(b"a") is None and list(s.memory) == [b"b", b"c"]
    filler = b"h" * (s.memory_bytes - OVERHEAD - len(b"x-large"))
    s.put(b"empty", [with_headers(0, [(b"x-large", filler)])])
    assert list(s.memory) == [b"empty"]  # headers alone fill the whole budget
    assert s.memory_used == s.memory_bytes
