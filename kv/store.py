"""KV store on LMDB: namespaces, TTL, metadata, compare-and-swap, increment, batches.

Each namespace is an LMDB named database. A record is
``u64 version | u64 expires_at_ms (0: never) | u32 meta_len | meta (JSON) | value``.
Versions come from a counter per namespace, so every write gets a version never
used before in that namespace (even after a delete) and `cas` can say "only if
nobody wrote since I read version N". Expiring keys are also indexed by
expiry time in the ``__ttl__`` database, so `purge_expired` reclaims their
space without scanning; reads never return an expired key, purged or not.

Durability: with ``sync=True`` (default) every committed write is fsynced before
the call returns, so it survives a crash of the machine. With ``sync=False``
commits skip fsync: a process crash (even SIGKILL) loses nothing, but an OS
crash or power loss can lose the last writes. Many processes may open the same
data dir: LMDB's lock file serializes writers.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import json
import re
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb

from edgefn_core.errors import InvalidValue, LimitExceeded, StoreClosed, UnknownNamespace
from kv import lmdb_handles
from kv.open_db import open_db
from kv.quota import Quota

_HEAD = struct.Struct("<QQI")
_EXP = struct.Struct(">Q")
NAME_OK = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-.")
TTL_DB = b"__ttl__"
MAX_TTL_S = 10 * 365 * 86400
NAMESPACES_DB = b"__namespaces__"
# namespace -> the bytes its keys and records take (>Q), kept in each write's
# transaction: what an owner's quota (`runtime.bindings.kv`) counts
USAGE_DB = b"__usage__"
# expired keys a purge deletes per write transaction (~6 ms of work, sync off)
PURGE_BATCH = 2000
_DECIMAL = re.compile(rb"[-+]?[0-9]{1,20}")  # what `increment` counts from (and writes)


@dataclass(frozen=True)
class Limits:
    max_key_bytes: int = 511  # LMDB's own limit with default page size
    max_value_bytes: int = 16 << 20
    max_metadata_bytes: int = 1024
    max_batch_ops: int = 1000
    # expired keys (not purged yet) one `list` call reads past before it returns a short
    # page with its cursor (~0.7 ms of them): 240k took 150-200 ms a call
    max_list_expired: int = 1000


@dataclass
class Entry:
    value: bytes
    version: int
    expires_at: float | None = None  # unix seconds
    metadata: dict[str, Any] | None = None


@dataclass
class KeyInfo:
    key: bytes
    version: int
    expires_at: float | None = None
    metadata: dict[str, Any] | None = None


@dataclass
class Page:
    keys: list[KeyInfo] = field(default_factory=list)
    cursor: str | None = None  # pass back to `list` for the next page; None at the end


class KVStore:
    def __init__(self, path: str | Path, *, map_size: int = 1 << 30, sync: bool = True,
                 clock: Callable[[], float] = time.time, limits: Limits | None = None,
                 max_namespaces: int = 126) -> None:
        """Open (creating) the store in directory `path`.

        Raises `lmdb.Error` if the directory cannot be used.
        """
        Path(path).mkdir(parents=True, exist_ok=True)
        self.env = lmdb.open(str(path), map_size=map_size, max_dbs=max_namespaces + 3,
                             sync=sync, metasync=sync, subdir=True)
        self.max_namespaces = max_namespaces
        self.clock = clock
        self.limits = limits or Limits()
        self._ttl = self.env.open_db(TTL_DB)
        self._names = self.env.open_db(NAMESPACES_DB)
        self._usage = self.env.open_db(USAGE_DB)
        self._dbs: dict[str, Any] = {}
        self._closed = False
        self._closing: builtins.list[Callable[[], None]] = []
        for ns in self.namespaces():  # handles opened outside any write transaction
            self._dbs[ns] = self.env.open_db(b"ns:" + ns.encode(), create=False)
        self._count_usage()

    def _count_usage(self) -> None:
        """Count what each namespace takes if nothing was counted yet (a store
        written before usage was kept): once, in one write transaction."""
        with self.env.begin() as txn:
            counted = txn.stat(self._usage)["entries"] > 0
        if counted or not self._dbs:
            return
        with self.env.begin(write=True) as txn:
            if txn.stat(self._usage)["entries"] > 0:  # another process counted first
                return
            for ns, db in self._dbs.items():
                total = sum(_footprint(k, v) for k, v in txn.cursor(db=db))
                txn.put(ns.encode(), _EXP.pack(total), db=self._usage)

    def usage(self, names: Iterable[str]) -> int:
        """The bytes the keys and records of namespaces `names` take together."""
        self._check_open()
        with self.env.begin() as txn:
            return self._used(txn, names)

    def _used(self, txn: Any, names: Iterable[str]) -> int:
        """What namespaces `names` take in `txn` (see `usage`)."""
        return sum(_EXP.unpack(raw)[0] for n in names
                   if (raw := txn.get(n.encode(), db=self._usage)) is not None)

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        if not self._closed:
            self._closed = True
            for release in self._closing:
                release()
            self.env.close()

    def on_close(self, release: Callable[[], None]) -> None:
        """Call `release()` when the store closes, before its environment does: native
        readers of `raw_handles` let go of it there."""
        self._check_open()
        self._closing.append(release)

    def raw_handles(self) -> tuple[int, int]:
        """``(MdbApi *, MDB_env *)``: py-lmdb's LMDB vtable and environment, for native
        readers in this process (see `kv.lmdb_handles`). Raises `NativeUnavailable`."""
        self._check_open()
        return lmdb_handles.env_handles(self.env)

    def raw_dbi(self, ns: str) -> int:
        """The ``MDB_dbi`` of namespace `ns`. Raises `UnknownNamespace`, `NativeUnavailable`."""
        return lmdb_handles.dbi(self.env, self._db(ns))

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("KV store is closed")

    # -- namespaces -------------------------------------------------------------------------
    def create_namespace(self, name: str) -> None:
        """Create `name` if it does not exist. Raises `InvalidValue` for a bad name."""
        self._check_open()
        if not name or len(name) > 64 or set(name) - NAME_OK or name.startswith("__"):
            raise InvalidValue(f"invalid namespace name {name!r}: expected 1-64 of [a-z0-9_.-]")
        with self.env.begin(write=True) as txn:
            self._dbs[name] = self.env.open_db(b"ns:" + name.encode(), txn=txn)
            if txn.get(name.encode(), db=self._names) is None:
                txn.put(name.encode(), _EXP.pack(0), db=self._names)  # its version counter

    def remove_empty_namespaces(self, names: Iterable[str]) -> builtins.list[str]:
        """Remove those of namespaces `names` that hold no key (what a failed deploy
        created for its warm-up), with their usage; unknown names are skipped. The
        ones that hold keys are kept, and returned: a write acknowledged meanwhile
        (an operator's `edgefn kv put`, the warm-up's own) is never dropped."""
        self._check_open()
        names = builtins.list(names)
        kept: builtins.list[str] = []
        if not names:
            return kept
        with self.env.begin(write=True) as txn:
            gone = set()
            for ns in names:
                if txn.get(ns.encode(), db=self._names) is None:
                    continue
                db = self._dbs.get(ns) or \
                    self.env.open_db(b"ns:" + ns.encode(), txn=txn, create=False)
                if txn.stat(db)["entries"]:
                    kept.append(ns)
                    continue
                self._dbs.pop(ns, None)
                txn.drop(db, delete=True)
                txn.delete(ns.encode(), db=self._names)
                txn.delete(ns.encode(), db=self._usage)
                gone.add(ns)
            due = [k for k, _ in txn.cursor(db=self._ttl) if _split_ttl_key(k[8:])[0] in gone]
            for k in due:
                txn.delete(k, db=self._ttl)
        return kept

    def check_room(self, names: Iterable[str]) -> None:
        """Raises `LimitExceeded` if creating `names` (those that do not exist yet)
        would pass the store's `max_namespaces`."""
        have = set(self.namespaces())
        new = sorted(set(names) - have)
        if new and len(have) + len(new) > self.max_namespaces:
            raise LimitExceeded(f"the KV store holds at most {self.max_namespaces} namespaces "
                                f"and has {len(have)}; {len(new)} more would not fit "
                                f"({', '.join(new[:5])}{', ...' if len(new) > 5 else ''})")

    def namespaces(self) -> builtins.list[str]:
        self._check_open()
        with self.env.begin() as txn:
            return [k.decode() for k, _ in txn.cursor(db=self._names)]

    def open_known(self, names: Iterable[str]) -> None:
        """Open the handles of those of namespaces `names` that exist (another process
        may have created them since this store opened), so that no read on a request's
        path opens one (it waits for the writer lock). Blocking."""
        for ns in names:
            with contextlib.suppress(UnknownNamespace):
                self._db(ns)

    def opened(self, ns: object) -> bool:
        """Whether this store holds the handle of namespace `ns` (a read of it then
        never waits for the writer lock; `_db` opens one that another process
        created, waiting for it)."""
        return isinstance(ns, str) and ns in self._dbs

    def _db(self, ns: str, txn: Any = None) -> Any:
        """The handle of namespace `ns`; inside a write transaction pass it as `txn`
        (opening a database outside it would wait for our own writer lock)."""
        self._check_open()
        db = self._dbs.get(ns)
        if db is None:
            if txn is None:
                with self.env.begin() as read:
                    known = read.get(ns.encode(), db=self._names) is not None
            else:
                known = txn.get(ns.encode(), db=self._names) is not None
            if not known:
                raise UnknownNamespace(f"unknown namespace {ns!r}")
            if txn is None:  # (a handle opened in a write transaction dies if it aborts)
                db = self._dbs[ns] = open_db(self.env, b"ns:" + ns.encode())  # (kv.open_db)
            else:
                db = self.env.open_db(b"ns:" + ns.encode(), txn=txn, create=False)
        return db

    # -- reads ------------------------------------------------------------------------------
    def get(self, ns: str, key: bytes) -> bytes | None:
        """The value, or None if absent or expired. Raises `UnknownNamespace`."""
        entry = self.get_entry(ns, key)
        return None if entry is None else entry.value

    def get_entry(self, ns: str, key: bytes) -> Entry | None:
        """None also for a key longer than any stored one. Raises `UnknownNamespace`,
        `LimitExceeded` for an empty key."""
        db = self._db(ns)
        if len(key) > self.limits.max_key_bytes:
            return None
        self.check_key(ns, key)
        with self.env.begin(buffers=True) as txn:
            raw = txn.get(key, db=db)
            return None if raw is None else self._decode(raw, self._now_ms())

    def check_key(self, ns: str, key: bytes) -> None:
        """Raises `InvalidValue` for an empty key, `LimitExceeded` for one over
        `max_key_bytes` (LMDB's own error for either names nothing)."""
        if not key or len(key) > self.limits.max_key_bytes:
            error = InvalidValue if not key else LimitExceeded
            raise error(f"key of {len(key)} bytes in {ns!r}: keys must be 1 to "
                        f"{self.limits.max_key_bytes} bytes")

    def list(self, ns: str, prefix: bytes = b"", cursor: str | None = None,
             limit: int = 100) -> Page:
        """Keys starting with `prefix` in key order, `limit` at a time. A page reads
        past at most `Limits.max_list_expired` expired keys: past that it ends short,
        even empty, with the cursor to go on from (None only at the end).

        Raises `InvalidValue` for a cursor that is not from this prefix.
        """
        if not 1 <= limit <= 1000:
            raise InvalidValue(f"limit must be 1..1000, got {limit}")
        db = self._db(ns)
        start = prefix
        if cursor:
            try:
                # validating: "!!!" decoded to b"" and the listing began again
                start = base64.b64decode(cursor.encode(), altchars=b"-_", validate=True)
                if not start:
                    raise ValueError(cursor)
            except ValueError:
                raise InvalidValue(f"invalid cursor {cursor!r}") from None
            if not start.startswith(prefix):
                raise InvalidValue("cursor does not belong to this prefix")
        now = self._now_ms()
        page = Page()
        expired = 0
        with self.env.begin(buffers=True) as txn:
            cur = txn.cursor(db=db)
            ok = cur.set_range(start)
            while ok:
                key = bytes(cur.key())
                if not key.startswith(prefix):
                    break
                if cursor and key == start:
                    ok = cur.next()
                    continue
                entry = self._decode(cur.value(), now, with_value=False)
                if entry is None:
                    expired += 1
                    if expired == self.limits.max_list_expired:
                        page.cursor = base64.urlsafe_b64encode(key).decode()
                        break
                else:
                    if len(page.keys) == limit:
                        page.cursor = base64.urlsafe_b64encode(page.keys[-1].key).decode()
                        break
                    page.keys.append(KeyInfo(key, entry.version, entry.expires_at,
                                             entry.metadata))
                ok = cur.next()
        return page

    # -- writes -----------------------------------------------------------------------------
    def put(self, ns: str, key: bytes, value: bytes, *, ttl: float | None = None,
            metadata: dict[str, Any] | None = None, quota: Quota | None = None) -> int:
        """Store `value`; returns the key's new version.

        Raises `LimitExceeded` for an oversized key, value or metadata, or past
        `quota` (what usage is charged: the key and the whole new record, its head and
        metadata included, less the key and record it replaces),
        `InvalidValue` for an empty key or a non-positive ttl, `UnknownNamespace`.
        """
        with self._write() as w:
            return w.put(ns, key, value, ttl=ttl, metadata=metadata, quota=quota)

    def delete(self, ns: str, key: bytes) -> bool:
        """Remove `key`; True if it existed (and had not expired)."""
        with self._write() as w:
            return w.delete(ns, key)

    def cas(self, ns: str, key: bytes, expected_version: int | None, value: bytes, *,
            ttl: float | None = None, metadata: dict[str, Any] | None = None,
            quota: Quota | None = None) -> int | None:
        """Write only if the key's version is `expected_version` (None: only if the key
        is absent). Returns the new version, or None if someone else wrote first.
        Raises as `put` does."""
        with self._write() as w:
            return w.cas(ns, key, expected_version, value, ttl=ttl, metadata=metadata,
                         quota=quota)

    def increment(self, ns: str, key: bytes, delta: int = 1, *, initial: int = 0,
                  quota: Quota | None = None) -> int:
        """Atomically add `delta` to the integer stored at `key` (`initial` if absent).

        Raises `InvalidValue` if the stored value is not a decimal integer or for an
        empty key, `LimitExceeded` for a key past its limit or past `quota` (counted
        as `put` counts it: the new record, its metadata kept, less the one it replaces).
        """
        with self._write() as w:
            return w.increment(ns, key, delta, initial=initial, quota=quota)

    def batch(self, ops: Sequence[tuple[Any, ...]]) -> builtins.list[Any]:
        """Apply ``("put", ns, key, value[, options])``, ``("delete", ns, key)``,
        ``("get", ns, key)`` and ``("increment", ns, key, delta)`` in one atomic
        transaction; returns each op's result. Raises (and applies nothing) if any fails.
        """
        if len(ops) > self.limits.max_batch_ops:
            raise LimitExceeded(f"batch of {len(ops)} ops exceeds the limit of "
                                f"{self.limits.max_batch_ops}")
        with self._write() as w:
            return [w.apply(op) for op in ops]

    def purge_expired(self, batch: int = PURGE_BATCH,
                      stop: Callable[[], bool] | None = None) -> int:
        """Delete every key expired now, `batch` at a time, each batch in its own write
        transaction: other writers get the lock between them, and no transaction grows
        with the backlog (one transaction for a million keys held the writer lock, and
        its caller, for seconds). Returns how many were removed; with `stop`, ends
        early, between transactions, once `stop()` is true. Raises `StoreClosed`,
        `InvalidValue` for a `batch` under 1."""
        if batch < 1:
            raise InvalidValue(f"a purge batch is at least 1 key, got {batch}")
        now = self._now_ms()
        removed = 0
        while not (stop is not None and stop()):
            self._check_open()
            with self.env.begin(write=True) as txn:
                done, more = self._purge_batch(txn, now, batch)
            removed += done
            if not more:
                break
        return removed

    def _purge_batch(self, txn: Any, now: int, batch: int) -> tuple[int, bool]:
        """Purge up to `batch` keys expired at `now` in `txn`: (how many were removed,
        whether expired keys may be left)."""
        due: builtins.list[bytes] = []
        for k, _ in txn.cursor(db=self._ttl):
            if _EXP.unpack_from(k)[0] > now or len(due) == batch:
                break
            due.append(k)
        removed = 0
        for k in due:
            (exp,) = _EXP.unpack_from(k)
            ns, key = _split_ttl_key(k[8:])
            db = self._dbs.get(ns) or self.env.open_db(b"ns:" + ns.encode(), txn=txn)
            raw = txn.get(key, db=db)
            if raw is not None and _HEAD.unpack_from(raw)[1] == exp:
                txn.delete(key, db=db)
                _account(txn, self._usage, ns, -_footprint(key, raw))
                removed += 1
            txn.delete(k, db=self._ttl)
        return removed, len(due) == batch

    def stats(self) -> dict[str, Any]:
        self._check_open()
        out: dict[str, Any] = {"map_size": self.env.info()["map_size"], "namespaces": {}}
        dbs = {ns: self._db(ns) for ns in self.namespaces()}
        with self.env.begin() as txn:
            for ns, db in dbs.items():
                out["namespaces"][ns] = txn.stat(db)["entries"]
        return out

    # -- internals --------------------------------------------------------------------------
    @contextmanager
    def _write(self) -> Iterator[_Writer]:
        self._check_open()
        with self.env.begin(write=True) as txn:
            yield _Writer(self, txn, self._now_ms())

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _decode(self, raw: Any, now_ms: int, with_value: bool = True) -> Entry | None:
        version, exp, mlen = _HEAD.unpack_from(raw)
        if exp and exp <= now_ms:
            return None
        pos = _HEAD.size
        meta = json.loads(bytes(raw[pos:pos + mlen])) if mlen else None
        value = bytes(raw[pos + mlen:]) if with_value else b""
        return Entry(value, version, exp / 1000 if exp else None, meta)


