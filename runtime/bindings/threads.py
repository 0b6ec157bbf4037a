"""Threads for the bindings' blocking work: a few per owner, so that no owner queues
behind another.

A KV write waits for fsync, a KV list reads past expired keys, a vector query on a
large index takes milliseconds: `Bindings.call` runs them off the PoP's event loop.
They all went to asyncio's default executor, one FIFO queue of a few threads for
every tenant, so one owner's backlog (many concurrent lists, large puts) held
another owner's single put for all of it. Here each owner (`Manifest.tenant`) has
an executor of its own, of `per_owner` threads, made at its first call and shut
down once idle for `idle` seconds. LMDB still lets one writer in at a time across
the process: a write may wait for the write in flight, no longer for another
owner's queue.

The PoP's own work (the expiry sweep, the admin API, deploys) stays on the default
executor.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgefn_core.errors import BindingError

PER_OWNER = 2  # threads per owner (`[stores] binding_threads`)
IDLE_SECONDS = 10.0  # an owner's executor unused this long is shut down


@dataclass
class _Lane:
    """One owner's executor and how much of it is in use."""

    pool: concurrent.futures.ThreadPoolExecutor
    busy: int = 0  # calls queued or running
    last: float = 0.0  # when its last call ended (or it was made)


class OwnerThreads:
    """Per-owner executors for blocking binding calls. Thread-safe."""

    def __init__(self, per_owner: int = PER_OWNER, idle: float = IDLE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Raises `ValueError` if `per_owner` is below 1."""
        if per_owner < 1:
            raise ValueError(f"per_owner must be at least 1, got {per_owner}")
        self.per_owner = per_owner
        self.idle = idle
        self.clock = clock
        self._lanes: dict[str, _Lane] = {}
        self._lock = threading.Lock()
        self._swept = clock()
        self._closed = False

    def run(self, owner: str, work: Callable[[], Any]) -> asyncio.Future[Any]:
        """`work()` on one of `owner`'s threads (in a copy of this context), as a future
        of the running event loop: cancelling it before the work starts drops the work.
        Call on an event loop's thread. Raises `RuntimeError` without a running loop,
        `BindingError` once closed."""
        loop = asyncio.get_running_loop()
        lane = self._take(owner)
        try:
            done = lane.pool.submit(contextvars.copy_context().run, work)
        except RuntimeError:  # shut down between `_take` and here: `close` ran
            self._release(lane)
            raise BindingError("the PoP is shutting down") from None
        # fires once the work has ended or was cancelled before it started, not when
        # the caller stopped waiting: a lane is idle only when its threads are
        done.add_done_callback(lambda _: self._release(lane))
        return asyncio.wrap_future(done, loop=loop)

    def owners(self) -> list[str]:
        """The owners that have an executor now."""
        with self._lock:
            return list(self._lanes)

    def close(self) -> None:
        """Take no more work, drop what has not started and wait for what has (the
        stores close next: no thread may be left inside them). Idempotent."""
        with self._lock:
            self._closed = True
            lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            lane.pool.shutdown(wait=True, cancel_futures=True)

    def _take(self, owner: str) -> _Lane:
        """`owner`'s lane, made if it has none, with one more call counted on it.
        Raises `BindingError` once closed."""
        with self._lock:
            if self._closed:
                raise BindingError("the PoP is shutting down")
            idle = self._sweep()
            lane = self._lanes.get(owner)
            if lane is None:
                pool = concurrent.futures.ThreadPoolExecutor(
                    self.per_owner, thread_name_prefix=f"edgefn-bindings-{owner[:32]}")
                lane = self._lanes[owner] = _Lane(pool, last=self.clock())
            lane.busy += 1
        for pool in idle:  # their threads wake and end; nothing is waited for
            pool.shutdown(wait=False)
        return lane

    def _release(self, lane: _Lane) -> None:
        with self._lock:
            lane.busy -= 1
            lane.last = self.clock()

    def _sweep(self) -> list[concurrent.futures.ThreadPoolExecutor]:
        """Under the lock, at most once per `idle` / 2 seconds: remove the lanes idle
        for `idle` seconds, and return their executors to shut down."""
        now = self.clock()
        if now - self._swept < self.idle / 2:
            return []
        self._swept = now
        stale = [o for o, lane in self._lanes.items()
                 if lane.busy == 0 and now - lane.last >= self.idle]
        return [self._lanes.pop(o).pool for o in stale]
