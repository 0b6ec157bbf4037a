"""Host functions WASM guests import from the ``edgefn`` module: KV and vector
bindings, checked by the function's `Bindings` like Python's host calls.

    kv_get(ns, ns_len, key, key_len, buf, cap) -> i64   value length, or -1 if absent;
                                                    the value is copied to buf if it fits
                                                    (else call again with a larger buf)
    kv_put(ns, ns_len, key, key_len, val, val_len) -> i64   the key's new version
    kv_delete(ns, ns_len, key, key_len) -> i32      1 if it existed
    kv_increment(ns, ns_len, key, key_len, delta: i64) -> i64   the new value
    call(name, name_len, args, args_len, buf, cap) -> i64   any binding ("vectors.query",
                                                    ...) with JSON args; JSON result as kv_get

Results land in a buffer the guest passes, so no call re-enters the guest. A
denied or failed call traps with the reason.

Epochs count real time, and a host call may wait (a synced KV write behind
others). Where the deadline is the CPU budget, each host call pushes it back by
the time the call took (`GuestRequest.deadline`), so `cpu_ms` bounds the guest's own
execution; where it is the wall time (the AI binding, or `wall_ms` < `cpu_ms`)
host calls count.
"""

from __future__ import annotations

import ctypes
import json
import math
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
import wasmtime
from wasmtime import _ffi as ffi

from edgefn_core import hostcall
from edgefn_core.errors import BindingError
from runtime.bindings import Bindings
from runtime.bindings import stop as stopping
from runtime.bindings.fetch import LOOP_ARG, Lineage
from runtime.bindings.kv import KVView
from runtime.executors.wasm import native_kv
from runtime.executors.wasm.engine import TICK_SECONDS
from runtime.executors.wasm.ffi import (
    _EXTERN_OF,
    RAW_CALLBACK,
    _fn,
    define_unchecked,
    memory_data,
    memory_data_size,
    set_epoch_deadline,
)
from runtime.executors.wasm.native_kv import NativeKVGet

I32, I64 = wasmtime.ValType.i32(), wasmtime.ValType.i64()
SIGNATURES = {
    "kv_get": ([I32] * 6, [I64]),
    "kv_put": ([I32] * 6, [I64]),
    "kv_delete": ([I32] * 4, [I32]),
    "kv_increment": ([I32] * 4 + [I64], [I64]),
    "call": ([I32] * 6, [I64]),
}


_caller_export = _fn("wasmtime_caller_export_get", ctypes.c_bool, ctypes.c_void_p,
                     ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p)
_caller_context = _fn("wasmtime_caller_context", ctypes.c_void_p, ctypes.c_void_p)
_trap_new = _fn("wasmtime_trap_new", ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)
TRAP_PREFIX = "edgefn binding: "
WALL_PREFIX = "edgefn wall: "  # a host call made past the request's wall-time limit


class _Memory:
    """The calling instance's linear memory, looked up once per host call."""

    def __init__(self, caller: int) -> None:
        ext = ffi.wasmtime_extern_t()
        if not _caller_export(caller, b"memory", 6, ctypes.byref(ext)):
            raise BindingError("the module exports no memory")
        ctx = _caller_context(caller)
        mem = ctypes.byref(ext, _EXTERN_OF)
        self.base = memory_data(ctx, mem)
        self.size = memory_data_size(ctx, mem)

    def _check(self, ptr: int, length: int) -> None:
        if ptr < 0 or length < 0 or ptr + length > self.size:
            raise BindingError(f"pointer ({ptr}, {length}) is outside guest memory")

    def read(self, ptr: int, length: int) -> bytes:
        self._check(ptr, length)
        return ctypes.string_at(self.base + ptr, length)

    def text(self, ptr: int, length: int) -> str:
        return self.read(ptr, length).decode("utf-8", "replace")

    def give(self, data: bytes, ptr: int, cap: int) -> int:
        """Copy `data` to (ptr, cap) if it fits; its length either way."""
        if len(data) <= cap:
            self._check(ptr, len(data))
            ctypes.memmove(self.base + ptr, data, len(data))
        return len(data)


