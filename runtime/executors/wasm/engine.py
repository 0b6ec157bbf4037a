"""One wasmtime Engine for the PoP: its configuration, the epoch ticker and the
compiled-module cache.

Modules are compiled once at deploy and cached on disk under a key made of the
module's hash, the wasmtime version and this engine's configuration, so a
restarted PoP loads machine code in ~100 us instead of compiling again.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import hashlib
import logging
import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

import wasmtime
from wasmtime import _bindings as bindings

from runtime.executors.wasm.shares import ThreadShares
from runtime.executors.wasm.wasi_poll import Deadlines
from runtime.functions.manifest import MAX_CPU_MS, MAX_WALL_MS

if TYPE_CHECKING:  # native imports this module (its version): a cycle at run time
    from runtime.executors.wasm.native import NativeTicker

log = logging.getLogger("edgefn.wasm")

TICK_SECONDS = 0.001  # one epoch tick; CPU and wall limits are counted in ticks
# the native ticker parks once no guest has run for this long (reactor.c)
TICKER_IDLE_SECONDS = 1.0
# past any deadline a guest can hold (the longest limit, in ticks, and the first tick's +1):
# `close()` moves the epoch this far, since no ticker will after it
EXPIRE_TICKS = int(max(MAX_CPU_MS, MAX_WALL_MS) / 1000 / TICK_SECONDS) + 2
POOL_INSTANCES = 128  # live instances at once (inline reactor calls + WASI threads)
POOL_MAX_MEMORY = 1 << 30  # the largest `limits.memory_mb` the pool can host
# Each instance's first bytes of linear memory are reset by memset when it is dropped;
# the rest by madvise, whose pages fault in again at the next touch (and whose TLB
# shootdown interrupts the other cores). 128 KiB covers a C command's or reactor's
# two pages (wasi-sdk: data, then a 64 KiB stack): hello-c's run took 24.5 us with 64
# KiB kept (faults and shootdowns were 13% of its samples), 14.4 us with this; a
# one-page module (hello-wat) resets its 64 KiB either way. The default of `[wasm]
# keep_resident_kib`; bench/bench_reset.py measures the trade-off. wasmtime's
# PAGEMAP_SCAN reset (only the pages a guest dirtied) is not in its C API (50.0.1, 51.0.0).
KEEP_RESIDENT = 128 << 10
WORKER_THREADS = 16  # WASI commands and reactors that may block or run long
THREAD_SHARE = WORKER_THREADS // 4  # the most of them one function holds at once
# ... and all the functions of one owner together: two owners with long functions held
# every thread at half each (a function of a third then waited out its wall limit); above
# one function's share, so an owner's busy function leaves threads to its others
TENANT_SHARE = WORKER_THREADS * 3 // 8
# ... and threads past those that go only to owners holding none: three owners at
# their share held every thread, and a fourth's request waited (`shares.ThreadShares`)
THREAD_RESERVE = WORKER_THREADS // 4
THREAD_POOL = WORKER_THREADS + THREAD_RESERVE
WASMTIME_VERSION = version("wasmtime")
# A pooling engine reserves every instance's slots up front: ~2,000 memory mappings each.
# Linux's default `vm.max_map_count` (65530) held 31 of them in one process, and wasmtime
# aborts the process (not an error: "failed to protect stack guard page") when the next
# cannot be made. A PoP makes one; a process holding more (tests, PoPs in one process,
# closed ones whose engines wait in reference cycles) gets on-demand engines past this.
POOLED_MAX = 8
_pooled: weakref.WeakSet[wasmtime.Engine] = weakref.WeakSet()


class WasmEngine:
    """Owns the Engine and its epoch ticker; `close()` stops the ticker.

    `native`: use the C fast path (`wasm_native`) for reactor calls and the
    ticker; None picks it when it can be built. `ticker_idle`: the native ticker
    parks once no guest has run for this many seconds (0: never). `keep_resident`:
    the bytes at the start of a freed instance's linear memory the pool zeroes by
    memset, the rest it decommits (`[wasm] keep_resident_kib`; see KEEP_RESIDENT).
    `thread_memory_mb`: the guest memory the worker threads' requests may count
    together (`[wasm] max_thread_memory_mb`; 0: not bounded; `shares`).
    """

    def __init__(self, cache_dir: str | Path | None = None, pooling: bool = True,
                 native: bool | None = None, ticker_idle: float = TICKER_IDLE_SECONDS,
                 keep_resident: int = KEEP_RESIDENT, thread_memory_mb: int = 0) -> None:
        from runtime.executors.wasm import native as wasm_native

        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.compiles = 0  # modules compiled rather than loaded from the cache (tests count them)
        self.keep_resident = keep_resident  # bytes ([wasm] keep_resident_kib); pooling only
        self.thread_memory_mb = thread_memory_mb
        self.engine, self.pooling = _make_engine(pooling, keep_resident)
        self.fingerprint = (f"wasmtime={WASMTIME_VERSION};epoch=1;pooling={int(self.pooling)};"
                            f"max_memory={POOL_MAX_MEMORY}")
        self.threads = ThreadPoolExecutor(max_workers=THREAD_POOL,
                                          thread_name_prefix="edgefn-wasm")
        self.native = wasm_native.load() if native is not False else None
        if native and self.native is None:
            raise RuntimeError("the native fast path was requested but cannot be built")
        self._stop = threading.Event()  # set by close(): ends the ticker and WASI sleeps
        self.deadlines = Deadlines()  # per worker thread: the running WASI request's deadline
        # per event loop: the worker threads each owner's functions hold (`shares`)
        self._shares: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, ThreadShares] = weakref.WeakKeyDictionary()
        self._native_ticker: NativeTicker | None = None
        if self.native is not None:
            self._native_ticker = wasm_native.NativeTicker(self.native, self.engine, TICK_SECONDS,
                                                           ticker_idle)
        else:  # a Python thread: takes the GIL 1000 times a second, hence the native one
            # (it never parks: it ticks while the PoP idles)
            self._ticker = threading.Thread(target=self._tick, name="edgefn-epoch", daemon=True)
            self._ticker.start()

    def shares(self, loop: asyncio.AbstractEventLoop) -> ThreadShares:
        """The worker threads `loop`'s functions share: each owner's at most
        `TENANT_SHARE` at once (one owner's functions that block or loop, four of
        them at their `THREAD_SHARE`, filled every thread), `WORKER_THREADS` for
        any owner, `THREAD_RESERVE` more only for owners holding none; and the guest
        memory their requests count (`thread_memory_mb`)."""
        shares = self._shares.get(loop)
        if shares is None:
            shares = self._shares[loop] = ThreadShares(THREAD_POOL, TENANT_SHARE,
                                                       THREAD_RESERVE, self.thread_memory_mb)
        return shares

    def _tick(self) -> None:
        """One epoch per tick of real time, catching up after a late wake-up."""
        increment = bindings.wasmtime_engine_increment_epoch
        ptr = self.engine.ptr()
        start, done = time.monotonic(), 0
        while not self._stop.is_set():
            time.sleep(max(start + (done + 1) * TICK_SECONDS - time.monotonic(), 0))
            due = int((time.monotonic() - start) / TICK_SECONDS)
            for _ in range(due - done):
                increment(ptr)
            done = max(done, due)

    @property
    def native_ticker(self) -> NativeTicker | None:
        """The C ticker (`native`), or None where the Python one ticks."""
        return self._native_ticker

    @property
    def stopping(self) -> threading.Event:
        """Set once the engine closes."""
        return self._stop

    def compile(self, wasm: bytes) -> wasmtime.Module:
        """Compile `wasm` (binary), or load its machine code from the cache.

        Raises `wasmtime.WasmtimeError` if the module is invalid.
        """
        if self.cache_dir is None:
            self.compiles += 1
            return wasmtime.Module(self.engine, wasm)
        key = hashlib.sha256(self.fingerprint.encode() + b"\0" + wasm).hexdigest()
        path = self.cache_dir / f"{key}.cwasm"
        if path.exists():
            try:
                return wasmtime.Module.deserialize_file(self.engine, str(path))
            except wasmtime.WasmtimeError:
                log.warning("discarding unreadable compiled module %s", path)
        self.compiles += 1
        module = wasmtime.Module(self.engine, wasm)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(module.serialize())
        os.replace(tmp, path)
        return module

    def close(self) -> None:
        """Stop the ticker, then end every guest still running: the epoch moves past
        any deadline (`EXPIRE_TICKS`). Without that a guest spinning on a worker thread
        ran on forever once the ticker stopped, and so did its process: interpreter exit
        joins the worker threads. (A guest in a host call then traps at its next one:
        its request was cancelled, `runtime.bindings.stop`.)"""
        self._stop.set()
        if self._native_ticker is not None:
            self._native_ticker.stop()
            self._native_ticker.lib.epoch_advance(
                ctypes.cast(self.engine.ptr(), ctypes.c_void_p).value, EXPIRE_TICKS)
        else:
            self._ticker.join(timeout=1)
            increment, ptr = bindings.wasmtime_engine_increment_epoch, self.engine.ptr()
            for _ in range(EXPIRE_TICKS):
                increment(ptr)
        self.threads.shutdown(wait=False, cancel_futures=True)


def _make_engine(pooling: bool, keep_resident: int = KEEP_RESIDENT
                 ) -> tuple[wasmtime.Engine, bool]:
    """An Engine with epoch interruption and, where the host allows, the pooling allocator
    (not past `POOLED_MAX` live pooling engines in this process).

    The pooling allocator makes a fresh instance per request cost single-digit
    microseconds; it is only reachable through wasmtime-py's private bindings.
    """
    config = wasmtime.Config()
    config.epoch_interruption = True
    if pooling and len(_pooled) >= POOLED_MAX:
        gc.collect()  # closed PoPs' engines, held only by reference cycles
        if len(_pooled) >= POOLED_MAX:
            log.warning("%d pooling engines are live in this process; this one makes its "
                        "instances on demand (POOLED_MAX)", len(_pooled))
            pooling = False
    if pooling:
        try:
            _enable_pooling(config, keep_resident)
            engine = wasmtime.Engine(config)
            _pooled.add(engine)
            return engine, True
        except (wasmtime.WasmtimeError, AttributeError, OSError) as e:
            log.warning("pooling allocator unavailable (%s); using on-demand instances", e)
            config = wasmtime.Config()
            config.epoch_interruption = True
    return wasmtime.Engine(config), False


def _enable_pooling(config: wasmtime.Config, keep_resident: int) -> None:
    pc = bindings.wasmtime_pooling_allocation_config_new()
    try:
        bindings.wasmtime_pooling_allocation_config_total_core_instances_set(pc, POOL_INSTANCES)
        bindings.wasmtime_pooling_allocation_config_total_memories_set(pc, POOL_INSTANCES)
        bindings.wasmtime_pooling_allocation_config_total_tables_set(pc, POOL_INSTANCES)
        bindings.wasmtime_pooling_allocation_config_max_memory_size_set(pc, POOL_MAX_MEMORY)
        # Reset small memories with memset instead of madvise: a syscall less per request.
        bindings.wasmtime_pooling_allocation_config_linear_memory_keep_resident_set(
            pc, keep_resident)
        bindings.wasmtime_pooling_allocation_config_table_keep_resident_set(pc, 1 << 16)
        bindings.wasmtime_pooling_allocation_strategy_set(config.ptr(), pc)
    finally:
        bindings.wasmtime_pooling_allocation_config_delete(pc)


def ptr_value(obj: object) -> int:
    """The address behind a wasmtime-py object's C pointer, for the raw call path."""
    ptr = obj.ptr()  # type: ignore[attr-defined]
    return ctypes.cast(ptr, ctypes.c_void_p).value or 0
