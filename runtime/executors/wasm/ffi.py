"""The raw wasmtime C-API call path for the reactor ABI.

wasmtime-py's public ``Func.__call__`` costs 50-100 us per call (it re-reads the
function type and converts values in Python). Here each request makes a new
Store, instantiates the pre-linked module, and calls the two exports through
``wasmtime_func_call_unchecked`` with preallocated buffers: ~10 us for the
instance and a few us per call. Everything in this module depends on
wasmtime-py's private ``_ffi`` (pinned in pyproject.toml).

A `ReactorCall` is not thread-safe: it reuses its buffers. Use one per thread.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_bool, c_int64, c_size_t, c_uint32, c_uint64, c_void_p
from time import perf_counter_ns
from typing import Any

import wasmtime
from wasmtime import _ffi as ffi

from edgefn_core.abi import Pairs, decode_response, encode_request
from edgefn_core.errors import FunctionError
from runtime.executors.wasm.timing import InstantiateTimes

V = c_void_p


def _fn(name: str, restype: type | None, *argtypes: type) -> Any:
    # A private prototype per symbol: wasmtime-py's own have typed pointer argtypes.
    return ctypes.CFUNCTYPE(restype, *argtypes)((name, ffi.dll))


# wasmtime's unchecked (raw-value) host callback and its define: C ones (native_kv,
# native_wasi) and Python ones (host) alike
RAW_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_size_t)
define_unchecked = _fn("wasmtime_linker_define_func_unchecked", V, V, ctypes.c_char_p,
                       ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, V, RAW_CALLBACK,
                       V, V)
store_new = _fn("wasmtime_store_new", V, V, V, V)
store_context = _fn("wasmtime_store_context", V, V)
store_delete = _fn("wasmtime_store_delete", None, V)
store_limiter = _fn("wasmtime_store_limiter", None, V, c_int64, c_int64, c_int64, c_int64, c_int64)
set_epoch_deadline = _fn("wasmtime_context_set_epoch_deadline", None, V, c_uint64)
instantiate_pre = _fn("wasmtime_instance_pre_instantiate", V, V, V, V, V)
export_get = _fn("wasmtime_instance_export_get", c_bool, V, V, V, c_size_t, V)
call_unchecked = _fn("wasmtime_func_call_unchecked", V, V, V, V, c_size_t, V)
memory_data = _fn("wasmtime_memory_data", c_size_t, V, V)
memory_data_size = _fn("wasmtime_memory_data_size", c_size_t, V, V)

_EXTERN_OF = ffi.wasmtime_extern_t.of.offset
_NAMES = (b"memory", b"edgefn_alloc", b"edgefn_handle")


class Outcome:
    """Limits of one call, to classify a trap: `interrupt_kind` is what an epoch
    interrupt means for this function (``cpu_limit`` or ``wall_limit``)."""

    __slots__ = ("interrupt_kind", "limit_ms", "memory_limit")

    def __init__(self, interrupt_kind: str, limit_ms: int, memory_limit: int) -> None:
        self.interrupt_kind = interrupt_kind
        self.limit_ms = limit_ms
        self.memory_limit = memory_limit


class CallTarget:
    """What every reactor call path needs: raw engine and pre-linked module
    pointers, and the function's limits."""

    def __init__(self, engine: wasmtime.Engine, pre: wasmtime.InstancePre, memory_limit: int,
                 deadline_ticks: int, outcome: Outcome, max_response: int,
                 times: InstantiateTimes | None = None) -> None:
        """`times`: where requests' instantiation times go (not warm-ups')."""
        self._keep = (engine, pre)  # the raw pointers below live as long as these
        self.times = times
        self.engine = ctypes.cast(engine.ptr(), V).value
        self.pre = ctypes.cast(pre.ptr(), V).value
        self.memory_limit = memory_limit
        self.deadline_ticks = deadline_ticks
        self.outcome = outcome
        self.max_response = max_response

    def __call__(self, request: bytes) -> bytes:
        raise NotImplementedError

    def serve(self, method: bytes, path: bytes, query: bytes, headers: Pairs, env_blob: bytes,
              body: bytes, params_blob: bytes, principal_blob: bytes
              ) -> tuple[int, Pairs, bytes]:
        """One request from its fields (see `edgefn_core.abi.encode_request`) to the
        decoded response. Raises `FunctionError` as `__call__` and `decode_response` do."""
        return decode_response(self(encode_request(method, path, query, headers, env_blob,
                                                   body, params_blob, principal_blob)))


