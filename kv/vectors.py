"""Vector indexes on usearch, with LMDB as the source of truth.

Every upsert and delete is committed to LMDB first (ids, metadata, the vector
itself, and a log entry numbered by a per-index sequence), then applied to the
in-memory usearch index. `save()` writes the index file and then a sidecar
recording the sequence it contains. On open, log entries past that sequence are
replayed from LMDB; a missing or unreadable index file is rebuilt from LMDB. So a
crash at any point leaves an index that is repaired to agree with LMDB, and an
acknowledged write is never lost.

Several processes may open one store (the PoP's workers): each holds its own
copy of every index in memory and LMDB is what they share. The sequence and the
next key are read inside each write transaction (LMDB's one writer lock spans
processes), so keys are never reused; before each query, stats, save and after
each write a process applies the log entries past the sequence its copy has
applied (`_sync`: one LMDB get compared with the record last seen when nothing
changed). A save (one at a time across processes: a file lock) trims the log up
to the sequence it saved; a process whose copy is older than the log's first
entry loads the saved file, then replays.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import struct
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
from usearch.index import Index

from edgefn_core.errors import (
    InvalidValue,
    KeyNotFound,
    LimitExceeded,
    StoreClosed,
    UnknownNamespace,
)
from kv.open_db import open_db
from kv.quota import Quota

log = logging.getLogger("edgefn.vectors")
_KEY = struct.Struct(">Q")
_ROW = struct.Struct("<HI")  # id length, metadata length; then id, metadata, vector
METRICS = {"cos": "cos", "ip": "ip", "l2": "l2sq"}
DTYPES = ("f32", "f16", "i8")
MAX_DIM = 4096
MAX_ID_BYTES = 256
MAX_META_BYTES = 4096
SAVE_EVERY = 10_000  # log entries between automatic saves
MAX_K = 1000  # nearest neighbours one query returns at most
F16_MAX = float(np.finfo(np.float16).max)  # 65504
FILTER_SCAN = 16_384  # candidates a filtered query looks among (or 4k, if more)
EXACT_BELOW = 4096  # indexes of at most this many vectors are searched exactly
# allowed ranges of the usearch HNSW settings a caller may choose per index
GRAPH_LIMITS = {"connectivity": (2, 128), "expansion_add": (8, 4096),
                "expansion_search": (8, 4096)}


@dataclass(frozen=True)
class IndexConfig:
    name: str
    dim: int
    metric: str = "cos"
    # defaults: the cheapest setting with recall@10 >= 0.98 on 100k real MiniLM
    # sentence embeddings in bench/bench_vectors.py (30x exact search's QPS)
    dtype: str = "f16"
    connectivity: int = 32
    expansion_add: int = 128
    expansion_search: int = 48


@dataclass
class Match:
    id: str
    distance: float  # smaller is closer (cos: 1 - cosine similarity; ip: 1 - dot; l2: squared)
    metadata: dict[str, Any] | None


class _Open:
    """One index as this process holds it: its usearch copy and the sequence that copy
    has applied (`applied`; `state`: the LMDB record seen at that sequence)."""

    def __init__(self, config: IndexConfig, index: Index, dbs: tuple[Any, Any, Any]) -> None:
        self.config = config
        self.key = config.name.encode()
        self.index = index
        self.ids, self.rows, self.log = dbs
        self.applied = 0
        self.state = b""
        self.saved_seq = 0
        # held while the copy changes or is saved: writes run on several threads
        self.lock = threading.RLock()


PARTS = ("ids", "rows", "log")  # an index's LMDB databases
MAX_DBS = 512  # LMDB's named databases: the configurations', then PARTS per index
MAX_INDEXES = (MAX_DBS - 1) // len(PARTS)


class VectorStore:
    def __init__(self, path: str | Path, *, sync: bool = True, map_size: int = 8 << 30) -> None:
        """Open (creating) the vector store in directory `path`; existing indexes are
        loaded and repaired against LMDB."""
        self.dir = Path(path)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.env = lmdb.open(str(self.dir / "meta"), map_size=map_size, max_dbs=MAX_DBS,
                             sync=sync, metasync=sync)
        self._configs = self.env.open_db(b"__indexes__")
        self._open: dict[str, _Open] = {}
        self._loading = threading.Lock()
        self._counting: dict[str, Any] = {}  # ids databases `held` opened (not loaded)
        self._closed = False
        for name in self.names():
            self._load(name)

    # -- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        for name in list(self._open):
            self.save(name)
        self._closed = True
        self.env.close()

    def __enter__(self) -> VectorStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def names(self) -> list[str]:
        with self.env.begin() as txn:
            return [k.decode() for k, _ in txn.cursor(db=self._configs)]

    # -- indexes --------------------------------------------------------------------------------
    def create(self, name: str, dim: int, metric: str = "cos", dtype: str | None = None, *,
               connectivity: int | None = None, expansion_add: int | None = None,
               expansion_search: int | None = None) -> IndexConfig:
        """Create an index (idempotent for the same settings, also when another
        process created it). `dtype` and the graph settings default to
        `IndexConfig`'s; one left out is not compared with an existing index's.

        Raises `InvalidValue` for a bad name, dimension, metric, dtype or graph
        setting (outside `GRAPH_LIMITS`), or if the index exists with other settings;
        `LimitExceeded` past `MAX_INDEXES`.
        """
        self._check()
        _check_settings(name, dim, metric, IndexConfig.dtype if dtype is None else dtype)
        graph = {k: v for k, v in (("connectivity", connectivity), ("expansion_add",
                 expansion_add), ("expansion_search", expansion_search)) if v is not None}
        _check_graph(graph)
        chosen = {**graph, "dtype": dtype} if dtype is not None else graph
        config = IndexConfig(name, dim, metric, **chosen)
        if name not in self._open:
            try:
                with self.env.begin(write=True) as txn:  # the check and the put in one writer
                    if txn.get(name.encode(), db=self._configs) is None:
                        for part in PARTS:  # made with its record, or neither is (below)
                            self.env.open_db(f"i:{name}:{part}".encode(), txn=txn,
                                             create=True)
                        _put_state(txn, self._configs, config, 0, 1)
            except lmdb.DbsFullError:  # the record made alone stayed, and every later
                # count of its owner's indexes failed opening its databases
                raise LimitExceeded(f"the vector store holds at most {MAX_INDEXES} indexes; "
                                    f"index {name!r} would be one more") from None
            self._load(name)
        return _same(self._open[name].config, config, chosen)

    def _load(self, name: str) -> None:
        """Open index `name` (once, if two threads ask), from its saved file and the log."""
        with self._loading:
            if name in self._open:
                return
            with self.env.begin() as txn:
                raw = txn.get(name.encode(), db=self._configs)
            assert raw is not None, f"index {name!r} has no configuration"
            state = json.loads(raw)
            del state["seq"], state["next_key"]
            config = IndexConfig(**state)
            ids, rows, log = (open_db(self.env, f"i:{name}:{part}".encode(), create=True)
                              for part in PARTS)
            opened = _Open(config, self._new_index(config), (ids, rows, log))
            with self.env.begin(buffers=True) as txn:
                seq = _seq(txn.get(opened.key, db=self._configs))
                self._reload(opened, txn, seq)
                self._sync(opened, txn)
            self._open[name] = opened

    def _new_index(self, c: IndexConfig) -> Index:
        return Index(ndim=c.dim, metric=METRICS[c.metric], dtype=c.dtype,
                     connectivity=c.connectivity, expansion_add=c.expansion_add,
                     expansion_search=c.expansion_search)

    def _paths(self, name: str) -> tuple[Path, Path]:
        return self.dir / f"{name}.usearch", self.dir / f"{name}.saved.json"

    def _read_saved(self, c: IndexConfig, index: Index) -> int | None:
        """The sequence number the index file holds, after loading it; None if unusable.
        The sidecar is read first: a save replaces the file before the sidecar, so
        the file read after it holds at least the sequence it names."""
        file, sidecar = self._paths(c.name)
        try:
            saved = json.loads(sidecar.read_text())
            digest = saved.get("blake2b")  # a sidecar written before sums: not checked
            if digest is not None and _digest(file) != digest:
                # damaged in place (same size): it loaded, then every query and replay
                # failed ("Out of memory!") until the file was deleted by hand
                raise ValueError(f"{file} does not match the sum its save wrote")
            index.load(str(file))
        except (OSError, ValueError, RuntimeError):
            index.reset()
            return None
        if index.ndim != c.dim or saved.get("size") != index.size:
            index.reset()
            return None
        return int(saved["seq"])

    # -- catching up ----------------------------------------------------------------------------
    def _sync(self, o: _Open, txn: Any) -> None:
        """Bring `o`'s copy up to the sequence in `txn`'s snapshot (a read txn with
        buffers). The common case, nothing written since, is one get and a compare."""
        raw = txn.get(o.key, db=self._configs)
        if raw == o.state:
            return
        with o.lock:
            seq = _seq(raw)
            if seq > o.applied:  # else another thread applied as much (or more)
                if not self._covers(o, txn, o.applied, seq):  # trimmed past this copy
                    self._reload(o, txn, seq)
                if o.applied < seq:
                    self._replay(o, txn, o.applied)
                    o.applied = seq
            if o.applied == seq:
                o.state = bytes(raw)

    def _covers(self, o: _Open, txn: Any, after: int, seq: int) -> bool:
        """Whether `txn`'s log holds every entry in (`after`, `seq`]."""
        if after >= seq:
            return True
        cur = txn.cursor(db=o.log)
        return bool(cur.first()) and _KEY.unpack(bytes(cur.key()))[0] <= after + 1

    def _reload(self, o: _Open, txn: Any, seq: int) -> None:
        """Replace `o`'s copy with the saved file (or, if that is unusable or older than
        the log's first entry, a rebuild from `txn`'s rows at `seq`). A new Index, not
        a reset one: a query on another thread may still be searching the old."""
        index = self._new_index(o.config)
        saved = self._read_saved(o.config, index)
        if saved is not None and self._covers(o, txn, saved, seq):
            o.index, o.applied, o.saved_seq = index, saved, saved
            return
        self._rebuild(o, txn)
        o.applied, o.saved_seq = seq, 0

    def _rebuild(self, o: _Open, txn: Any) -> None:
        index = self._new_index(o.config)
        keys, vecs = [], []
        for k, row in txn.cursor(db=o.rows):
            keys.append(_KEY.unpack(bytes(k))[0])
            vecs.append(self._row_vector(o.config, row))
        if keys:
            index.add(np.array(keys, dtype=np.uint64), np.stack(vecs))
        o.index = index

    def _replay(self, o: _Open, txn: Any, after: int) -> None:
        """Set every key the log touched after `after` to its row in `txn`: keys are
        never reused, so a key's row (or its absence) is its latest state."""
        touched = set()
        cur = txn.cursor(db=o.log)
        if cur.set_range(_KEY.pack(after + 1)):
            for _, key in cur:
                touched.add(_KEY.unpack(bytes(key))[0])
        fresh_keys, fresh_vecs = [], []
        for key in touched:
            if o.index.contains(key):
                o.index.remove(key)
            row = txn.get(_KEY.pack(key), db=o.rows)
            if row is not None:
                fresh_keys.append(key)
                fresh_vecs.append(self._row_vector(o.config, row))
        if fresh_keys:  # one multi-threaded insert
            o.index.add(np.array(fresh_keys, dtype=np.uint64), np.stack(fresh_vecs))

    # -- writes ---------------------------------------------------------------------------------
    def upsert(self, name: str, items: Iterable[tuple[str, Any, dict[str, Any] | None]],
               quota: Quota | None = None) -> int:
        """Insert or replace vectors by id; returns how many were written.

        Raises `UnknownNamespace`, `InvalidValue` (wrong dimension, an empty vector,
        non-finite values, a value past f16's range in an f16 index), `LimitExceeded`
        (id or metadata too large, or the rows, as new ones, past `quota`). Nothing
        is written on error.
        """
        o = self._get(name)
        latest = {id_: (vec, meta) for id_, vec, meta in items}  # a repeated id: last wins
        rows = [self._encode(o.config, id_, vec, meta) for id_, (vec, meta) in latest.items()]
        if not rows:
            return 0
        counting = self._counting_dbs(quota.names) if quota is not None else {}
        with self.env.begin(write=True) as txn:
            if quota is not None:
                quota.check(_held(txn, counting), len(rows) * o.config.dim * 4)
            seq, next_key = _state(txn.get(o.key, db=self._configs))
            for id_bytes, row, _ in rows:
                old = txn.get(id_bytes, db=o.ids)
                key = _KEY.unpack(old)[0] if old is not None else next_key
                if old is None:
                    next_key += 1
                    txn.put(id_bytes, _KEY.pack(key), db=o.ids)
                txn.put(_KEY.pack(key), row, db=o.rows)
                seq += 1
                txn.put(_KEY.pack(seq), _KEY.pack(key), db=o.log)
            _put_state(txn, self._configs, o.config, seq, next_key)
            full = txn.stat(o.log)["entries"] >= SAVE_EVERY
        self._after_write(o, full)
        return len(rows)

    def check(self, config: IndexConfig,
              items: Iterable[tuple[str, Any, dict[str, Any] | None]]) -> None:
        """Raises what `upsert` would for `items` into an index of `config` (but the
        quota), writing nothing: a first upsert checks its items before it makes the
        index, whose dimension it fixes (a refused one left an index of the wrong one)."""
        for id_, vector, meta in items:
            self._encode(config, id_, vector, meta)

    def held(self, names: Iterable[str]) -> int:
        """The bytes of the vectors indexes `names` hold (4 a dimension: what they
        take in memory as f32 and in the rows); unknown names count 0."""
        self._check()
        counting = self._counting_dbs(names)
        with self.env.begin() as txn:
            return _held(txn, counting)

    def _counting_dbs(self, names: Iterable[str]) -> dict[str, tuple[int, Any]]:
        """Index -> (its dimension, its ids database) for `held` and quotas, from the
        records (no index is loaded to count); unknown names are left out."""
        with self.env.begin() as txn:
            dims = {n: int(json.loads(raw)["dim"]) for n in names
                    if (raw := txn.get(n.encode(), db=self._configs)) is not None}
        out = {}
        for name, dim in dims.items():
            opened = self._open.get(name)
            out[name] = (dim, opened.ids if opened is not None else self._ids_db(name))
        return out

    def _ids_db(self, name: str) -> Any:
        """The ids database of index `name`, opened once (outside any transaction,
        as LMDB wants handles opened) for `held`."""
        with self._loading:
            db = self._counting.get(name)
            if db is None:
                db = self._counting[name] = open_db(self.env, f"i:{name}:ids".encode())
        return db

    def delete(self, name: str, ids: Iterable[str]) -> int:
        """Delete vectors by id; returns how many existed. Raises `InvalidValue` when
        `ids` is not a list of strings."""
        o = self._get(name)
        wanted = _ids(name, ids)
        gone = 0
        with self.env.begin(write=True) as txn:
            seq, next_key = _state(txn.get(o.key, db=self._configs))
            for id_ in wanted:
                raw = txn.get(id_.encode(), db=o.ids)
                if raw is None:
                    continue
                key = _KEY.unpack(raw)[0]
                txn.delete(id_.encode(), db=o.ids)
                txn.delete(_KEY.pack(key), db=o.rows)
                seq += 1
                txn.put(_KEY.pack(seq), _KEY.pack(key), db=o.log)
                gone += 1
            if gone:
                _put_state(txn, self._configs, o.config, seq, next_key)
            full = txn.stat(o.log)["entries"] >= SAVE_EVERY
        self._after_write(o, full)
        return gone

    def _after_write(self, o: _Open, full: bool) -> None:
        """Apply the committed write (and any other process's before it) to this copy;
        save when the log holds `SAVE_EVERY` entries."""
        with self.env.begin(buffers=True) as txn:
            self._sync(o, txn)
        if full:
            try:
                self._save(o, only_if_full=True)
            except (OSError, RuntimeError) as e:
                # the write is committed and acknowledged: a save that fails (a full
                # disk) is tried again at the next full log; it answered 500 for a write
                # that had happened ("Failed to serialize into stream")
                log.warning("vector index %s: saving its file failed (%s); its log keeps "
                            "every write, the save is tried again later", o.config.name, e)

    # -- reads ----------------------------------------------------------------------------------
    def query(self, name: str, vector: Any, k: int = 10,
              filter: dict[str, Any] | None = None, exact: bool = False) -> list[Match]:
        """The `k` nearest vectors, closest first, whose metadata matches every
        ``filter`` item (`exact`: brute force instead of the HNSW graph). A filtered
        query looks among the ``max(FILTER_SCAN, 4k)`` nearest at most, so a filter
        that few vectors match may return fewer than `k` (a filter matching none
        had scanned the whole index, on the caller's thread). Sees every write that
        returned before it was called, in any process.

        Raises `InvalidValue` for a vector of the wrong dimension (or empty, not
        finite, past f16's range in an f16 index), a `k` that is not an int from 1
        to `MAX_K`, a `filter` that is not an object.
        """
        o = self._get(name)
        q = self._vector(o.config, vector)
        if type(k) is not int or not 1 <= k <= MAX_K:
            raise InvalidValue(f"k must be an integer from 1 to {MAX_K}, got {k!r}")
        if filter is not None and not isinstance(filter, dict):
            raise InvalidValue(f"filter must be an object of metadata fields, got "
                               f"{type(filter).__name__}")
        with self.env.begin(buffers=True) as txn:
            self._sync(o, txn)
            index = o.index  # a reload on another thread swaps it
            if index.size == 0:
                return []
            want = k if not filter else min(index.size, k * 4)
            scan = max(FILTER_SCAN, k * 4)
            # a small index is searched exactly: brute force costs little there, and an
            # HNSW graph of many equal vectors never reaches one vector apart from them
            exact = exact or index.size <= EXACT_BELOW
            while True:
                found = index.search(q, min(want, index.size, scan), exact=exact)
                out = self._matches(o, txn, found.keys, found.distances, filter, k)
                if len(out) >= k or want >= min(index.size, scan):
                    return out
                want *= 4

    def _matches(self, o: _Open, txn: Any, keys: Any, dists: Any,
                 filter: dict[str, Any] | None, k: int) -> list[Match]:
        out = []
        for key, dist in zip(keys, dists, strict=True):
            row = txn.get(_KEY.pack(int(key)), db=o.rows)
            if row is None:  # deleted, or newer than this snapshot
                continue
            id_, meta = self._row_head(row)
            if filter and not (isinstance(meta, dict)
                               and all(_equal(meta.get(f), v) for f, v in filter.items())):
                continue
            out.append(Match(id_, float(dist), meta))
            if len(out) == k:
                break
        return out

    def get(self, name: str, id_: str) -> tuple[np.ndarray, dict[str, Any] | None]:
        """The vector and metadata of `id_`, read from LMDB (so current without a
        catch-up). Raises `KeyNotFound`."""
        o = self._get(name)
        with self.env.begin(buffers=True) as txn:
            raw = txn.get(id_.encode(), db=o.ids)
            row = txn.get(raw, db=o.rows) if raw is not None else None
            if row is None:
                raise KeyNotFound(f"no vector {id_!r} in index {name!r}")
            return self._row_vector(o.config, row).copy(), self._row_head(row)[1]

    def stats(self, name: str) -> dict[str, Any]:
        o = self._get(name)
        with self.env.begin(buffers=True) as txn:
            self._sync(o, txn)
            count = txn.stat(o.ids)["entries"]
        return {**o.config.__dict__, "count": count, "indexed": o.index.size, "seq": o.applied,
                "saved_seq": o.saved_seq, "memory_bytes": o.index.memory_usage}

    def save(self, name: str) -> None:
        """Catch up, write the index file, then the sidecar naming its sequence; trim
        the log up to it."""
        self._save(self._get(name), only_if_full=False)

    def _save(self, o: _Open, only_if_full: bool) -> None:
        """`save`; with `only_if_full`, only if the log (read under the save lock:
        another process may have just saved) still holds `SAVE_EVERY` entries.
        Catching up under the save lock means each save holds at least what the one
        before it held (in any process), so the log it trims is never needed again."""
        file, sidecar = self._paths(o.config.name)
        with o.lock, _file_lock(self.dir / f"{o.config.name}.save.lock"):
            with self.env.begin(buffers=True) as txn:
                self._sync(o, txn)
                if only_if_full and txn.stat(o.log)["entries"] < SAVE_EVERY:
                    return
            _write_atomically(file, lambda tmp: o.index.save(str(tmp)))
            _write_atomically(sidecar, lambda tmp: tmp.write_text(json.dumps(
                {"seq": o.applied, "size": o.index.size, "blake2b": _digest(file)})))
            _fsync(self.dir)  # both renames are durable before the log they replace is gone
            with self.env.begin(write=True) as txn:
                cur = txn.cursor(db=o.log)
                while cur.first() and _KEY.unpack(bytes(cur.key()))[0] <= o.applied:
                    cur.delete()
            o.saved_seq = o.applied

    # -- helpers --------------------------------------------------------------------------------
    def _check(self) -> None:
        if self._closed:
            raise StoreClosed("vector store is closed")

    def _get(self, name: str) -> _Open:
        """Raises `StoreClosed`, `UnknownNamespace`. An index another process created
        is opened here on first use."""
        self._check()
        o = self._open.get(name)
        if o is None:
            if name not in self.names():
                raise UnknownNamespace(f"unknown vector index {name!r}")
            self._load(name)
            o = self._open[name]
        return o

    def _vector(self, c: IndexConfig, vector: Any) -> np.ndarray:
        """`vector` as f32 for index `c`. Raises `InvalidValue` for one that is not
        `c.dim` finite numbers, or that its graph's dtype cannot hold (an f16 graph
        turned 70000 into inf: that vector came first in every cos query, at NaN)."""
        v = as_vector(c.name, vector)
        if v.shape[0] != c.dim:
            raise InvalidValue(f"index {c.name!r} has dimension {c.dim}, got a vector of "
                               f"{v.shape[0]}")
        if c.dtype == "f16" and float(np.abs(v).max()) > F16_MAX:
            raise InvalidValue(f"index {c.name!r} holds f16: a component of magnitude "
                               f"{float(np.abs(v).max()):g} is past f16's {F16_MAX:g} (scale "
                               "the vector down; cos ignores its length)")
        return v

    def _encode(self, c: IndexConfig, id_: str, vector: Any,
                meta: dict[str, Any] | None) -> tuple[bytes, bytes, np.ndarray]:
        id_bytes = id_.encode()
        if not id_bytes or len(id_bytes) > MAX_ID_BYTES:
            raise LimitExceeded(f"vector ids must be 1 to {MAX_ID_BYTES} bytes, got {id_!r:.60}")
        if meta is not None and not isinstance(meta, dict):  # a filter reads it as an object
            raise InvalidValue(f"metadata of {id_!r} must be an object (or null), got "
                               f"{type(meta).__name__}")
        meta_bytes = json.dumps(meta, separators=(",", ":")).encode() if meta else b""
        if len(meta_bytes) > MAX_META_BYTES:
            raise LimitExceeded(f"metadata of {len(meta_bytes)} bytes for {id_!r} exceeds "
                                f"{MAX_META_BYTES}")
        v = self._vector(c, vector)
        row = _ROW.pack(len(id_bytes), len(meta_bytes)) + id_bytes + meta_bytes + v.tobytes()
        return id_bytes, row, v

    def _row_head(self, row: Any) -> tuple[str, dict[str, Any] | None]:
        n, m = _ROW.unpack_from(row)
        pos = _ROW.size
        id_ = bytes(row[pos:pos + n]).decode()
        meta = json.loads(bytes(row[pos + n:pos + n + m])) if m else None
        return id_, meta

    def _row_vector(self, c: IndexConfig, row: Any) -> np.ndarray:
        n, m = _ROW.unpack_from(row)
        start = _ROW.size + n + m
        return np.frombuffer(bytes(row[start:start + 4 * c.dim]), dtype=np.float32)


