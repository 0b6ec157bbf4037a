"""KV reads served inside an isolate, on the host's own read-only LMDB environment
(``EDGEFN_PYTHON_KV=local``; see `local_kv_env` for how the host opens it). Runs
in the subinterpreter: stdlib and ctypes only.

Only the plain case is served here: a namespace the function may read now, a
str key of 1..511 UTF-8 bytes, a well-formed record. Anything else (a denied or
undeclared namespace, a changed grant, a bad key, an LMDB error) answers None
and the SDK asks the PoP, which answers or raises exactly as before.

Grants stay the PoP's: which declared namespaces the function may read is asked
of the PoP (the ``kv.readable`` host call, `KVBinding.readable`), tagged with
the owners' claims generation, which the host watches in shared memory. When
the claims change the generation moves, and the next read asks again before it
reads. Every read is a fresh LMDB read transaction, so it sees every write the
PoP committed before it (the PoP commits before it answers a write).
"""

from __future__ import annotations

import ctypes
import struct
import time
from ctypes import POINTER, addressof, byref, c_int, c_size_t, c_uint, c_void_p
from typing import Any

MDB_RDONLY = 0x20000
MDB_NOTFOUND = -30798
MAX_KEY = 511
HEAD = struct.Struct("<QQI")  # kv/store.py's record: version, expires_at_ms, meta_len
# py-lmdb 3.0's MdbApi (lmdb/mdb_api.h, see kv.lmdb_handles): 4 ints, then functions
API_FNS, PTR = 16, ctypes.sizeof(c_void_p)
TXN_BEGIN, TXN_COMMIT, TXN_ABORT, DBI_OPEN, GET = 20, 21, 22, 26, 30


class MDBVal(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("data", c_void_p)]


class MDBKey(ctypes.Structure):  # an MDB_val made from bytes, which it keeps alive
    _fields_ = [("size", c_size_t), ("data", ctypes.c_char_p)]


def _fn(api: int, index: int, *sig: Any) -> Any:
    """The vtable entry `index` of `api` as a ctypes function of signature `sig`."""
    return ctypes.CFUNCTYPE(*sig)(c_void_p.from_address(api + API_FNS + index * PTR).value or 0)


class LocalKV:
    """One isolate's reader. `handles`: what `local_kv_env.open_env` made (the
    vtable and ``MDB_env *``, the generation's address, the host's dbi-open lock);
    `call`: the isolate's host call (for ``kv.readable``)."""

    def __init__(self, handles: dict[str, Any], call: Any) -> None:
        api = handles["api"]
        self.env: int = handles["env"]
        self.dbis: dict[str, int] = {}  # namespace -> LMDB handle, opened on first grant
        self.generation = ctypes.c_uint64.from_address(handles["generation"])
        self.lock = c_void_p(handles["lock"])
        self.libc = ctypes.CDLL(None)
        self.call = call
        self.readable: dict[str, int] = {}
        self.table_generation = 0  # 0: never asked
        # plain addresses in and out: ctypes converts them fastest (~1 us a call here)
        self.begin = _fn(api, TXN_BEGIN, c_int, c_void_p, c_void_p, c_uint, c_void_p)
        self.abort = _fn(api, TXN_ABORT, None, c_void_p)
        self.commit = _fn(api, TXN_COMMIT, c_int, c_void_p)
        self.dbi_open = _fn(api, DBI_OPEN, c_int, c_void_p, ctypes.c_char_p, c_uint,
                            POINTER(c_uint))
        self.get_ = _fn(api, GET, c_int, c_void_p, c_uint, c_void_p, c_void_p)

    def get(self, ns: str, key: Any) -> tuple[bytes | None] | None:
        """``(value,)`` (None: absent or expired), or None: ask the PoP. Raises
        `BindingError` only if the ``kv.readable`` call does (the PoP is gone)."""
        if self.generation.value != self.table_generation and not self.refresh():
            return None
        dbi = self.readable.get(ns)
        if dbi is None or type(key) is not str:
            return None
        try:
            k = key.encode()
        except UnicodeEncodeError:
            return None
        if not 0 < len(k) <= MAX_KEY:
            return None
        raw = self.read(dbi, k)
        return None if raw is None else (_live_value(raw) if raw else (None,))

    def refresh(self) -> bool:
        """Ask the PoP which declared namespaces the function may read now; whether
        the answer is current (the claims did not change meanwhile)."""
        out = self.call("kv.readable", {}, True)
        self.readable = {}
        for ns in out["namespaces"]:
            dbi = self.dbis.get(ns)
            if dbi is None:
                dbi = self.dbis[ns] = self.open_dbi(ns)
            if dbi >= 0:
                self.readable[ns] = dbi
        self.table_generation = out["generation"]
        return bool(self.generation.value == self.table_generation)

    def open_dbi(self, ns: str) -> int:
        """The LMDB handle of namespace `ns` (-1: not there, or an LMDB error). One
        opener at a time in the process (LMDB's rule), so under the host's lock; a
        read transaction's commit makes the handle the environment's."""
        txn, dbi = c_void_p(), c_uint()
        self.libc.pthread_mutex_lock(self.lock)
        try:
            if self.begin(self.env, None, MDB_RDONLY, addressof(txn)):
                return -1
            if self.dbi_open(txn, b"ns:" + ns.encode(), 0, byref(dbi)):
                self.abort(txn)
                return -1
            return dbi.value if self.commit(txn) == 0 else -1
        finally:
            self.libc.pthread_mutex_unlock(self.lock)

    def read(self, dbi: int, key: bytes) -> bytes | None:
        """The raw record of `key` (b"": absent), or None on an LMDB error."""
        txn = c_void_p()  # set only once begun: then aborted, whatever interrupts
        try:  # (the watchdog's asynchronous exception may land on any line)
            if self.begin(self.env, None, MDB_RDONLY, addressof(txn)):
                return None  # readers full, map resized, ...: the PoP answers
            k, v = MDBKey(len(key), key), MDBVal()
            rc = self.get_(txn.value, dbi, addressof(k), addressof(v))
            if rc:
                return b"" if rc == MDB_NOTFOUND else None
            return ctypes.string_at(v.data, v.size) if v.size >= HEAD.size else None
        finally:
            if txn.value:
                self.abort(txn.value)  # with MDB_NOTLS this frees the reader slot too


def _live_value(raw: bytes) -> tuple[bytes | None] | None:
    """The value of record `raw` if it has not expired (as `KVStore._decode`
    decides, on the wall clock); None if the record is malformed."""
    _, exp, meta = HEAD.unpack_from(raw)
    if exp and exp <= int(time.time() * 1000):
        return (None,)
    if HEAD.size + meta > len(raw):
        return None
    return (raw[HEAD.size + meta:],)