class Origin(NamedTuple):
    """What a guest's host calls carry of the request it runs: its ``traceparent``
    (fetch and model calls send it on), the calling principal's tenant (a pinned
    one's model calls keep to its region: `runtime.bindings.Bindings.call`) and where
    it stands in a tree of subrequests (`fetch.Lineage`: its ``CDN-Loop``, which a
    fetch adds to, refusing past `fetch.MAX_HOPS` or its tree's `MAX_SUBREQUESTS`)."""

    traceparent: str | None = None
    tenant: str | None = None
    lineage: Lineage | None = None


NO_ORIGIN = Origin()


class GuestRequest(threading.local):
    """Per worker thread, the request its guest is running (`HostFunctions.begin_request`
    starts each): when its CPU budget ends (`time.monotonic()` seconds, or 0 when host
    calls count against its deadline), and a `call` result kept for the retry with a
    bigger buffer (``((name, args), result)``)."""

    deadline: float = 0.0
    wall_deadline: float = 0.0  # when its wall time ends (0: not set): the CPU deadline
    # never moves past it, and a host call past it traps (a guest looping on host calls
    # ran on for seconds after its client's 504, each call pushing its deadline back)
    kept: tuple[tuple[str, bytes], bytes] | None = None
    origin: Origin = NO_ORIGIN  # the request's traceparent and caller


class HostFunctions:
    """The ``edgefn`` imports of one function, defined on its Linker through
    wasmtime's unchecked (raw-value) callbacks: no per-call value conversion in
    wasmtime-py. Keep this object alive as long as the Linker's instances."""

    def __init__(self, linker: wasmtime.Linker, names: set[str], bindings: Bindings) -> None:
        """Raises `BindingError` for an import that edgefn does not provide."""
        self.request = GuestRequest()
        impls = _impls(bindings, self.request)
        self.callbacks: list[Any] = []
        self.native_kv: NativeKVGet | None = None  # kv_get in C, when it can run
        for name in sorted(names):
            if name not in SIGNATURES:
                raise BindingError(f"`edgefn.{name}` is not a host function edgefn provides "
                                    f"(known: {', '.join(sorted(SIGNATURES))})")
            params, results = SIGNATURES[name]
            ty = wasmtime.FuncType(params, results)
            cb = RAW_CALLBACK(_raw(impls[name], [p == I64 for p in params], results[0] == I64,
                                self.request))
            self.callbacks.append((cb, ty))
            env = None
            if name == "kv_get":
                self.native_kv = native_kv.attach(bindings.kv, cb)
                if self.native_kv is not None:
                    cb, env = self.native_kv.callback, self.native_kv.env
            err = define_unchecked(ctypes.cast(linker.ptr(), ctypes.c_void_p).value, b"edgefn", 6,
                          name.encode(), len(name), ctypes.cast(ty.ptr(), ctypes.c_void_p).value,
                          cb, env, None)
            if err:
                raise BindingError(f"cannot define edgefn.{name}")

    def begin_request(self, cpu_deadline: float = 0.0, origin: Origin = NO_ORIGIN,
                      wall_deadline: float = 0.0) -> None:
        """A request starts on this thread; its CPU budget ends at `cpu_deadline`
        (`time.monotonic()`), or 0: host calls count against its deadline; its wall
        time at `wall_deadline` (0: no such bound here). A result kept for a retry
        belonged to an earlier request (one that never asked again with a bigger
        buffer): it is forgotten."""
        self.request.deadline = cpu_deadline
        self.request.wall_deadline = wall_deadline
        self.request.kept = None
        self.request.origin = origin


def _raw(impl: Callable[..., int], wide: list[bool], wide_result: bool,
         request: GuestRequest) -> Callable[..., int]:
    """Adapt `impl(memory, *args)` to wasmtime's raw callback; errors become traps."""
    def callback(env: int, caller: int, vals: int, count: int) -> int:
        started = time.monotonic()
        if request.wall_deadline and started > request.wall_deadline:
            msg = WALL_PREFIX.encode() + b"a host call past the wall-time limit"
            return _trap_new(msg, len(msg)) or 0
        stop = stopping.current.get()
        if stop is not None and stop.cancelled:  # its request left: no more calls for it
            msg = (TRAP_PREFIX + stopping.CANCELLED).encode()
            return _trap_new(msg, len(msg)) or 0
        try:
            args = [(ctypes.c_int64 if w else ctypes.c_int32).from_address(vals + 16 * i).value
                    for i, w in enumerate(wide)]
            result = impl(_Memory(caller), *args)
            (ctypes.c_int64 if wide_result else ctypes.c_int32).from_address(vals).value = result
            return 0
        except Exception as e:  # the guest traps with this message
            msg = (TRAP_PREFIX + str(e)).encode()
            return _trap_new(msg, len(msg)) or 0
        finally:
            if request.deadline:
                _push_back(request, started, caller)
    return callback