def _equal(value: Any, wanted: Any) -> bool:
    """A metadata filter's equality, JSON's: ``true`` is not ``1`` (Python's ``==``
    matched ``{"flag": 1}`` against ``{"flag": true}``); ``1`` is ``1.0``."""
    if isinstance(value, bool) or isinstance(wanted, bool):
        return value is wanted
    return bool(value == wanted)


def _held(txn: Any, counting: dict[str, tuple[int, Any]]) -> int:
    """The bytes the indexes of `counting` (`VectorStore._counting_dbs`) hold in `txn`."""
    return sum(txn.stat(ids)["entries"] * dim * 4 for dim, ids in counting.values())


def as_vector(index: str, vector: Any) -> np.ndarray:
    """`vector` (a list or tuple of numbers, or a 1-d numeric array) as an f32 array
    of at least one finite number. Raises `InvalidValue` naming `index`: for
    anything else too (nested lists were flattened into one longer vector, a
    number read as a vector of one, ``true`` as 1, ``null`` as NaN)."""
    if isinstance(vector, np.ndarray):
        if vector.ndim != 1 or vector.dtype.kind not in "iuf":
            raise InvalidValue(f"index {index!r}: vector is not a list of numbers (an array "
                               f"of {vector.ndim} dimensions of {vector.dtype})")
    elif not isinstance(vector, (list, tuple)):
        raise InvalidValue(f"index {index!r}: vector is not a list of numbers, got "
                           f"{_kind(vector)}")
    else:
        for i, x in enumerate(vector):
            if type(x) is not float and type(x) is not int:  # (bool is an int's subclass)
                raise InvalidValue(f"index {index!r}: vector is not a list of numbers (item "
                                   f"{i} is {_kind(x)})")
    try:
        with np.errstate(over="ignore"):  # past f32's range: inf, refused below
            v = np.asarray(vector, dtype=np.float32)
    except OverflowError:  # an int past f32's range
        raise InvalidValue(f"index {index!r}: vector has values past f32's range") from None
    if not v.shape[0]:
        raise InvalidValue(f"index {index!r}: the vector is empty")
    if not np.isfinite(v).all():
        raise InvalidValue(f"index {index!r}: vector has NaN or infinite values (or values "
                           "past f32's range)")
    return v


