"""One thread that runs jobs a step at a time, taking clients, then their jobs, in turn.

A job is a generator: each ``next()`` does one step of work (an inference batch)
and its ``return`` value is the job's result. Each job belongs to a client (who
asked; None: anonymous). Turns go round the clients with work, and a client's
turn is one step of its job at the head of its queue, which then goes to the
tail; so a job that arrives while others run waits for at most one step of each
other client, not for all of their work (a 2048-input embedding made every other
embedding wait minutes in FIFO order), and one client's eight long jobs get one
turn in two beside another client's, not eight in nine.

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

    def __init__(self, steps: Steps[T], stop: threading.Event, client: str | None) -> None:
        self.steps = steps
        self.stop = stop
        self.client = client
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
        self._turns: deque[str | None] = deque()  # the clients with jobs, next turn first
        self._jobs: dict[str | None, deque[_Job[Any]]] = {}  # theirs, in turn; none empty
        self._ready = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit[T](self, steps: Steps[T], stop: threading.Event, client: str | None = None
                  ) -> Future[T]:
        """Queue `steps` behind `client`'s waiting jobs (a client with none takes
        its turn after those of the clients waiting now); the future gets its
        result, or `EngineError` (``cancelled``) once `stop` is set before it ends.

        Raises `EngineError` (internal) once closed.
        """
        job = _Job(steps, stop, client)
        with self._ready:
            if self._closed:
                steps.close()
                raise EngineError("internal", 503, f"{self._thread.name} is closed")
            self._queue(job)
            self._ready.notify()
        return job.future

    def _queue(self, job: _Job[Any]) -> None:
        """`job` to its client's tail (the lock held); a client new to the turns last."""
        if (mine := self._jobs.get(job.client)) is not None:
            mine.append(job)
        else:
            self._jobs[job.client] = deque([job])
            self._turns.append(job.client)

    def _run(self) -> None:
        while (job := self._next()) is not None:
            if not job.step():
                self._requeue(job)

    def _requeue(self, job: _Job[Any]) -> None:
        with self._ready:
            if not self._closed:
                self._queue(job)
                return
        job.drop(EngineError("internal", 503, f"{self._thread.name} was closed"))

    def _next(self) -> _Job[Any] | None:
        with self._ready:
            while not self._turns and not self._closed:
                self._ready.wait()
            if self._closed:
                return None
            client = self._turns.popleft()
            mine = self._jobs[client]
            job = mine.popleft()
            if mine:  # its other jobs' turn comes after the other clients'
                self._turns.append(client)
            else:
                del self._jobs[client]
            return job

    def close(self) -> None:
        """Stop the thread after its current step; jobs waiting fail with
        `EngineError` (internal)."""
        with self._ready:
            self._closed = True
            jobs = [job for mine in self._jobs.values() for job in mine]
            self._jobs, self._turns = {}, deque()
            self._ready.notify()
        for job in jobs:
            job.drop(EngineError("internal", 503, f"{self._thread.name} was closed"))
