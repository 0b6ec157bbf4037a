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
  any other fd gets an event with ``EBADF``;
- more than `MAX_SUBSCRIPTIONS` in one call get ``EINVAL``, and a call of several
  (`Deadlines.busy`) stops an inline run past its slice or a run past its deadline
  (a loop of such calls with zero timeouts never sleeps).
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
# a call's subscriptions (a Python object each, ~0.6 us: 2.7 million in one call held
# the loop 2 s and took 600 MB); a WASI command here has three fds to wait on
MAX_SUBSCRIPTIONS = 4096
EXPIRED = "edgefn: slept past the request's wall-time deadline"
INLINE_SLEEP = "edgefn: a sleep on the event loop's thread (it runs on a worker thread)"
_I32 = wasmtime.ValType.i32()


class Deadlines(threading.local):
    """The wall-time deadline (`time.monotonic()` seconds) of the WASI request on
    this thread, and whether a sleep ran into it. A request run `inline` (on the
    event loop's thread) never sleeps: a sleep stops it (`slept`), to run again on
    a worker thread; so does a host call that does work (`busy`) once the run is past
    its inline slice. `doing`: what the run was doing when one of those stopped it."""

    deadline: float = 0.0
    expired: bool = False
    inline: bool = False
    slept: bool = False
    began: float = 0.0  # when the run began (`time.monotonic()`)
    slice_s: float = 0.0  # how long an inline run may take
    drawn: int = 0  # random bytes the run drew (`wasi_random`)
    doing: str = "sleeping"

    def start(self, deadline: float, inline: bool = False, slice_s: float = 0.005) -> None:
        self.deadline = deadline
        self.expired = self.slept = False
        self.inline = inline
        self.began, self.slice_s, self.drawn, self.doing = time.monotonic(), slice_s, 0, "sleeping"

    def end(self) -> None:
        """No request runs here now: a sleep outside one (a start function run at a
        deploy's prewarm, on this thread) has no time left, as before any request."""
        self.deadline = 0.0
        self.inline = False
        self.drawn = 0

    def busy(self, doing: str) -> None:
        """A host call about to do work that scales with what the guest asked (epoch
        interrupts never reach a host call, nor straight-line code calling one again
        and again). Raises `wasmtime.Trap`: inline and past the slice (`slept`: it
        runs again on a worker thread, and the function moves there), or past the
        deadline (`expired`)."""
        now = time.monotonic()
        if self.inline and now - self.began > self.slice_s:
            self.slept, self.doing = True, doing
            raise wasmtime.Trap(INLINE_SLEEP)
        if not self.inline and now >= self.deadline:
            self.expired, self.doing = True, doing
            raise wasmtime.Trap(EXPIRED)


def define(linker: wasmtime.Linker, deadlines: Deadlines, wake: threading.Event) -> None:
    """Shadow ``wasi_snapshot_preview1.poll_oneoff`` on `linker` (after
    `define_wasi`). `wake`, once set, ends every sleep at once (PoP shutdown)."""
    ty = wasmtime.FuncType([_I32, _I32, _I32, _I32], [_I32])

    def poll_oneoff(caller: wasmtime.Caller, sub_ptr: int, out_ptr: int, n: int,
                    nevents_ptr: int) -> int:
        memory = caller.get("memory")
        if not isinstance(memory, wasmtime.Memory) or n == 0 or n > MAX_SUBSCRIPTIONS:
            return EINVAL
        if n > 1:  # (a sleep, one clock, checks its own deadline)
            deadlines.busy("polling")
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
