"""`Changes`: the lock the registry's changes (deploys, rollbacks, stages, follows)
take, and what a PoP shutting down must stop of them first.

A change in flight when the PoP stops (SIGINT during a deploy whose import never
ends) would otherwise hold the exit for the isolate start timeout (30 s) on the
thread that loads it, then undo itself after the stores closed (`StoreClosed`).
`abort` stops the executors still starting, then cancels the changes and waits
for each to undo what it wrote, while the stores are still open.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from edgefn_core.errors import DeployError
from runtime.executors.base import Executor


class Changes:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.tasks: set[asyncio.Task[Any]] = set()  # inside, or waiting to enter
        self.starting: set[Executor] = set()  # being pre-warmed (on a worker thread)
        self.aborted = False  # `abort` ran: nothing starts any more
        self._guard = threading.Lock()  # `starting` is changed off the loop's thread

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            await self.lock.acquire()
        except BaseException:
            self.tasks.discard(task)
            raise

    async def __aexit__(self, *exc: object) -> None:
        self.lock.release()
        self.tasks.discard(asyncio.current_task())

    @contextlib.contextmanager
    def start(self, executor: Executor) -> Iterator[None]:
        """`executor` is being pre-warmed within this block (any thread). Raises
        `DeployError` once `abort` ran (a load that was still compiling then would
        start hosts nobody stops)."""
        with self._guard:
            if self.aborted:
                raise DeployError("the PoP is stopping: not started")
            self.starting.add(executor)
        try:
            yield
        finally:
            with self._guard:
                self.starting.discard(executor)

    async def abort(self) -> None:
        """Stop every executor still starting (its pre-warm raises), cancel every
        change and wait until each has undone what it wrote. Never raises."""
        with self._guard:
            self.aborted = True
            starting = list(self.starting)
        for executor in starting:
            await asyncio.to_thread(executor.close)
        tasks = [t for t in self.tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
