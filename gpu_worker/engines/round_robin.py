"""One thread that runs jobs a step at a time, taking the waiting jobs in turn.

A job is a generator: each ``next()`` does one step of work (an inference batch)
and its ``return`` value is the job's result. The thread runs one step of the
job at the head of the queue and puts the job back at the tail, so a job that
arrives while others run waits for at most one step of each, not for all of
their work (a 2048-input embedding made every other embedding wait minutes in
FIFO order).

Pure Python: nothing here knows about models, so each rule has a test without one.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Generator
from concurrent.futures import Future
from typing import Any

from edgefn_core.errors import EngineError

type Steps[T] = Generator[None, None, T]


def run_to_end[T](steps: Steps[T]) -> T:
    """The result of `steps`, all run now on this thread."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


class _Job[T]:
    """A generator, the future its result goes to, and the event that drops it."""

    def __init__(self, steps: Steps[T], stop: threading.Event) -> None:
        self.steps = steps
        self.stop = stop
        self.future: Future[T] = Future()

    def step(self) -> bool:
        """Run one step; True when the job is over (done, failed or dropped)."""
        if not self.future.running() and not self.future.set_running_or_notify_cancel():
            self.steps.close()  # its caller cancelled the future while it waited
            return True
        if self.stop.is_set():  # nobody waits for it any more
            self.drop(EngineError("cancelled", 499, "the request was cancelled"))
            return True
        try:
            next(self.steps)
        except StopIteration as done:
            self.future.set_result(done.value)
            return True
        except BaseException as e:  # the job's own failure goes to whoever waits for it
            self.future.set_exception(e)
            return True
        return False

    def drop(self, error: EngineError) -> None:
        """End the job with `error` unless its future was cancelled."""
        self.steps.close()
        if not self.future.cancelled():
            self.future.set_exception(error)


class RoundRobin:
    """Runs submitted jobs on one daemon thread, one step per turn."""

    def __init__(self, name: str) -> None:
        self._queue: deque[_Job[Any]] = deque()
        self._ready = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit[T](self, steps: Steps[T], stop: threading.Event) -> Future[T]:
        """Queue `steps` behind the jobs waiting now; the future gets its result,
        or `EngineError` (``cancelled``) once `stop` is set before it ends.

        Raises `EngineError` (internal) once closed.
        """
        job = _Job(steps, stop)
        with self._ready:
            if self._closed:
                steps.close()
                raise EngineError("internal", 503, f"{self._thread.name} is closed")
            self._queue.append(job)
            self._ready.notify()
        return job.future

    def _run(self) -> None:
        while (job := self._next()) is not None:
            if not job.step():
                self._requeue(job)

    def _requeue(self, job: _Job[Any]) -> None:
        with self._ready:
            if not self._closed:
                self._queue.append(job)
                return
        job.drop(EngineError("internal", 503, f"{self._thread.name} was closed"))

    def _next(self) -> _Job[Any] | None:
        with self._ready:
            while not self._queue and not self._closed:
                self._ready.wait()
            return None if self._closed else self._queue.popleft()

    def close(self) -> None:
        """Stop the thread after its current step; jobs waiting fail with
        `EngineError` (internal)."""
        with self._ready:
            self._closed = True
            jobs, self._queue = list(self._queue), deque()
            self._ready.notify()
        for job in jobs:
            job.drop(EngineError("internal", 503, f"{self._thread.name} was closed"))
