"""`limits.cpu_ms` of a Python function, kept by the PoP: the CPU time of each
request's isolate thread (`ThreadClock`, the kernel's count), and that of its host's
other threads (those handlers start: `Host.others`), checked every tick while
requests run. Which request started which thread the PoP cannot tell (the host,
which could, runs the function's code), so what the other threads used in a tick
is shared among the requests then running on that host, all of one function's: a
request alone on its host is charged all of it; one of n, a 1/n share. A request
may so use the unspent CPU of others running beside it (spin in a thread while n-1
others wait: n times its limit), never more than the limits of all of them.

The guest's own watchdog (`watchdog.Watchdog`) stops a request at its limit and
answers the 503; it lives in the function's interpreter, which can find it
(``gc.get_objects()``) and turn it off. This check sits past the watchdog's limit
(`outer_limit`: one watchdog tick and `GRACE` later), so it fires only for a
request that its watchdog did not stop: tampered with, stuck in C code, or whose
threads (which the watchdog does not count) used the CPU. Then
the job fails with 503 ``cpu_limit`` and its isolate is handled as stuck (its host
is killed unless the job ends within `supervisor.KILL_GRACE`).

One exception, bounded: a job queued for an isolate whose last handler left a
thread that could not be stopped waits while a fresh interpreter starts on that
thread (~110 ms of CPU here: create, import the SDK and the function), and its
host asks to be replaced first. A job over its limit on a host being replaced is
`excused` once, for `RESTART` more seconds. A guest can ask for its host's
replacement too (RETIRE): then its jobs in flight get that much more CPU, once
each, and the host is replaced.

Cheap per request: the first look at a job's thread is at the next tick (a job
that ended by then was never read), so a request pays a dict entry; a job is
first seen within one tick of its start and seen past the limit within one more:
a request runs at most `outer_limit` plus two ticks of CPU (plus the PoP loop's
lag). No sockets or processes: jobs and clocks only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from runtime.executors.python.job import Job
from runtime.executors.python.watchdog import tick_of

# past the watchdog's limit and tick: the interrupt landing, the guest's error answer
GRACE = 0.025
RESTART = 0.5  # CPU a fresh interpreter may take to start under a job, on a retiring host


class Clock(Protocol):
    def read(self) -> float | None:
        """Seconds of CPU; None once its thread is gone."""


class Host(Protocol):
    def others(self) -> float | None:
        """Seconds of CPU its threads other than its main and isolate threads used."""


class Clocked(Protocol):
    """An isolate as the watch sees it."""

    @property
    def clock(self) -> Clock | None: ...

    @property
    def owner(self) -> Host: ...


def outer_limit(cpu_ms: int, wall_ms: int) -> float:
    """Seconds of CPU past which the PoP cuts a request: its limit, one tick of the
    guest's watchdog (which checks that often) and `GRACE`."""
    return cpu_ms / 1000 + tick_of(cpu_ms, wall_ms) + GRACE


class CpuWatch:
    def __init__(self, limit: float, over: Callable[[Job], None],
                 excused: Callable[[Job], bool] = lambda job: False) -> None:
        """`over(job)` is called (once) for a job whose count (its thread's CPU and
        its shares of its host's other threads') passed `limit` seconds, unless
        `excused(job)`, asked once: then it may run `RESTART` more."""
        # Global state
        self.limit = limit
        self.tick = min(max(limit / 8, 0.005), 0.1)
        self.over, self.excused = over, excused
        self.timer: asyncio.TimerHandle | None = None
        # Per-request state: by isolate (a job replaces its isolate's last: the dict
        # stays as small as the pool), the job it runs, what its thread's clock read
        # when the job was first looked at (None: not yet), its shares of its host's
        # other threads' CPU since, and the CPU it may use
        self.running: dict[Clocked, tuple[Job, float | None, float, float]] = {}
        # what each host with jobs running read last (`Host.others`)
        self.others: dict[Host, float | None] = {}

    def watch(self, isolate: Clocked, job: Job) -> None:
        """`job` starts on `isolate` (one whose thread is unknown is not watched)."""
        if isolate.clock is None:
            return
        self.running[isolate] = (job, None, 0.0, self.limit)
        if self.timer is None:
            loop = job.future.get_loop()
            self.timer = loop.call_later(self.tick, self._check, loop)

    def forget(self, isolate: Clocked, job: Job) -> None:
        """`job` did not run on `isolate` after all (sent ahead, handed back)."""
        entry = self.running.get(isolate)
        if entry is not None and entry[0] is job:
            del self.running[isolate]

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        self.timer = None
        running = self.running
        shares = self._shares()
        for isolate, (job, first, extra, limit) in list(running.items()):
            clock, share = isolate.clock, shares.get(isolate.owner)
            now = None if job.done or clock is None else clock.read()
            if now is None or share is None:  # ended, or its thread or host is gone
                del running[isolate]
            elif first is None:
                running[isolate] = (job, now, 0.0, limit)
            elif now - first + extra + share < limit:
                running[isolate] = (job, first, extra + share, limit)
            elif limit == self.limit and self.excused(job):
                running[isolate] = (job, first, extra + share, limit + RESTART)
            else:
                del running[isolate]
                self.over(job)
        if running:
            self.timer = loop.call_later(self.tick, self._check, loop)

    def _shares(self) -> dict[Host, float | None]:
        """Each host with jobs running: what its other threads used since the last
        tick, shared among those jobs (None: the host is gone). A host with none
        running is forgotten: what its threads use between requests (the watchdogs'
        ticks) is charged to none."""
        jobs: dict[Host, int] = {}
        for isolate, (job, *_) in self.running.items():
            if not job.done:
                jobs[isolate.owner] = jobs.get(isolate.owner, 0) + 1
        last, self.others = self.others, {host: host.others() for host in jobs}
        shares: dict[Host, float | None] = {}
        for host, n in jobs.items():
            now, before = self.others[host], last.get(host)
            shares[host] = None if now is None else 0.0 if before is None else max(
                now - before, 0.0) / n
        return shares

    def close(self) -> None:
        """Stop watching (the pool is closing)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.running.clear()
        self.others.clear()