def _push_back(request: GuestRequest, started: float, caller: int) -> None:
    """Move the CPU deadline back by the time this host call took."""
    now = time.monotonic()
    request.deadline += now - started
    if request.wall_deadline and request.deadline > request.wall_deadline:
        request.deadline = request.wall_deadline
    ticks = math.ceil(max(request.deadline - now, 0) / TICK_SECONDS) + 1
    set_epoch_deadline(_caller_context(caller), ticks)


def _impls(b: Bindings, request: GuestRequest) -> dict[str, Callable[..., Any]]:
    def kv(m: _Memory, p: int, n: int) -> tuple[KVView, str]:
        ns = b.kv.namespace(m.text(p, n))
        return b.kv.store, ns

    def kv_get(m: _Memory, nsp: int, nsl: int, kp: int, kl: int, bp: int, cap: int) -> int:
        store, ns = kv(m, nsp, nsl)
        value = store.get(ns, m.read(kp, kl))
        return -1 if value is None else m.give(value, bp, cap)

    # A write ends any `call` result kept for a retry: a call after it runs anew.
    def kv_put(m: _Memory, nsp: int, nsl: int, kp: int, kl: int, vp: int, vl: int) -> int:
        request.kept = None
        store, ns = kv(m, nsp, nsl)
        return store.put(ns, m.read(kp, kl), m.read(vp, vl))

    def kv_delete(m: _Memory, nsp: int, nsl: int, kp: int, kl: int) -> int:
        request.kept = None
        store, ns = kv(m, nsp, nsl)
        return int(store.delete(ns, m.read(kp, kl)))

    def kv_increment(m: _Memory, nsp: int, nsl: int, kp: int, kl: int, delta: int) -> int:
        request.kept = None
        store, ns = kv(m, nsp, nsl)
        return store.increment(ns, m.read(kp, kl), delta)

    # A result too big for the guest's buffer is kept (per thread, until the thread's
    # next request: `HostFunctions.begin_request`) for the retry with a buffer it fits,
    # so the call (a model generation, say) is not run twice. Only that retry takes it:
    # the same call again with a buffer still too small (or none: `cap` 0, "run it, I
    # do not need the result") runs again (a loop of increments lost every other one).

    def call(m: _Memory, np_: int, nl: int, ap: int, al: int, bp: int, cap: int) -> int:
        if nl > 256:  # a 30 MiB name went into the error, the log and the response
            raise BindingError(f"call name of {nl} bytes (at most 256)")
        name = m.text(np_, nl)
        if al > hostcall.MAX_BYTES:  # not even copied out of guest memory
            raise BindingError(f"call {name!r}: its arguments are {al} bytes of JSON (at "
                               f"most {hostcall.MAX_BYTES})")
        raw = m.read(ap, al)
        kept, request.kept = request.kept, None
        if kept is not None and kept[0] == (name, raw) and len(kept[1]) <= cap:
            return m.give(kept[1], bp, cap)
        if (why := hostcall.refused(raw)) is not None:
            raise BindingError(f"call {name!r}: {why}")
        try:  # msgspec: 4x json's speed on numbers (the GIL is held throughout)
            args = msgspec.json.decode(raw or b"{}")
        except (ValueError, RecursionError) as e:
            raise BindingError(f"call arguments are not JSON: {e}") from None
        origin = request.origin
        if origin.traceparent is not None and isinstance(args, dict) and (
                name == "fetch" or name.startswith("ai.")):
            args["traceparent"] = origin.traceparent  # the request's, not the guest's
        if name == "fetch" and isinstance(args, dict):
            args[LOOP_ARG] = origin.lineage  # the request's, whatever the guest put there
        out = json.dumps(b.call(name, args, origin.tenant)).encode()
        if len(out) > cap:
            request.kept = ((name, raw), out)
        return m.give(out, bp, cap)

    return {"kv_get": kv_get, "kv_put": kv_put, "kv_delete": kv_delete,
            "kv_increment": kv_increment, "call": call}
