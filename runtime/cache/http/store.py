"""Where stored responses live: a memory LRU with a byte budget in front of an
LMDB tier under ``DATA/cache/http`` (written through; oldest written first out
when over its budget). One record per primary key (function, version, host,
path and query) holds that URL's variants (`Entry`, one per Vary'd request
headers and caller scope).

Shared by several processes (a PoP's ``workers = N``), the LMDB record is the
truth: each record starts with a stamp its writer chose, and a lookup reads
the record's stamp (a read transaction, no copy) before it serves its memory
copy. So a response one worker stored is found by the others, and one a worker
replaced or dropped (a POST to its URL) is served by no worker after that."""

from __future__ import annotations

import itertools
import logging
import os
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


STAMPED = 0xC1  # a record's first byte when a stamp follows (never the start of msgpack)
LOCAL = b""  # the stamp of a memory copy that is on no disk: its worker's own


def _record(stamp: bytes, variants: Variants) -> bytes:
    return bytes((STAMPED,)) + stamp + _encoder.encode(variants)


def _parts(raw: memoryview | bytes) -> tuple[bytes, memoryview | bytes]:
    """A record's stamp (``b"-"`` for one written before stamps) and its variants."""
    if raw[0] == STAMPED:
        return bytes(raw[1:9]), raw[9:]
    return b"-", raw


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
        # writers > 1: the record's stamp is checked at each lookup (see the module doc)
        self.shared = disk is not None and disk_bytes > 0 and writers > 1
        self.stamps: dict[bytes, bytes] = {}  # key -> the stamp of its memory copy (shared)
        self._next = itertools.count(1)
        # random, not the pid: a restarted worker may get a pid a live one stamped with
        self._writer = os.urandom(4)
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
                variants = _decoder.decode(_parts(raw)[1])
                self.disk[bytes(key)] = n = size(variants)
                self.disk_used += n
                self.index[bytes(key)] = _tags(variants)

    def get(self, key: bytes) -> Variants | None:
        """Raises `StoreClosed` after `close`."""
        if self.shared:
            return self._get_shared(key)
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
        variants = _decoder.decode(_parts(raw)[1])
        self._remember(key, variants, size(variants))
        return variants

    def _get_shared(self, key: bytes) -> Variants | None:
        """`get` where other processes write: the memory copy if the record still
        has its stamp, else the record (another worker's), else nothing."""
        held = self.stamps.get(key)
        if held == LOCAL:  # a copy no disk holds (its write failed): this worker's only
            self.memory.move_to_end(key)
            return self.memory[key]
        assert self.env is not None
        self._check_open()
        with self.env.begin(buffers=True) as txn:
            raw = txn.get(key)
            if raw is None:
                variants = None
            else:
                stamp, payload = _parts(raw)
                if stamp == held:
                    self.memory.move_to_end(key)
                    return self.memory[key]
                variants = _decoder.decode(payload)
        self._drop_copy(key)
        if variants is not None:
            self.index[key] = _tags(variants)
            self._remember(key, variants, size(variants), stamp)
        return variants

    def _drop_copy(self, key: bytes) -> None:
        """Forget this worker's copy of `key` and its share of the disk budget:
        another worker replaced or dropped the record."""
        self._unaccount(key)
        self._forget(key)

    def _unaccount(self, key: bytes) -> int | None:
        """Drop `key`'s memory copy and its share of this worker's disk budget (the
        record stays): the bytes it had on disk, None if none."""
        variants = self.memory.pop(key, None)
        if variants is not None:
            self.memory_used -= size(variants)
        self.stamps.pop(key, None)
        n = self.disk.pop(key, None)
        if n is not None:
            self.disk_used -= n
        return n

    def put(self, key: bytes, variants: Variants) -> None:
        """Store `variants` for `key` (replacing what was there). Raises `StoreClosed`."""
        self._check_open()
        self.delete(key)
        if not variants:
            return
        n = size(variants)
        self.index[key] = _tags(variants)
        stamp = self._writer + (next(self._next) & 0xFFFFFFFF).to_bytes(4, "little")
        self._remember(key, variants, n, LOCAL)
        if self.env is not None and n <= self.disk_bytes:
            try:
                self._write(key, _record(stamp, variants), n)
                if key in self.stamps:
                    self.stamps[key] = stamp
            except lmdb.Error as e:  # a cache: the entry stays in memory, the answer goes out
                self.disk.pop(key, None)
                if not self.write_failed:
                    self.write_failed = True
                    log.error("HTTP cache: a disk write failed (%s); entries that do not "
                              "fit it stay in memory only (logged once)", e)
        if key not in self.memory and key not in self.disk:
            del self.index[key]  # larger than both budgets

    def _write(self, key: bytes, record: bytes, n: int) -> None:
        """Raises `lmdb.Error` (the whole transaction is undone)."""
        assert self.env is not None
        evicted: list[bytes] = []
        with self.env.begin(write=True) as txn:
            txn.put(key, record)
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
        """Drop `key` from both tiers; whether it was held (shared: whether its record
        was, which one worker deletes: every worker that had read it counted it, and a
        purge of one URL said "purged 2" with two workers)."""
        held = self.index.pop(key, None) is not None
        n = self._unaccount(key)
        if self.env is not None and (n is not None or self.shared):
            self._check_open()  # shared: another worker's record goes too
            with self.env.begin(write=True) as txn:
                gone = txn.delete(key)
            held = gone if self.shared else gone or held
        return held

    def items(self) -> Iterator[tuple[bytes, frozenset[str]]]:
        return iter(list(self.index.items()))

    def _remember(self, key: bytes, variants: Variants, n: int, stamp: bytes = LOCAL) -> None:
        """Keep `variants` in memory (`stamp`: its record's, when shared)."""
        if n > self.memory_bytes:
            return
        self.memory[key] = variants
        if self.shared:
            self.stamps[key] = stamp
        self.memory_used += n
        while self.memory_used > self.memory_bytes:
            old, dropped = self.memory.popitem(last=False)
            self.memory_used -= size(dropped)
            self.stamps.pop(old, None)
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