def _kind(x: Any) -> str:
    """What a vector's component is, in JSON's words where it came from JSON."""
    return {bool: "a boolean", type(None): "null", str: "a string", list: "a list",
            dict: "an object", int: "a number", float: "a number"}.get(type(x),
                                                                       type(x).__name__)


def _ids(index: str, ids: Any) -> list[str]:
    """`ids` as a list of strings. Raises `InvalidValue` for one string (each of its
    characters was deleted as an id) or anything but strings."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise InvalidValue(f"index {index!r}: ids must be a list of ids, got "
                           f"{type(ids).__name__}")
    out = list(ids)
    for id_ in out:
        if not isinstance(id_, str):
            raise InvalidValue(f"index {index!r}: ids are strings, got {type(id_).__name__}")
    return out


def _check_settings(name: str, dim: int, metric: str, dtype: str) -> None:
    """Raises `InvalidValue` naming the first bad setting."""
    if not name or len(name) > 64 or not all(c.isalnum() or c in "_-." for c in name):
        raise InvalidValue(f"invalid index name {name!r}")
    if not 1 <= dim <= MAX_DIM:
        raise InvalidValue(f"dimension must be 1..{MAX_DIM}, got {dim}")
    if metric not in METRICS:
        raise InvalidValue(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if dtype not in DTYPES:
        raise InvalidValue(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "i8" and metric != "cos":  # usearch scales each vector to length 1 for i8:
        # [3, 0] and [100, 0] were one point, and [100, 0] the nearest to [50, 0] under l2
        raise InvalidValue(f"dtype i8 keeps each vector's direction only (usearch scales it "
                           f"to length 1): use it with metric cos, f16 or f32 for {metric}")


def _check_graph(graph: dict[str, Any]) -> None:
    """Raises `InvalidValue` for a graph setting that is not an int in `GRAPH_LIMITS`."""
    for field, value in graph.items():
        low, high = GRAPH_LIMITS[field]
        if type(value) is not int or not low <= value <= high:
            raise InvalidValue(f"{field} must be an integer {low}..{high}, got {value!r}")


def _same(existing: IndexConfig, wanted: IndexConfig, chosen: dict[str, Any]) -> IndexConfig:
    """`existing` if it has `wanted`'s dim, metric and the settings in `chosen`;
    raises `InvalidValue` naming the existing settings otherwise."""
    fields = ("dim", "metric", *chosen)
    if any(getattr(existing, f) != getattr(wanted, f) for f in fields):
        have = " ".join(f"{f}={getattr(existing, f)}" for f in fields)
        raise InvalidValue(f"index {existing.name!r} exists with {have}")
    return existing


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _state(raw: Any) -> tuple[int, int]:
    """``(seq, next_key)`` of an index's LMDB record."""
    state = json.loads(bytes(raw))
    return state["seq"], state["next_key"]


def _seq(raw: Any) -> int:
    return _state(raw)[0]


def _put_state(txn: Any, db: Any, c: IndexConfig, seq: int, next_key: int) -> None:
    txn.put(c.name.encode(), json.dumps({**c.__dict__, "seq": seq, "next_key": next_key})
            .encode(), db=db)


def _digest(path: Path) -> str:
    """The BLAKE2b of the file at `path` (a saved index's, checked when it loads)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _write_atomically(path: Path, write: Any) -> None:
    """`write(tmp)`, fsync it, then rename it over `path`; a failed write leaves no
    tmp file behind (a full disk left a 0-byte one)."""
    tmp = path.with_suffix(".tmp")
    try:
        write(tmp)
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` across processes (flock; released if one dies)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
