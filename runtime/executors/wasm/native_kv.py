"""The native ``edgefn.kv_get`` (native_src/kv_get.c): a WASM guest's KV read in C
on the PoP's own LMDB environment, falling back to the Python host function for
everything but the plain case (see the C file).

Built on first use like the reactor's fast path (`native`), cached beside it.
Off with ``EDGEFN_NATIVE=0`` (all native code) or ``EDGEFN_NATIVE_KV=0`` (this
one; read at each deploy); also off, silently, for a store whose clock is not
the wall clock (tests that move time) and when py-lmdb's objects are not the
pinned layout (`kv.lmdb_handles`): then kv_get is the Python host function.

Permissions stay the binding's: the C side reads only namespaces in a table
filled from `KVBinding.namespace` (the one check), tagged with the owners'
generation; when the claims change the table is stale, reads go to Python,
and the first of them fills it again.
"""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import time
import weakref
from ctypes import POINTER, c_int32, c_uint32, c_uint64, c_void_p
from functools import cache
from pathlib import Path
from typing import Any

from edgefn_core.errors import BindingError, StoreError
from kv import KVStore
from kv.lmdb_handles import NativeUnavailable
from runtime.bindings.kv import KVBinding
from runtime.executors.wasm.native import build_library

log = logging.getLogger("edgefn.wasm")
SOURCE = Path(__file__).with_name("native_src") / "kv_get.c"
MAX_NAMESPACES = 64  # kv_get.c's MAX_NS; a function binding more keeps the Python path


class NativeKVLib:
    def __init__(self, path: Path) -> None:
        """Raises OSError if the library does not load."""
        lib = ctypes.CDLL(str(path))
        self.store_new = _sig(lib.edgefn_kv_store_new, c_void_p, c_void_p, c_void_p)
        self.store_close = _sig(lib.edgefn_kv_store_close, None, c_void_p)
        self.binding_new = _sig(lib.edgefn_kv_binding_new, c_void_p, c_void_p, c_void_p,
                                c_void_p)
        self.binding_free = _sig(lib.edgefn_kv_binding_free, None, c_void_p)
        self.binding_set = _sig(lib.edgefn_kv_binding_set, c_int32, c_void_p, c_uint64, c_int32,
                                ctypes.c_char_p, POINTER(c_uint32), POINTER(c_uint32))
        self.kv_get = ctypes.cast(lib.edgefn_kv_get, c_void_p).value
        self.lib = lib


def _sig(fn: Any, restype: Any, *argtypes: Any) -> Any:
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


@cache
def load() -> NativeKVLib | None:
    """The library, built if needed; None (logged) when it cannot be had."""
    if os.environ.get("EDGEFN_NATIVE", "1") == "0":
        return None
    try:
        return NativeKVLib(_build())
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        log.warning("native kv_get unavailable (%s); using the Python host function", e)
        return None


def _build() -> Path:
    """kv_get.c built into the native cache. Raises RuntimeError."""
    return build_library(SOURCE, "kv_get")


# One native reader per open KVStore: it holds pooled read transactions on the
# store's environment and lets go of them when the store closes.
_readers: weakref.WeakKeyDictionary[KVStore, int] = weakref.WeakKeyDictionary()


def _reader(lib: NativeKVLib, store: KVStore) -> int:
    """The native reader of `store`. Raises `NativeUnavailable`, `StoreError`."""
    handle = _readers.get(store)
    if handle is None:
        api, env = store.raw_handles()
        handle = lib.store_new(api, env)
        if not handle:
            raise MemoryError("cannot allocate the native KV reader")
        store.on_close(lambda: lib.store_close(handle))
        _readers[store] = handle
    return handle


class NativeKVGet:
    """The native kv_get of one deployed version: `callback` and `env` are what the
    Linker defines ``edgefn.kv_get`` with; `python` is the host function it falls
    back to. Keep this object alive as long as the Linker's instances."""

    def __init__(self, lib: NativeKVLib, binding: KVBinding, reader: int, python: Any) -> None:
        """`python`: the Python kv_get as a wasmtime unchecked callback (a ctypes
        function). Raises MemoryError."""
        self.lib = lib
        self.binding = binding
        self.owners = binding.stores.owners  # its generation counter is read from C
        self.python = python
        self.fallback = type(python)(self._fallback)
        self.table_generation = 0
        self.fallbacks = 0  # reads the C side handed to Python (observable in tests)
        self.env = lib.binding_new(reader, ctypes.addressof(self.owners.generation),
                                   ctypes.cast(self.fallback, c_void_p))
        if not self.env:
            raise MemoryError("cannot allocate the native kv_get")
        self.callback = type(python)(lib.kv_get)
        self._free = weakref.finalize(self, lib.binding_free, self.env)

    def _fallback(self, env: int, caller: int, vals: int, count: int) -> int:
        """The C side could not answer: Python does (and traps if it must); a
        stale table is filled again first, so the next read is native."""
        self.fallbacks += 1
        if self.owners.generation.value != self.table_generation:
            self.refresh()
        result: int = self.python(env, caller, vals, count)
        return result

    def refresh(self) -> None:
        """Tell the C side which namespaces the function may read now: those
        `KVBinding.namespace` allows, at the owners' current generation."""
        generation = self.owners.generation.value  # before the claims are read
        names, dbis = [], []
        for ns in sorted(self.binding.namespaces)[:MAX_NAMESPACES]:
            try:
                self.binding.namespace(ns)
                dbis.append(self.binding.stores.kv.raw_dbi(ns))
            except (BindingError, StoreError, NativeUnavailable):
                continue
            names.append(ns.encode())
        lens = (c_uint32 * len(names))(*map(len, names))
        handles = (c_uint32 * len(names))(*dbis)
        if self.lib.binding_set(self.env, generation, len(names), b"".join(names), lens,
                                handles) == 0:
            self.table_generation = generation


def attach(binding: KVBinding, python: Any) -> NativeKVGet | None:
    """The native kv_get for `binding`, or None where it cannot run (then the
    Linker defines `python`, the Python host function, as before)."""
    if os.environ.get("EDGEFN_NATIVE_KV", "1") == "0":
        return None
    lib = load()
    if lib is None:
        return None
    try:
        store = binding.stores.kv
        if store.clock is not time.time:
            return None  # expiry is decided against the wall clock in C
        return NativeKVGet(lib, binding, _reader(lib, store), python)
    except (NativeUnavailable, StoreError) as e:
        log.warning("native kv_get unavailable (%s); using the Python host function", e)
        return None


__all__ = ["NativeKVGet", "attach", "load"]
