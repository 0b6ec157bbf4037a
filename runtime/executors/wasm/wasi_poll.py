"""`poll_oneoff` for WASI commands, bounded by the request's wall-time deadline.

wasmtime's own ``poll_oneoff`` sleeps in native code that no epoch interrupt
reaches: four guests calling ``sleep(60)`` held four worker threads for a
minute after their 504s. This replacement (shadowing wasmtime's on the
function's Linker) sleeps on an Event, never past the deadline of the request
running on the calling thread; a sleep that would outlast it ends at the
deadline with a trap, which the executor reports as ``wall_limit``, and the
thread is free again. Closing the engine wakes every sleeper at once.

What it answers (a WASI command here has only stdin bytes, stdout and stderr):
- clock subscriptions, relative, or absolute on the realtime clock; an absolute
  monotonic one gets ``ENOTSUP`` (wasmtime's monotonic origin is private);
- fd subscriptions on 0, 1, 2 are ready at once (nothing there ever blocks);
  any other fd gets an event with ``EBADF``.
"""

from __future__ import annotations

import ctypes
import struct
import threading
import time

import wasmtime

SUBSCRIPTION = 48  # bytes: userdata u64, tag u8, then the clock or fd_readwrite union
EVENT = 32  # bytes: userdata u64, error u16, type u8, fd_readwrite (nbytes u64, flags u16)
CLOCK, FD_READ, FD_WRITE = 0, 1, 2
REALTIME, MONOTONIC = 0, 1
ABSTIME = 1
ESUCCESS, EBADF, EFAULT, EINVAL, ENOTSUP = 0, 8, 21, 28, 58
EXPIRED = "edgefn: slept past the request's wall-time deadline"
INLINE_SLEEP = "edgefn: a sleep on the event loop's thread (it runs on a worker thread)"
_I32 = wasmtime.ValType.i32()


class Deadlines(threading.local):
    """The wall-time deadline (`time.monotonic()` seconds) of the WASI request on
    this thread, and whether a sleep ran into it. A request run `inline` (on the
    event loop's thread) never sleeps: a sleep stops it (`slept`), to run again on
    a worker thread."""

    deadline: float = 0.0
    expired: bool = False
    inline: bool = False
    slept: bool = False

    def start(self, deadline: float, inline: bool = False) -> None:
        self.deadline = deadline
        self.expired = self.slept = False
        self.inline = inline

    def end(self) -> None:
        """No request runs here now: a sleep outside one (a start function run at a
        deploy's prewarm, on this thread) has no time left, as before any request."""
        self.deadline = 0.0
        self.inline = False


def define(linker: wasmtime.Linker, deadlines: Deadlines, wake: threading.Event) -> None:
    """Shadow ``wasi_snapshot_preview1.poll_oneoff`` on `linker` (after
    `define_wasi`). `wake`, once set, ends every sleep at once (PoP shutdown)."""
    ty = wasmtime.FuncType([_I32, _I32, _I32, _I32], [_I32])

    def poll_oneoff(caller: wasmtime.Caller, sub_ptr: int, out_ptr: int, n: int,
                    nevents_ptr: int) -> int:
        memory = caller.get("memory")
        if not isinstance(memory, wasmtime.Memory) or n == 0:
            return EINVAL
        view = GuestMemory(memory, caller)
        raw = view.read(sub_ptr, n * SUBSCRIPTION)
        if raw is None:
            return EFAULT
        subs = [raw[i * SUBSCRIPTION:(i + 1) * SUBSCRIPTION] for i in range(n)]
        events, error = _answer(subs, deadlines, wake)
        if error:
            return error
        if not view.write(out_ptr, b"".join(events)) or \
                not view.write(nevents_ptr, struct.pack("<I", len(events))):
            return EFAULT
        return ESUCCESS

    linker.allow_shadowing = True
    linker.define_func("wasi_snapshot_preview1", "poll_oneoff", ty, poll_oneoff,
                       access_caller=True)
    linker.allow_shadowing = False


def _answer(subs: list[bytes], deadlines: Deadlines,
            wake: threading.Event) -> tuple[list[bytes], int]:
    """The events for `subs`, sleeping first if only clocks were asked for.
    Raises `wasmtime.Trap` (`EXPIRED`) if the sleep reaches the deadline."""
    ready, clocks = [], []
    for sub in subs:
        userdata, tag = struct.unpack_from("<QB", sub)
        if tag == CLOCK:
            clock_id, timeout, _precision, flags = struct.unpack_from("<I4xQQH", sub, 16)
            if flags & ABSTIME and clock_id != REALTIME:
                return [], ENOTSUP
            wait = timeout - time.time_ns() if flags & ABSTIME else timeout
            clocks.append((max(wait, 0), userdata))
        elif tag in (FD_READ, FD_WRITE):
            fd = struct.unpack_from("<I", sub, 16)[0]
            ready.append(_event(userdata, ESUCCESS if fd <= 2 else EBADF, tag))
        else:
            return [], EINVAL
    if ready:
        return ready, 0
    wait_ns, _ = min(clocks)
    _sleep(wait_ns / 1e9, deadlines, wake)
    return [_event(u, ESUCCESS, CLOCK) for w, u in clocks if w == wait_ns], 0


def _sleep(seconds: float, deadlines: Deadlines, wake: threading.Event) -> None:
    if deadlines.inline and seconds > 0:
        deadlines.slept = True
        raise wasmtime.Trap(INLINE_SLEEP)
    left = deadlines.deadline - time.monotonic()
    if seconds < left:
        wake.wait(seconds)
        if not wake.is_set():
            return
    else:
        wake.wait(max(left, 0))
    deadlines.expired = True
    raise wasmtime.Trap(EXPIRED)


def _event(userdata: int, error: int, kind: int) -> bytes:
    return struct.pack("<QHB5xQH6x", userdata, error, kind, 0, 0)


class GuestMemory:
    """Bounds-checked access to a guest's linear memory from a host call."""

    def __init__(self, memory: wasmtime.Memory, caller: wasmtime.Caller) -> None:
        self.base = ctypes.addressof(memory.data_ptr(caller).contents)
        self.size = memory.data_len(caller)

    def read(self, ptr: int, length: int) -> bytes | None:
        if ptr < 0 or ptr + length > self.size:
            return None
        return ctypes.string_at(self.base + ptr, length)

    def write(self, ptr: int, data: bytes) -> bool:
        if ptr < 0 or ptr + len(data) > self.size:
            return False
        ctypes.memmove(self.base + ptr, data, len(data))
        return True
