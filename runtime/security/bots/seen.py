"""`SeenSet`: values seen within a time-to-live, in bounded memory; `SharedSeen`:
the same in an LMDB file every process of a PoP (``workers = N``) checks.

Replay protection for Web Bot Auth signatures and single use for proof-of-work
solutions. When it is full of values still alive it refuses new ones (`claim`
answers "full") rather than forget one that could then be replayed: it fails
closed. One process's set let a signature or a solved challenge used on one
worker be used again on another.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from pathlib import Path
from typing import Literal

import lmdb

type Claim = Literal["seen", "full"] | None
_EXPIRY = struct.Struct(">d")


class SeenSet:
    def __init__(self, ttl: float, capacity: int = 100_000) -> None:
        self.ttl = ttl
        self.capacity = capacity
        self._expires: OrderedDict[bytes, float] = OrderedDict()  # insertion = expiry order

    def add(self, value: bytes, now: float) -> bool:
        """Record `value` as seen at `now`: True if it was not seen within the TTL
        and there was room for it, False otherwise."""
        self._expire(now)
        if value in self._expires or len(self._expires) >= self.capacity:
            return False
        self._expires[value] = now + self.ttl
        return True

    def seen(self, value: bytes, now: float) -> bool:
        """Whether `value` was added within the TTL before `now`."""
        expiry = self._expires.get(value)
        return expiry is not None and expiry > now

    def claim(self, value: bytes, now: float) -> Claim:
        """Record `value` unless it was seen within the TTL ("seen") or there is no
        room ("full"); None when it is recorded now."""
        if self.seen(value, now):
            return "seen"
        return None if self.add(value, now) else "full"

    def __len__(self) -> int:
        return len(self._expires)

    def _expire(self, now: float) -> None:
        entries = self._expires
        while entries:
            value, expiry = next(iter(entries.items()))
            if expiry > now:
                return
            del entries[value]


class SharedSeen:
    """`SeenSet.claim` in an LMDB environment at `path`, one write transaction a
    claim (atomic across processes); values are kept by their BLAKE2b digest.
    Each entry is two keys: ``v<digest>`` -> its expiry, and ``e<expiry><digest>``,
    so that expired entries are found in expiry order (a sweep walks only those:
    scanning every entry at each claim of a full set held the writer lock ~14 ms).
    Raises `lmdb.Error` if `path` cannot be opened."""

    def __init__(self, path: Path, ttl: float, capacity: int = 100_000) -> None:
        self.ttl = ttl
        self.capacity = capacity
        path.mkdir(parents=True, exist_ok=True)
        # ~200 bytes an entry (two keys): room for `capacity`, LMDB's own pages beside
        self.env = lmdb.open(str(path), map_size=max(capacity * 512, 1 << 20) + (8 << 20),
                             sync=False, metasync=False, max_dbs=0)

    def claim(self, value: bytes, now: float) -> Claim:
        digest = hashlib.blake2b(value, digest_size=32).digest()
        with self.env.begin(write=True) as txn:
            _sweep(txn, now)  # the expired ones, oldest first: none most of the time
            if txn.get(b"v" + digest) is not None:
                return "seen"
            if txn.stat()["entries"] >= 2 * self.capacity:
                return "full"
            expiry = _EXPIRY.pack(now + self.ttl)
            txn.put(b"v" + digest, expiry)
            txn.put(b"e" + expiry + digest, b"")
        return None

    def seen(self, value: bytes, now: float) -> bool:
        key = b"v" + hashlib.blake2b(value, digest_size=32).digest()
        with self.env.begin() as txn:
            raw = txn.get(key)
        return raw is not None and _EXPIRY.unpack(raw)[0] > now

    def __len__(self) -> int:
        with self.env.begin() as txn:
            return int(txn.stat()["entries"]) // 2

    def close(self) -> None:
        self.env.close()


def _sweep(txn: lmdb.Transaction, now: float) -> None:
    """Delete the entries expired by `now`, walking the expiry keys from the oldest
    and stopping at the first alive (expiries are big-endian doubles: positive
    ones sort as numbers)."""
    cursor = txn.cursor()
    if not cursor.set_range(b"e"):
        return
    gone = []
    for raw in cursor.iternext(values=False):
        key = bytes(raw)
        if not key.startswith(b"e") or _EXPIRY.unpack_from(key, 1)[0] > now:
            break
        gone.append(key)
    for key in gone:
        txn.delete(key)
        txn.delete(b"v" + key[1 + _EXPIRY.size:])
