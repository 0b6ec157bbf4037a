"""The native fast path (native/reactor.c): one C call per reactor request and an
epoch ticker thread that never takes the GIL.

The C file is compiled on first use with the system C compiler ($CC or cc)
against wasmtime-py's own libwasmtime, and cached under
``$EDGEFN_NATIVE_CACHE`` (default ``~/.cache/edgefn/native``) keyed by the
source, the wasmtime version, the library path and the Python build. Without a
compiler, or with ``EDGEFN_NATIVE=0``, `load()` returns None and the pure-ctypes
path in `wasm_ffi` is used: same behaviour, slower.

Where Python's headers are installed the same file is also built as a CPython
extension (``_edgefn_reactor``): its ``serve`` takes the request's fields, writes
the encoded request straight into guest memory and returns the decoded response
(`NativeReactorCall.serve`), so a request makes no ctypes call and neither the
request nor the response exists as one bytes object. Without the headers the
ctypes entry point is used, with the encoding and decoding in `edgefn_core.abi`.
"""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import sys
import weakref
from ctypes import c_char_p, c_int32, c_int64, c_long, c_size_t, c_uint64, c_void_p
from functools import cache, partial
from pathlib import Path
from typing import Any

import wasmtime
from wasmtime import _ffi as ffi

from edgefn_core.abi import Pairs, decode_response
from edgefn_core.errors import FunctionError
from edgefn_core.fastcodec import compile_cached, import_extension, python_headers
from runtime.executors.wasm.ffi import CallTarget, Outcome, call_error
from runtime.executors.wasm.timing import InstantiateTimes

log = logging.getLogger("edgefn.wasm")
SOURCE = Path(__file__).with_name("native_src") / "reactor.c"

(OK, INSTANTIATE, NO_EXPORT, ALLOC, ALLOC_OOB, HANDLE, TOO_LARGE, RESPONSE_OOB, NO_MEMORY,
 BAD_FRAME) = range(10)
EXTENSION = "_edgefn_reactor"  # the module name the C file's PyInit_ is for
EXPORTS = ("memory", "edgefn_alloc", "edgefn_handle")
TRIM_BYTES = 1 << 20  # reactor.c's: what a thread's response buffer keeps between calls


class Result(ctypes.Structure):
    _fields_ = [("stage", c_int32), ("export_index", c_int32), ("trap", c_void_p),
                ("error", c_void_p), ("a", c_uint64), ("b", c_uint64), ("memory_size", c_uint64),
                ("response", c_void_p), ("response_len", c_uint64)]


class NativeLib:
    def __init__(self, path: Path) -> None:
        """Raises OSError if the library does not load, RuntimeError if its layouts
        disagree with wasmtime-py's."""
        lib = ctypes.CDLL(str(path))
        if lib.edgefn_extern_size() != ctypes.sizeof(ffi.wasmtime_extern_t) or \
                lib.edgefn_result_size() != ctypes.sizeof(Result) or \
                lib.edgefn_hist_size() != ctypes.sizeof(InstantiateTimes):
            raise RuntimeError("native layouts do not match wasmtime-py's")
        self.call = lib.edgefn_reactor_call
        self.call.restype = c_int32
        self.call.argtypes = [c_void_p, c_void_p, c_int64, c_uint64, c_char_p, c_size_t,
                              c_uint64, c_int32, ctypes.POINTER(Result), c_void_p]
        self.ticker_start = lib.edgefn_ticker_start
        self.ticker_start.restype = c_void_p
        self.ticker_start.argtypes = [c_void_p, c_long, c_int64]
        self.ticker_stop = lib.edgefn_ticker_stop
        self.ticker_stop.argtypes = [c_void_p]
        self.ticker_ticks = lib.edgefn_ticker_ticks
        self.ticker_parks = lib.edgefn_ticker_parks
        for counter in (self.ticker_ticks, self.ticker_parks):
            counter.restype = c_uint64
            counter.argtypes = [c_void_p]
        self.guest_begin = lib.edgefn_guest_begin
        self.guest_end = lib.edgefn_guest_end
        for f in (self.guest_begin, self.guest_end):
            f.restype = None
            f.argtypes = []
        self.trim = lib.edgefn_trim  # this thread's response buffer, down to TRIM_BYTES
        self.trim.restype = None
        self.trim.argtypes = []
        self.epoch_advance = lib.edgefn_epoch_advance
        self.epoch_advance.argtypes = [c_void_p, c_uint64]
        self.lib = lib
        self.serve: Any = import_extension(EXTENSION, path).serve if python_headers() else None


