"""`Stop`: how a request that left (its client went away, or its wall time ran out)
stops the model calls a WASM guest's thread is blocked in.

A WASM guest calls bindings from a worker thread, where a model call is a future on
the PoP's loop that the thread waits on. The executor makes one `Stop` per request
on the loop's side and sets it as the thread's `current` for the call; when the
request ends unanswered, `cancel` cancels the futures waited on (the model stops:
`runtime.bindings.ai` closes the generation) and every later call is refused. (A
Python function's calls are stopped with its job: `runtime.executors.python.job`.)
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

CANCELLED = "cancelled: the request's client went away (or its wall time ran out)"


class Stop:
    def __init__(self) -> None:
        self.cancelled = False
        self.waiting: set[concurrent.futures.Future[Any]] = set()
        self.lock = threading.Lock()

    def cancel(self) -> None:
        """Any thread: cancel what the guest waits on, and what it asks for next."""
        with self.lock:
            self.cancelled = True
            waiting, self.waiting = self.waiting, set()
        for future in waiting:
            future.cancel()

    def hold(self, future: concurrent.futures.Future[Any]) -> bool:
        """Track `future` until `release`; False (and it is cancelled) once cancelled."""
        with self.lock:
            if not self.cancelled:
                self.waiting.add(future)
                return True
        future.cancel()
        return False

    def release(self, future: concurrent.futures.Future[Any]) -> None:
        with self.lock:
            self.waiting.discard(future)


current: ContextVar[Stop | None] = ContextVar("edgefn_guest_stop", default=None)


@contextmanager
def stopping(stop: Stop | None) -> Iterator[None]:
    """`stop` as this thread's `current` within the block (a worker thread's context
    outlives one job: it is reset after)."""
    token = current.set(stop)
    try:
        yield
    finally:
        current.reset(token)