def _ttl_key(exp_ms: int, ns: str, key: bytes) -> bytes:
    n = ns.encode()
    return _EXP.pack(exp_ms) + bytes([len(n)]) + n + key


def _split_ttl_key(rest: bytes) -> tuple[str, bytes]:
    n = rest[0]
    return rest[1:1 + n].decode(), rest[1 + n:]


class _Writer:
    """Operations inside one write transaction."""

    def __init__(self, store: KVStore, txn: Any, now_ms: int) -> None:
        self.s = store
        self.txn = txn
        self.now = now_ms

    def apply(self, op: tuple[Any, ...]) -> Any:
        kind, args = op[0], op[1:]
        if kind == "put":
            opts = args[3] if len(args) > 3 else {}
            return self.put(args[0], args[1], args[2], **opts)
        if kind == "delete":
            return self.delete(*args)
        if kind == "get":
            raw = self.txn.get(args[1], db=self.s._db(args[0], self.txn))
            entry = None if raw is None else self.s._decode(raw, self.now)
            return None if entry is None else entry.value
        if kind == "increment":
            return self.increment(*args)
        raise InvalidValue(f"unknown batch op {kind!r}")

    def _current(self, db: Any, key: bytes) -> tuple[int, int] | None:
        """(version, expires_at_ms) of the live record, or None."""
        raw = self.txn.get(key, db=db)
        if raw is None:
            return None
        version, exp, _ = _HEAD.unpack_from(raw)
        if exp and exp <= self.now:
            return None
        return version, exp

    def put(self, ns: str, key: bytes, value: bytes, *, ttl: float | None = None,
            metadata: dict[str, Any] | None = None, expires_ms: int | None = None,
            quota: Quota | None = None) -> int:
        """`expires_ms` (absolute, internal) keeps an existing expiry exactly.

        Under `quota`, raises `LimitExceeded` when the write would take usage past it,
        counting exactly what usage is charged: the key and the whole new record (head,
        metadata, value) less the key and whole record it replaces, expired or not. (A
        check of the new value alone let a value as long as the old record, with 1 KiB
        of metadata each time, add 0 and grow 1 KiB a put: 3.96 MB against 1 MiB.) A
        write that adds nothing passes even over the quota (one may shrink a value, not
        only delete). Checked after the key, value, metadata and ttl are (a value past
        16 MiB said it passed the quota)."""
        db = self.s._db(ns, self.txn)
        lim = self.s.limits
        self.s.check_key(ns, key)
        if len(value) > lim.max_value_bytes:
            raise LimitExceeded(f"value of {len(value)} bytes for key {key!r} in {ns!r} exceeds "
                                f"the limit of {lim.max_value_bytes} bytes")
        meta = json.dumps(metadata, separators=(",", ":")).encode() if metadata else b""
        if len(meta) > lim.max_metadata_bytes:
            raise LimitExceeded(f"metadata of {len(meta)} bytes for key {key!r} exceeds the "
                                f"limit of {lim.max_metadata_bytes} bytes")
        if ttl is not None and not 0 < ttl <= MAX_TTL_S:  # NaN fails both
            raise InvalidValue(f"ttl must be a number of seconds above 0 and at most "
                               f"{MAX_TTL_S} (10 years), got {ttl}")
        raw_old = self.txn.get(key, db=db)
        # what usage is charged (`_account` below): the check counts the same bytes
        adding = len(key) + _record_len(meta, value)
        if raw_old is not None:
            adding -= _footprint(key, raw_old)  # (read before the write moves it)
        if quota is not None and adding > 0:
            quota.check(self.s._used(self.txn, quota.names), adding)
        old_version, old_exp = (_HEAD.unpack_from(raw_old)[:2] if raw_old is not None
                                else (0, 0))
        if old_exp:
            self.txn.delete(_ttl_key(old_exp, ns, key), db=self.s._ttl)
        exp = self.now + max(1, int(ttl * 1000)) if ttl is not None else (expires_ms or 0)
        version = self._next_version(ns, old_version)
        record = _HEAD.pack(version, exp, len(meta)) + meta + value  # _record_len bytes
        self.txn.put(key, record, db=db)
        _account(self.txn, self.s._usage, ns, adding)
        if exp:
            self.txn.put(_ttl_key(exp, ns, key), b"", db=self.s._ttl)
        return version

    def _next_version(self, ns: str, at_least: int) -> int:
        """Versions come from one counter per namespace, so a key deleted and written
        again never reuses a version a stale CAS could still hold."""
        raw = self.txn.get(ns.encode(), db=self.s._names)
        counter = _EXP.unpack(raw)[0] if raw is not None and len(raw) == 8 else 0
        version = max(counter, at_least) + 1
        self.txn.put(ns.encode(), _EXP.pack(version), db=self.s._names)
        return version

    def delete(self, ns: str, key: bytes) -> bool:
        db = self.s._db(ns, self.txn)
        if len(key) > self.s.limits.max_key_bytes:  # never stored
            return False
        self.s.check_key(ns, key)
        raw = self.txn.get(key, db=db)
        if raw is None:
            return False
        _, exp, _ = _HEAD.unpack_from(raw)
        self.txn.delete(key, db=db)
        _account(self.txn, self.s._usage, ns, -_footprint(key, raw))
        if exp:
            self.txn.delete(_ttl_key(exp, ns, key), db=self.s._ttl)
        return not (exp and exp <= self.now)

    def cas(self, ns: str, key: bytes, expected: int | None, value: bytes, *,
            ttl: float | None = None, metadata: dict[str, Any] | None = None,
            quota: Quota | None = None) -> int | None:
        self.s.check_key(ns, key)  # (not "someone else wrote first" for a key LMDB refuses)
        current = self._current(self.s._db(ns, self.txn), key)
        if (current[0] if current else None) != expected:
            return None
        return self.put(ns, key, value, ttl=ttl, metadata=metadata, quota=quota)

    def increment(self, ns: str, key: bytes, delta: int = 1, *, initial: int = 0,
                  quota: Quota | None = None) -> int:
        db = self.s._db(ns, self.txn)
        self.s.check_key(ns, key)  # (LMDB's own error for an empty one named nothing)
        raw = self.txn.get(key, db=db)
        entry = None if raw is None else self.s._decode(raw, self.now)
        if entry is None:
            number = initial
        else:
            if _DECIMAL.fullmatch(entry.value) is None:  # int() took " 1_000 "
                raise InvalidValue(f"cannot increment key {_shown(key)} in {ns!r}: its value "
                                   "is not a decimal integer")
            number = int(entry.value)
        number += delta
        if not -(1 << 63) <= number < 1 << 63:  # a WASM guest reads it as an i64 (it wrapped)
            raise InvalidValue(f"cannot increment key {_shown(key)} in {ns!r} by {delta}: "
                               "the result would leave the 64-bit signed range")
        expires_ms = round(entry.expires_at * 1000) if entry and entry.expires_at else None
        self.put(ns, key, str(number).encode(), metadata=entry.metadata if entry else None,
                 expires_ms=expires_ms, quota=quota)
        return number


def _shown(key: bytes) -> str:
    """A key as a message shows it: its text, quoted (a bytes repr if not UTF-8)."""
    try:
        return repr(key.decode())
    except UnicodeDecodeError:
        return repr(key)


def _record_len(meta: bytes, value: bytes) -> int:
    """The bytes of the record `_Writer.put` stores for `meta` and `value`."""
    return _HEAD.size + len(meta) + len(value)


def _footprint(key: bytes, record: Any) -> int:
    """What `key` and its stored `record` count in usage (`USAGE_DB`): both whole."""
    return len(key) + len(record)


def _account(txn: Any, usage: Any, ns: str, delta: int) -> None:
    """Add `delta` bytes to namespace `ns`'s usage, inside the write `txn`."""
    raw = txn.get(ns.encode(), db=usage)
    total = (_EXP.unpack(raw)[0] if raw is not None else 0) + delta
    txn.put(ns.encode(), _EXP.pack(max(0, total)), db=usage)

