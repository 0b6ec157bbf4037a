"""Where stored responses live: a memory LRU with a byte budget in front of an
LMDB tier under ``DATA/cache/http`` (written through; oldest written first out
when over its budget). One record per primary key (function, version, host,
path and query) holds that URL's variants (`Entry`, one per Vary'd request
headers and caller scope)."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import lmdb
import msgspec

from edgefn_core.errors import StoreClosed

OVERHEAD = 256  # bytes counted per entry beyond its body and headers


class Entry(msgspec.Struct, array_like=True, gc=False):
    """One stored response and what the policy decided about it."""

    status: int
    headers: list[tuple[bytes, bytes]]  # as served, without Age, Cache-Tag, hop-by-hop
    body: bytes
    stored_at: float  # when it was stored or last validated (the cache's clock)
    initial_age: float  # the origin's Age
    lifetime: float
    swr: float
    sie: float
    revalidate: bool
    no_cache: bool
    public: bool
    etag: bytes | None
    last_modified: bytes | None
    vary: list[tuple[bytes, bytes | None]]  # (header, the request's value)
    scope: str  # "" or who the response was for (tenant / credential hash)
    tags: list[str]
    origin_ms: float  # how long the origin took

    @property
    def size(self) -> int:
        return len(self.body) + sum(len(k) + len(v) for k, v in self.headers) + OVERHEAD


type Variants = list[Entry]
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[Entry])


def size(variants: Variants) -> int:
    return sum(e.size for e in variants)


log = logging.getLogger("edgefn.cache")


class TieredStore:
    """`get`/`put`/`delete` variants by primary key; `index` maps every key held in
    either tier to its tags (for purges)."""

    def __init__(self, memory_bytes: int, disk: Path | None = None,
                 disk_bytes: int = 0, writers: int = 1) -> None:
        """`disk`: the LMDB folder (None or `disk_bytes` 0: memory only), which
        `writers` processes (a PoP's workers) each fill up to `disk_bytes`. Raises
        `lmdb.Error` if the folder cannot be used."""
        self.memory_bytes = memory_bytes
        self.memory: OrderedDict[bytes, Variants] = OrderedDict()  # LRU: oldest first
        self.memory_used = 0
        self.disk_bytes = disk_bytes
        self.disk: OrderedDict[bytes, int] = OrderedDict()  # key -> size, oldest first
        self.disk_used = 0
        self.index: dict[bytes, frozenset[str]] = {}
        self.env: lmdb.Environment | None = None
        self.closed = False
        if disk is not None and disk_bytes > 0:
            disk.mkdir(parents=True, exist_ok=True)
            # room for LMDB's own pages beyond the budget; no fsync: a cache
            self.env = lmdb.open(str(disk), map_size=disk_bytes * 2 * writers + (16 << 20),
                                 sync=False, metasync=False)
            self._load()
        self.write_failed = False  # a disk write failed (logged once)

    def _load(self) -> None:
        """Index what an earlier run left on disk."""
        assert self.env is not None
        with self.env.begin() as txn:
            for key, raw in txn.cursor():
                variants = _decoder.decode(raw)
                self.disk[bytes(key)] = n = size(variants)
                self.disk_used += n
                self.index[bytes(key)] = _tags(variants)

    def get(self, key: bytes) -> Variants | None:
        """Raises `StoreClosed` after `close`."""
        variants = self.memory.get(key)
        if variants is not None:
            self.memory.move_to_end(key)
            return variants
        if self.env is None or key not in self.disk:
            return None
        self._check_open()
        with self.env.begin() as txn:
            raw = txn.get(key)
        if raw is None:
            return None
        variants = _decoder.decode(raw)
        self._remember(key, variants, size(variants))
        return variants

    def put(self, key: bytes, variants: Variants) -> None:
        """Store `variants` for `key` (replacing what was there). Raises `StoreClosed`."""
        self._check_open()
        self.delete(key)
        if not variants:
            return
        n = size(variants)
        self.index[key] = _tags(variants)
        self._remember(key, variants, n)
        if self.env is not None and n <= self.disk_bytes:
            try:
                self._write(key, variants, n)
            except lmdb.Error as e:  # a cache: the entry stays in memory, the answer goes out
                self.disk.pop(key, None)
                if not self.write_failed:
                    self.write_failed = True
                    log.error("HTTP cache: a disk write failed (%s); entries that do not "
                              "fit it stay in memory only (logged once)", e)
        if key not in self.memory and key not in self.disk:
            del self.index[key]  # larger than both budgets

    def _write(self, key: bytes, variants: Variants, n: int) -> None:
        """Raises `lmdb.Error` (the whole transaction is undone)."""
        assert self.env is not None
        evicted: list[bytes] = []
        with self.env.begin(write=True) as txn:
            txn.put(key, _encoder.encode(variants))
            used = self.disk_used + n
            order = iter(self.disk.items())
            while used > self.disk_bytes:
                old, m = next(order)
                txn.delete(old)
                used -= m
                evicted.append(old)
        for old in evicted:  # committed: now the index follows
            del self.disk[old]
            self._forget(old)
        self.disk[key] = n
        self.disk_used = used

    def delete(self, key: bytes) -> bool:
        """Drop `key` from both tiers; whether it was held."""
        held = self.index.pop(key, None) is not None
        variants = self.memory.pop(key, None)
        if variants is not None:
            self.memory_used -= size(variants)
        n = self.disk.pop(key, None)
        if n is not None and self.env is not None:
            self._check_open()
            self.disk_used -= n
            with self.env.begin(write=True) as txn:
                txn.delete(key)
        return held

    def items(self) -> Iterator[tuple[bytes, frozenset[str]]]:
        return iter(list(self.index.items()))

    def _remember(self, key: bytes, variants: Variants, n: int) -> None:
        if n > self.memory_bytes:
            return
        self.memory[key] = variants
        self.memory_used += n
        while self.memory_used > self.memory_bytes:
            old, dropped = self.memory.popitem(last=False)
            self.memory_used -= size(dropped)
            if old not in self.disk:
                self._forget(old)

    def _forget(self, key: bytes) -> None:
        """`key` left one tier: unindex it if the other does not hold it either."""
        if key not in self.memory and key not in self.disk:
            self.index.pop(key, None)

    def _check_open(self) -> None:
        if self.closed:
            raise StoreClosed("HTTP cache is closed")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.env is not None:
                self.env.close()


def _tags(variants: Variants) -> frozenset[str]:
    return frozenset(t for e in variants for t in e.tags)