@cache
def load() -> NativeLib | None:
    """The native library, built if needed; None (logged) when it cannot be had."""
    if os.environ.get("EDGEFN_NATIVE", "1") == "0":
        return None
    try:
        return NativeLib(_build())
    except (OSError, RuntimeError, ImportError, subprocess.SubprocessError) as e:
        log.warning("native fast path unavailable (%s); using the ctypes path", e)
        return None


def _build() -> Path:
    headers = python_headers()
    flags = [] if headers is None else ["-DEDGEFN_PYEXT", f"-I{headers}"]  # an extension too
    return build_library(SOURCE, "reactor", wasmtime.__file__ + sys.version + str(headers),
                         flags)


def build_library(source: Path, stem: str, key: str = "", flags: list[str] | None = None
                  ) -> Path:
    """`source` compiled against wasmtime-py's libwasmtime into the native cache
    (`edgefn_core.fastcodec.compile_cached`), keyed by the source, the header it
    includes (native_src/wasmtime_c.h), the library, wasmtime's version and `key`;
    built once. Raises RuntimeError without a C
    compiler or if the build fails."""
    libdir = Path(ffi.filename).parent
    header = source.with_name("wasmtime_c.h")  # what the C files include: part of the key
    key += header.read_text() if header.exists() else ""
    return compile_cached(source, stem, (str(ffi.filename) + _wasmtime_version() + key).encode(),
                          [f"-L{libdir}", f"-l:{ffi.filename.name}", f"-Wl,-rpath,{libdir}",
                           "-lpthread", *(flags or [])])


def _wasmtime_version() -> str:
    from runtime.executors.wasm.engine import WASMTIME_VERSION

    return WASMTIME_VERSION


