"""Host functions WASM guests import from the ``edgefn`` module: KV and vector
bindings, checked by the function's `Bindings` like Python's host calls.

    kv_get(ns, ns_len, key, key_len) -> i64         value at (r >> 32, r & 0xffffffff),
                                                    or -1 if absent
    kv_put(ns, ns_len, key, key_len, val, val_len) -> i64   the key's new version
    kv_delete(ns, ns_len, key, key_len) -> i32      1 if it existed
    kv_increment(ns, ns_len, key, key_len, delta: i64) -> i64   the new value
    call(name, name_len, args, args_len) -> i64     any binding ("vectors.query", ...)
                                                    with JSON args; JSON result as kv_get

Returned bytes are copied into memory the guest allocates with its own
``edgefn_alloc``. A denied or failed call traps with the reason.
"""

from __future__ import annotations

import base64
import ctypes
import json
from collections.abc import Callable
from typing import Any

import wasmtime

from ..bindings import Bindings

I32, I64 = wasmtime.ValType.i32(), wasmtime.ValType.i64()
SIGNATURES = {
    "kv_get": ([I32] * 4, [I64]),
    "kv_put": ([I32] * 6, [I64]),
    "kv_delete": ([I32] * 4, [I32]),
    "kv_increment": ([I32] * 4 + [I64], [I64]),
    "call": ([I32] * 4, [I64]),
}


class HostCallError(Exception):
    """Raised inside a host function; becomes the guest's trap message."""


def _read(caller: wasmtime.Caller, ptr: int, length: int) -> bytes:
    memory = caller["memory"]
    assert isinstance(memory, wasmtime.Memory)
    if ptr < 0 or length < 0 or ptr + length > memory.data_len(caller):
        raise HostCallError(f"pointer ({ptr}, {length}) is outside guest memory")
    return ctypes.string_at(ctypes.addressof(memory.data_ptr(caller).contents) + ptr, length)


def _give(caller: wasmtime.Caller, data: bytes) -> int:
    """Copy `data` into guest memory allocated by the guest; returns (ptr << 32) | len."""
    alloc = caller["edgefn_alloc"]
    assert isinstance(alloc, wasmtime.Func)
    ptr = alloc(caller, len(data))
    memory = caller["memory"]
    assert isinstance(memory, wasmtime.Memory)
    if ptr < 0 or ptr + len(data) > memory.data_len(caller):
        raise HostCallError(f"edgefn_alloc({len(data)}) returned {ptr}, outside guest memory")
    ctypes.memmove(ctypes.addressof(memory.data_ptr(caller).contents) + ptr, data, len(data))
    return (ptr << 32) | len(data)


def define(linker: wasmtime.Linker, names: set[str], bindings: Bindings) -> None:
    """Define the host functions in `names` (as imported) on `linker`.

    Raises `HostCallError` for an import that edgefn does not provide.
    """
    impls = _impls(bindings)
    for name in names:
        if name not in SIGNATURES:
            raise HostCallError(f"`edgefn.{name}` is not a host function edgefn provides "
                                f"(known: {', '.join(sorted(SIGNATURES))})")
        params, results = SIGNATURES[name]
        linker.define_func("edgefn", name, wasmtime.FuncType(params, results), impls[name],
                           access_caller=True)


def _impls(b: Bindings) -> dict[str, Callable[..., Any]]:
    def text(c: wasmtime.Caller, p: int, n: int) -> str:
        return _read(c, p, n).decode("utf-8", "replace")

    def kv_get(c: wasmtime.Caller, nsp: int, nsl: int, kp: int, kl: int) -> int:
        entry = b.call("kv.get", {"namespace": text(c, nsp, nsl), "key": text(c, kp, kl)})
        if entry is None:
            return -1
        return _give(c, base64.b64decode(entry["value"]))

    def kv_put(c: wasmtime.Caller, nsp: int, nsl: int, kp: int, kl: int, vp: int,
               vl: int) -> int:
        value = base64.b64encode(_read(c, vp, vl)).decode()
        result: int = b.call("kv.put", {"namespace": text(c, nsp, nsl), "key": text(c, kp, kl),
                                        "value": value})
        return result

    def kv_delete(c: wasmtime.Caller, nsp: int, nsl: int, kp: int, kl: int) -> int:
        return int(bool(b.call("kv.delete", {"namespace": text(c, nsp, nsl),
                                             "key": text(c, kp, kl)})))

    def kv_increment(c: wasmtime.Caller, nsp: int, nsl: int, kp: int, kl: int,
                     delta: int) -> int:
        result: int = b.call("kv.increment", {"namespace": text(c, nsp, nsl),
                                              "key": text(c, kp, kl), "delta": delta})
        return result

    def call(c: wasmtime.Caller, np_: int, nl: int, ap: int, al: int) -> int:
        try:
            args = json.loads(_read(c, ap, al) or b"{}")
        except ValueError as e:
            raise HostCallError(f"call arguments are not JSON: {e}") from None
        result = b.call(text(c, np_, nl), args)
        return _give(c, json.dumps(result).encode())

    return {"kv_get": kv_get, "kv_put": kv_put, "kv_delete": kv_delete,
            "kv_increment": kv_increment, "call": call}
