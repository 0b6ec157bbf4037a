"""What limits a Python isolate's threads, from inside its interpreter: the
watchdog that stops a handler at its CPU or wall-time limit, and the stopping of
threads a function left running after its request.

Both raise an exception asynchronously in another thread of the same interpreter
(`PyThreadState_SetAsyncExc`): it lands between two bytecodes, so code blocked in
a C call takes it only when that call returns. Stdlib only: it runs inside isolates.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from edgefn_core.errors import CpuInterrupt, IsolateInterrupt, ThreadStop, WallInterrupt

_SET_ASYNC_EXC = ctypes.pythonapi.PyThreadState_SetAsyncExc
_SET_ASYNC_EXC.argtypes = [ctypes.c_ulong, ctypes.py_object]
# The same C function with a NULL exception: clears a pending one.
_CLEAR_ASYNC_EXC = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))

# How long the threads a request left running get to end once told to stop; and how
# often they are told again meanwhile (an async exception lands between bytecodes, so
# a thread blocked in C code, a sleep say, takes it only when that call returns).
THREAD_GRACE = 0.2
THREAD_NUDGE = 0.01


class Stoppable(Protocol):
    """A thread as `stop_threads` takes it (a `threading.Thread`, or one known by
    its handle only)."""

    @property
    def ident(self) -> int | None: ...

    def is_alive(self) -> bool: ...

    def join(self, timeout: float | None = None) -> None: ...


def stop_threads[T: Stoppable](threads: list[T], grace: float) -> list[T]:
    """Raise `ThreadStop` in each of `threads` until it ends or `grace` seconds
    pass; those still running then."""
    end = time.monotonic() + grace
    while True:
        threads = [t for t in threads if t.is_alive()]
        if not threads or time.monotonic() >= end:
            return threads
        for t in threads:
            if t.ident is not None:
                _SET_ASYNC_EXC(t.ident, ThreadStop)
        threads[0].join(THREAD_NUDGE)


def quiet_thread_stop(args: Any) -> None:
    """`threading.excepthook`: a thread ended by `ThreadStop` is no error to report."""
    if args.exc_type is not None and issubclass(args.exc_type, ThreadStop):
        return
    threading.__excepthook__(args)


# A handler that swallowed its interrupt (``except BaseException``) is interrupted
# again this long after; not at every tick, since a second interrupt landing in the
# request loop's own cleanup, before it disarms, would escape that loop.
RERAISE_AFTER = 1.0


def tick_of(cpu_ms: int, wall_ms: int) -> float:
    """How often a watchdog checks a request: a quarter of the tighter limit, 5..100 ms."""
    return min(max(min(cpu_ms, wall_ms) / 4000, 0.005), 0.1)


# An idle watchdog parks after this long without a request, until the next one arms it.
PARK_AFTER = 1.0
# How old a reading of the thread's CPU clock `arm` may reuse (its own, from an earlier
# `arm`) rather than read the clock again: a syscall, ~0.6 us of each request's ~12 in
# an isolate, where requests packed behind one another come every few microseconds.
REREAD_AFTER = 0.001


class Watchdog:
    """Enforces the limits of the request in flight by raising an IsolateInterrupt in
    the handler's thread (once; again every `RERAISE_AFTER` while it keeps running).

    It wakes every tick (a quarter of the tighter limit, 5..100 ms) rather than
    per request: arming is two assignments, so a fast request costs no thread
    switch. A limit is therefore enforced within one tick. After `park_after`
    seconds with nothing armed it parks (an idle isolate's watchdog ticked 80
    times a second: ~5 ms of its host's CPU a second, each); the next `arm`
    wakes it, and its first look at that request is a tick later, as always.
    """

    # set by its own thread (`_park`) before it waits; `arm` and `stop` wake it then
    parked = False
    park_after = PARK_AFTER
    # the handler's thread's last reading of its CPU clock (`arm`), and when (monotonic)
    cpu_read = 0.0
    read_at = float("-inf")

    def __init__(self, tid: int, cpu_ms: int, wall_ms: int) -> None:
        self.tid = tid
        self.clock = time.pthread_getcpuclockid(tid)
        self.cpu = cpu_ms / 1000
        self.wall = wall_ms / 1000
        self.tick = tick_of(cpu_ms, wall_ms)
        self.lock = threading.Lock()
        self.current: tuple[float, float] | None = None  # (wall start, cpu start)
        self.raised_at = 0.0  # when it last interrupted the request in flight (0: not yet)
        # what it raised for the request in flight, and what wakes that request's event
        # loop (set by the guest while it awaits): an await sits in select(), where a
        # raised interrupt cannot land until something else wakes the loop
        self.tripped: type[IsolateInterrupt] | None = None
        self.waker: Callable[[], None] | None = None
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="edgefn-watchdog")
        self.thread.start()

    def arm(self) -> None:
        """A request starts on the handler's thread (call it there). Its CPU is
        counted from the thread's clock now, or, when `arm` read that clock less
        than `REREAD_AFTER` ago, from that reading plus the wall time since: the
        thread cannot have spent more CPU than that meanwhile, so the count is never
        more than the request's own (a limit never lands early) and at most that
        wall time less (it lands that much later at most, within a tick anyway)."""
        self.raised_at = 0.0
        self.tripped = None
        now = time.monotonic()
        since = now - self.read_at
        if since >= REREAD_AFTER:
            self.cpu_read, self.read_at = time.clock_gettime(self.clock), now
            since = 0.0
        self.current = (now, self.cpu_read + since)
        if self.parked:  # after `current` is set: `_park` looks at it after `parked`
            self.wake.set()

    def exceeded(self, code: str) -> str:
        """What the request did, naming the limit, as the PoP words it for WASM."""
        if code == "cpu_limit":
            return f"exceeded its CPU limit of {round(self.cpu * 1000)} ms"
        return f"exceeded its wall-time limit of {round(self.wall * 1000)} ms"

    def disarm(self) -> None:
        with self.lock:  # after this, nothing can be raised for the request that ended
            self.current = None
            if self.tripped is not None:  # set with every raise, under this lock: a
                # request that raised nothing pays no ctypes call (~1.3 us)
                _CLEAR_ASYNC_EXC(self.tid, None)  # drop one raised too late to land

    def stop(self) -> None:
        """IsolateStop and join (within a tick): the interpreter cannot close with it running."""
        self.stopped = True
        if self.parked:
            self.wake.set()
        self.thread.join()

    def _run(self) -> None:
        idle = 0.0
        while not self.stopped:
            time.sleep(self.tick)
            current = self.current
            if current is None:
                idle += self.tick
                if idle >= self.park_after:
                    self._park()
                    idle = 0.0
                continue
            idle = 0.0
            with self.lock:
                now = time.monotonic()
                if self.current is not current or (self.raised_at
                                                   and now - self.raised_at < RERAISE_AFTER):
                    continue
                if time.clock_gettime(self.clock) - current[1] >= self.cpu:
                    kind: type[IsolateInterrupt] = CpuInterrupt
                elif now - current[0] >= self.wall:
                    kind = WallInterrupt
                else:
                    continue
                _SET_ASYNC_EXC(self.tid, kind)
                self.tripped, self.raised_at = kind, now
                waker = self.waker
            if waker is not None:
                waker()

    def _park(self) -> None:
        """Wait until a request is armed or the watchdog stops. `parked` is set before
        `current` and `stopped` are read, and `arm` and `stop` set those before they
        read `parked`: either this sees their change or they see it parked and wake it."""
        self.wake = threading.Event()
        self.parked = True
        if self.current is None and not self.stopped:
            self.wake.wait()
        self.parked = False
