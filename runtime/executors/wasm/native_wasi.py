"""The native path of WASI commands (native_src/wasi.c): one C call per request
(`NativeWasi.run`), and the request's stdio as C host functions on the function's
Linker (`NativeWasi.define`), answering as `wasi_stdio`'s Python ones do.

Built on first use like the reactor's fast path (`native`), cached beside it. Off
with ``EDGEFN_NATIVE=0`` (all native code) or ``EDGEFN_NATIVE_WASI=0`` (this one;
read at each deploy): then `wasi_stdio` serves the streams and wasmtime-py runs
`_start`, same answers, slower.
"""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
from ctypes import POINTER, c_char_p, c_int32, c_int64, c_size_t, c_uint64, c_void_p
from functools import cache
from pathlib import Path
from typing import Any

import wasmtime
from wasmtime import _ffi as ffi

from runtime.executors.wasm import wasi_stdio
from runtime.executors.wasm.ffi import RAW_CALLBACK, define_unchecked
from runtime.executors.wasm.native import build_library

log = logging.getLogger("edgefn.wasm")
SOURCE = Path(__file__).with_name("native_src") / "wasi.c"
RUN_OK, RUN_CONFIG, RUN_INSTANTIATE, RUN_NO_START, RUN_START = range(5)

ERROR, TRAP = POINTER(ffi.wasmtime_error_t), POINTER(ffi.wasm_trap_t)


class Result(ctypes.Structure):
    _fields_ = [("stage", c_int32), ("overflow", c_int32), ("trap", c_void_p),
                ("error", c_void_p), ("memory_size", c_uint64), ("out", c_void_p),
                ("out_len", c_uint64), ("err", c_void_p), ("err_len", c_uint64),
                ("err_dropped", c_uint64)]


class NativeWasi:
    def __init__(self, path: Path) -> None:
        """Raises OSError if the library does not load, RuntimeError if its result's
        layout disagrees with `Result`."""
        lib = ctypes.CDLL(str(path))
        if lib.edgefn_wasi_result_size() != ctypes.sizeof(Result):
            raise RuntimeError("native WASI result layout does not match")
        self._run = lib.edgefn_wasi_run
        self._run.restype = c_int32
        self._run.argtypes = [c_void_p, c_void_p, c_int64, c_uint64, c_char_p, c_size_t,
                              c_size_t, c_size_t, c_char_p, c_size_t, c_uint64, POINTER(Result)]
        self.begin = lib.edgefn_wasi_begin
        self.begin.restype = None
        self.begin.argtypes = [c_char_p, c_size_t, c_uint64]
        self.end = lib.edgefn_wasi_end
        self.end.restype = None
        self.end.argtypes = [POINTER(Result)]
        self.callbacks = {name: RAW_CALLBACK(_address(getattr(lib, f"edgefn_{name}")))
                          for name in wasi_stdio.SIGNATURES}
        self.lib = lib

    def define(self, linker: wasmtime.Linker) -> None:
        """Shadow wasmtime's stdio calls on `linker` (after `define_wasi`) with the C
        ones. Raises RuntimeError if wasmtime refuses one."""
        linker.allow_shadowing = True
        try:
            for name, params in wasi_stdio.SIGNATURES.items():
                ty = wasmtime.FuncType(params, [wasmtime.ValType.i32()])
                err = define_unchecked(ctypes.cast(linker.ptr(), c_void_p).value,
                              wasi_stdio.MODULE.encode(), len(wasi_stdio.MODULE),
                              name.encode(), len(name),
                              ctypes.cast(ty.ptr(), c_void_p).value, self.callbacks[name],
                              None, None)
                if err:
                    why = wasmtime.WasmtimeError._from_ptr(ctypes.cast(err, ERROR))
                    raise RuntimeError(f"cannot define {wasi_stdio.MODULE}.{name}: {why}")
        finally:
            linker.allow_shadowing = False

    def run(self, engine: int, pre: int, memory_limit: int, ticks: int, argv: list[str],
            env: list[tuple[str, str]], stdin: bytes, limit: int) -> tuple[int, Result]:
        """One request: its stage (`RUN_OK`...) and result (its trap and error owned by
        the caller; its stdout and stderr valid until the next run on this thread).
        Raises UnicodeEncodeError for a string UTF-8 cannot hold (a lone surrogate)."""
        strings = _strings(argv, env)
        result = Result()
        stage = self._run(engine, pre, memory_limit, ticks, strings, len(strings), len(argv),
                          len(env), stdin, len(stdin), limit, ctypes.byref(result))
        return stage, result


def _address(func: Any) -> int:
    address = ctypes.cast(func, c_void_p).value
    assert address is not None
    return address


def _strings(argv: list[str], env: list[tuple[str, str]]) -> bytes:
    """`argv`, then `env`'s names and values in turn, each ended by a NUL, as UTF-8
    (`edgefn_wasi_run` splits them): one join and one encode a request (a C array per
    list, of strings encoded one by one, was a tenth of a hello's time). A string with
    a NUL in it is cut there, as C reads it."""
    text = "\0".join(argv) + "\0"
    if env:
        text += "\0".join(map("\0".join, env)) + "\0"
    if text.count("\0") != len(argv) + 2 * len(env):
        cut = [s.partition("\0")[0] for s in (*argv, *(s for pair in env for s in pair))]
        text = "\0".join(cut) + "\0"
    return text.encode()


@cache
def load() -> NativeWasi | None:
    """The library, built if needed; None (logged) when it cannot be had."""
    if os.environ.get("EDGEFN_NATIVE", "1") == "0":
        return None
    try:
        return NativeWasi(build_library(SOURCE, "wasi"))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        log.warning("native WASI path unavailable (%s); using the Python one", e)
        return None


def enabled() -> NativeWasi | None:
    """The library when the native WASI path is on for a deploy now."""
    if os.environ.get("EDGEFN_NATIVE_WASI", "1") == "0":
        return None
    return load()