class ReactorCall(CallTarget):
    """Runs one request through a fresh instance of a pre-linked reactor module."""

    def __init__(self, engine: wasmtime.Engine, pre: wasmtime.InstancePre, memory_limit: int,
                 deadline_ticks: int, outcome: Outcome, max_response: int,
                 times: InstantiateTimes | None = None) -> None:
        super().__init__(engine, pre, memory_limit, deadline_ticks, outcome, max_response,
                         times)
        self.instance = ffi.wasmtime_instance_t()
        self.externs = [ffi.wasmtime_extern_t() for _ in _NAMES]
        self.vals = (ffi.wasmtime_val_raw_t * 2)()
        # wasmtime_val_raw_t is 16 bytes: argument i starts at u32[4 * i].
        self.u32 = (c_uint32 * 8).from_buffer(self.vals)
        self.u64 = (c_uint64 * 4).from_buffer(self.vals)
        self.trap = V()
        # byref() objects made once: the hot path below runs ~10 ctypes calls per request.
        self.inst_ref = byref(self.instance)
        self.trap_ref = byref(self.trap)
        self.lookups = [(ctypes.c_char_p(n), len(n), byref(e))
                        for n, e in zip(_NAMES, self.externs, strict=True)]
        self.memory, self.alloc, self.handle = (byref(e, _EXTERN_OF) for e in self.externs)

    def __call__(self, request: bytes) -> bytes:
        """Instantiate, pass `request`, return the guest's encoded response.

        Raises `FunctionError` for a trap, an exceeded limit or an out-of-bounds
        response; the instance is always discarded.
        """
        started = perf_counter_ns() if self.times is not None else 0
        store = store_new(self.engine, None, None)
        try:
            return self._run(store, store_context(store), request, started=started)
        finally:
            store_delete(store)

    def prewarm(self, request: bytes) -> None:
        """Everything a request does except calling ``edgefn_handle``: pool slot,
        memory pages and call path become hot, and no user logic runs.

        Raises `FunctionError` if instantiation or ``edgefn_alloc`` fails.
        """
        store = store_new(self.engine, None, None)
        try:
            self._run(store, store_context(store), request, handle=False)
        finally:
            store_delete(store)

    def _run(self, store: int, ctx: int, request: bytes, handle: bool = True,
             started: int = 0) -> bytes:
        store_limiter(store, self.memory_limit, -1, -1, -1, -1)
        set_epoch_deadline(ctx, self.deadline_ticks)
        trap, u32 = self.trap_ref, self.u32
        error = instantiate_pre(self.pre, ctx, self.inst_ref, trap)
        if error or self.trap.value:
            self._fail(ctx, error, "instantiation")
        if started and self.times is not None:
            self.times.record(perf_counter_ns() - started)
        for name, size, out in self.lookups:
            if not export_get(ctx, self.inst_ref, name, size, out):
                raise FunctionError("trap", 500, f"module has no export {name.value!r}")
        memory = self.memory
        n = len(request)
        u32[0] = n
        error = call_unchecked(ctx, self.alloc, self.vals, 2, trap)
        if error or self.trap.value:
            self._fail(ctx, error, "edgefn_alloc", memory, n)
        ptr = u32[0]
        if ptr + n > memory_data_size(ctx, memory):
            raise FunctionError("bad_response", 502,
                                f"edgefn_alloc({n}) returned {ptr}, outside guest memory")
        ctypes.memmove(memory_data(ctx, memory) + ptr, request, n)
        if not handle:
            return b""
        u32[0] = ptr
        u32[4] = n
        error = call_unchecked(ctx, self.handle, self.vals, 2, trap)
        if error or self.trap.value:
            self._fail(ctx, error, "edgefn_handle", memory)
        result = self.u64[0]
        rptr, rlen = result >> 32, result & 0xFFFFFFFF
        if rlen > self.max_response:
            raise FunctionError("bad_response", 502, f"response of {rlen} bytes exceeds the "
                                f"limit of {self.max_response} bytes")
        if rptr + rlen > memory_data_size(ctx, memory):
            raise FunctionError("bad_response", 502,
                                f"edgefn_handle returned ({rptr}, {rlen}), outside guest memory")
        return ctypes.string_at(memory_data(ctx, memory) + rptr, rlen)

    def _fail(self, ctx: int, error: int | None, what: str, memory: object = None,
              asked: int = 0) -> None:
        """Raise the `FunctionError` for a failed call (a trap or a wasmtime error)."""
        trap, self.trap.value = self.trap.value, None
        size = memory_data_size(ctx, memory) if memory is not None else 0
        raise call_error(trap, error, what, self.outcome, size, asked)