class NativeReactorCall(CallTarget):
    """Same contract as `wasm_ffi.ReactorCall`, one C call per request."""

    def __init__(self, lib: NativeLib, engine: wasmtime.Engine, pre: wasmtime.InstancePre,
                 memory_limit: int, deadline_ticks: int, outcome: Outcome,
                 max_response: int, times: InstantiateTimes | None = None) -> None:
        super().__init__(engine, pre, memory_limit, deadline_ticks, outcome, max_response,
                         times)
        self.lib = lib
        self.result = Result()
        self.result_ref = ctypes.byref(self.result)
        self.times_ref = ctypes.byref(times) if times is not None else None
        # the extension's serve with this function's pointers and limits bound
        self.fast = None if lib.serve is None else partial(
            lib.serve, self.engine, self.pre, memory_limit, deadline_ticks, max_response,
            ctypes.addressof(self.result), ctypes.addressof(times) if times is not None else None)

    def __call__(self, request: bytes) -> bytes:
        """Raises `FunctionError` for a trap, a limit or an out-of-bounds response."""
        r = self.result
        if self.lib.call(self.engine, self.pre, self.memory_limit, self.deadline_ticks, request,
                         len(request), self.max_response, 1, self.result_ref, self.times_ref):
            raise self._error(r, len(request))
        out = ctypes.string_at(r.response, r.response_len)
        if r.response_len > TRIM_BYTES:  # copied: the thread's buffer need not stay that big
            self.lib.trim()
        return out

    def serve(self, method: bytes, path: bytes, query: bytes, headers: Pairs, env_blob: bytes,
              body: bytes, params_blob: bytes, principal_blob: bytes
              ) -> tuple[int, Pairs, bytes]:
        """`CallTarget.serve` in one C call where the extension was built. Raises
        `FunctionError` as `__call__` does, and for a malformed response as
        `decode_response` does; TypeError for a field that is not bytes."""
        fast = self.fast
        if fast is None:
            return super().serve(method, path, query, headers, env_blob, body, params_blob,
                                 principal_blob)
        out = fast(method, path, query, headers, env_blob, body, params_blob, principal_blob)
        if type(out) is tuple:
            return out
        r = self.result
        if out == BAD_FRAME:  # the decoder's own words for what is wrong with it
            raw = ctypes.string_at(r.response, r.response_len)
            if r.response_len > TRIM_BYTES:
                self.lib.trim()
            return decode_response(raw)
        raise self._error(r, r.b)

    def prewarm(self, request: bytes) -> None:
        """Everything but ``edgefn_handle``. Raises `FunctionError`."""
        if self.lib.call(self.engine, self.pre, self.memory_limit, self.deadline_ticks, request,
                         len(request), self.max_response, 0, self.result_ref, None):
            raise self._error(self.result, len(request))

    def _error(self, r: Result, n: int) -> FunctionError:
        stage = r.stage
        if stage in (INSTANTIATE, ALLOC, HANDLE):
            what = {INSTANTIATE: "instantiation", ALLOC: "edgefn_alloc"}.get(stage, "edgefn_handle")
            return call_error(r.trap, r.error, what, self.outcome, r.memory_size,
                              r.b if stage == ALLOC else 0)
        if stage == NO_EXPORT:
            return FunctionError("trap", 500, f"module has no export {EXPORTS[r.export_index]!r}")
        if stage == ALLOC_OOB:
            return FunctionError("bad_response", 502,
                                 f"edgefn_alloc({n}) returned {r.a}, outside guest memory")
        if stage == TOO_LARGE:
            return FunctionError("bad_response", 502, f"response of {r.b} bytes exceeds the "
                                 f"limit of {self.max_response} bytes")
        if stage == RESPONSE_OOB:
            return FunctionError("bad_response", 502,
                                 f"edgefn_handle returned ({r.a}, {r.b}), outside guest memory")
        return FunctionError("crash", 502, f"native call failed at stage {stage}")


def guest_begin() -> None:
    """A guest is about to run, from Python (its epoch deadline set): wakes a parked
    native ticker and keeps it ticking until `guest_end` (the C entries do both
    themselves). Call `guest_end` exactly once after, whatever happens: a missing end
    keeps the tickers awake for good, an extra one could let them park under a
    running guest. Without the native library the ticker is Python's, which never
    parks: nothing to do."""
    lib = load()
    if lib is not None:
        lib.guest_begin()


def guest_end() -> None:
    """The guest `guest_begin` announced has stopped running."""
    lib = load()
    if lib is not None:
        lib.guest_end()


class NativeTicker:
    """Increments the engine's epoch every `interval` seconds from a C thread, and
    parks once no guest has run for `idle` seconds (never when 0)."""

    def __init__(self, lib: NativeLib, engine: wasmtime.Engine, interval: float,
                 idle: float) -> None:
        self.lib = lib
        self._engine = engine
        handle: Any = lib.ticker_start(ctypes.cast(engine.ptr(), c_void_p).value,
                                       int(interval * 1e9), int(idle * 1e9))
        if not handle:
            raise OSError("cannot start the epoch ticker thread")
        self._handle = handle
        # Stops the C thread even if close() is never called: at exit it must not
        # tick an engine that interpreter teardown is freeing.
        self._stop = weakref.finalize(self, lib.ticker_stop, handle)

    def stop(self) -> None:
        self._stop()

    def ticks(self) -> int:
        """Epochs it has added so far. Raises RuntimeError once stopped."""
        return int(self.lib.ticker_ticks(self._running()))

    def parks(self) -> int:
        """Times it has parked so far. Raises RuntimeError once stopped."""
        return int(self.lib.ticker_parks(self._running()))

    def _running(self) -> int:
        if not self._stop.alive:  # its handle is freed
            raise RuntimeError("the ticker has stopped")
        return int(self._handle)
