"""`random_get` for WASI commands, bounded by the request's time.

wasmtime's own fills any length the guest asks for in one host call that no epoch
interrupt reaches (64 MiB: ~200 ms), and straight-line code may call it again and
again: 100 such calls held the event loop 21-25 s a request, past every limit. This
one (shadowing wasmtime's on the function's Linker) hands out the first
`FREE_BYTES` of a run at once (a seed: what libc and Rust ask for), then fills in
`CHUNK`s, asking `Deadlines.busy` before each: an inline run past its slice runs
again on a worker thread (and the function moves there, as for a sleep), a run
past its wall-time deadline ends with ``wall_limit``; outside a request (a start
function at a deploy's prewarm) nothing past the free bytes is drawn.
"""

from __future__ import annotations

import os
import threading

import wasmtime

from runtime.executors.wasm.wasi_poll import EFAULT, EINVAL, ESUCCESS, Deadlines, GuestMemory

FREE_BYTES = 4096  # a run's random bytes drawn without a look at the clock
CHUNK = 64 << 10  # ~20-40 us of os.urandom
_I32 = wasmtime.ValType.i32()


def define(linker: wasmtime.Linker, deadlines: Deadlines, wake: threading.Event) -> None:
    """Shadow ``wasi_snapshot_preview1.random_get`` on `linker` (after `define_wasi`).
    `wake`, once set (PoP shutdown), ends a long fill at its next chunk."""
    ty = wasmtime.FuncType([_I32, _I32], [_I32])

    def random_get(caller: wasmtime.Caller, buf: int, length: int) -> int:
        memory = caller.get("memory")
        if not isinstance(memory, wasmtime.Memory):
            return EINVAL
        view = GuestMemory(memory, caller)
        if buf < 0 or length < 0 or buf + length > view.size:
            return EFAULT
        done = 0
        while done < length:
            if deadlines.drawn >= FREE_BYTES:
                if wake.is_set():
                    raise wasmtime.Trap("edgefn: the PoP is stopping")
                deadlines.busy("drawing random bytes")
            n = min(length - done, CHUNK if deadlines.drawn >= FREE_BYTES
                    else FREE_BYTES - deadlines.drawn)
            view.write(buf + done, os.urandom(n))
            done += n
            deadlines.drawn += n
        return ESUCCESS

    linker.allow_shadowing = True
    linker.define_func("wasi_snapshot_preview1", "random_get", ty, random_get,
                       access_caller=True)
    linker.allow_shadowing = False