def call_error(trap_ptr: int | None, error_ptr: int | None, what: str, outcome: Outcome,
               memory_size: int, asked: int = 0) -> FunctionError:
    """The `FunctionError` for a failed wasmtime call; takes ownership of the
    `wasm_trap_t*` / `wasmtime_error_t*` it is given. `asked`: the bytes the host
    asked ``edgefn_alloc`` for (the request), when that call failed."""
    if trap_ptr:
        trap = wasmtime.Trap._from_ptr(ctypes.cast(trap_ptr, POINTER(ffi.wasm_trap_t)))
        return trap_error(trap, what, outcome, memory_size, asked)
    if error_ptr:
        ptr = ctypes.cast(error_ptr, POINTER(ffi.wasmtime_error_t))
        err = wasmtime.WasmtimeError._from_ptr(ptr)
        return binding_error(str(err), what) or FunctionError("trap", 500, f"{what} failed: {err}")
    raise AssertionError("call_error without a trap or an error")


def trap_error(trap: wasmtime.Trap, what: str, outcome: Outcome, memory_size: int,
               asked: int = 0) -> FunctionError:
    """Classify a trap: an epoch interrupt is the time limit; a request that could
    not fit in guest memory under its limit (`asked` bytes) is 413; anything else
    is a guest trap, reported as the memory limit when guest memory is within a
    quarter of it (at the limit ``memory.grow`` returns -1 and guests abort, so
    the trap itself does not say why)."""
    code = trap.trap_code
    binding = binding_error(trap.message, what)
    if binding is not None:
        return binding
    if code == wasmtime.TrapCode.INTERRUPT:
        what_limit = "CPU" if outcome.interrupt_kind == "cpu_limit" else "wall-time"
        status = 503 if outcome.interrupt_kind == "cpu_limit" else 504
        return FunctionError(outcome.interrupt_kind, status,
                             f"exceeded its {what_limit} limit of {outcome.limit_ms} ms")
    if asked and memory_size + asked > outcome.memory_limit:  # the client's to fix
        return FunctionError("request_too_large", 413,
                             f"a request of {asked} bytes does not fit in its memory "
                             f"({memory_size / 2**20:.1f} MiB in use, limits.memory_mb = "
                             f"{outcome.memory_limit >> 20}): edgefn_alloc trapped")
    if memory_size and memory_size >= outcome.memory_limit * 3 // 4:
        return FunctionError("memory_limit", 503,
                             f"trapped near its memory limit ({memory_size / 2**20:.1f} of "
                             f"{outcome.memory_limit >> 20} MiB) in {what}: "
                             f"{_first_line(trap.message)}")
    label = code.name.lower().replace("_", " ") if code is not None else "trap"
    return FunctionError("trap", 500, f"trapped in {what} ({label}): {_first_line(trap.message)}")


def binding_error(message: str, what: str) -> FunctionError | None:
    """A trap a host function raised (see `wasm_host.TRAP_PREFIX`), with its reason;
    or the wall-time limit a host call was made past (`wasm_host.WALL_PREFIX`). A
    binding's reason may quote the guest (a namespace named "edgefn wall: x"), so it
    is looked for first."""
    marker = "edgefn binding: "
    if marker not in message:
        if "edgefn wall: " in message:
            return FunctionError("wall_limit", 504, "exceeded its wall-time limit "
                                 "(limits.wall_ms) making host calls")
        return None
    reason = message.split(marker, 1)[1].strip().splitlines()[0]
    return FunctionError("binding", 500, f"failed in a host call from {what}: {reason}")


def _first_line(message: str) -> str:
    """What a wasmtime trap message says on one line: its cause ("wasm `unreachable`
    instruction executed") and the innermost frame, not the first line alone, which
    is "error while executing at wasm backtrace:" with nothing after it."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    causes = [line.removeprefix("wasm trap: ") for line in lines if line.startswith("wasm trap:")]
    frames = [line.split(" - ", 1)[1] for line in lines
              if line[:1].isdigit() and " - " in line]
    if not causes and not lines[0].endswith("backtrace:"):
        return lines[0]
    cause = causes[-1] if causes else "trap"
    return f"{cause} (at {frames[0]})" if frames else cause
