"""The PoP's CPU watch over isolate threads, without processes: clocks that spin
(CPU time grows with the loop's time) or sleep stand in for `ThreadClock` and for a
host's other threads (the real ones are read in tests/test_python_cpu_limit.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from runtime.executors.python.cpu_watch import RESTART, CpuWatch, outer_limit
from runtime.executors.python.job import Job
from runtime.executors.python.watchdog import tick_of

LIMIT = 0.04


@dataclass
class Thread:
    """An isolate's thread: its CPU grows with the loop's time while it spins."""

    loop: asyncio.AbstractEventLoop
    spins: bool = True
    gone: bool = False

    def __post_init__(self) -> None:
        self.began = self.loop.time()

    def read(self) -> float | None:
        if self.gone:
            return None
        return self.loop.time() - self.began if self.spins else 0.0


@dataclass(eq=False)
class Host:
    """Its other threads: none, or one that spins (a thread a handler started)."""

    stray: Thread | None = None

    def others(self) -> float | None:
        return 0.0 if self.stray is None else self.stray.read()


@dataclass(eq=False)
class Isolate:
    clock: Thread | None
    owner: Host = field(default_factory=Host)


def run(watch: CpuWatch, jobs: list[tuple[Job, Isolate]], seconds: float) -> None:
    loop = jobs[0][0].future.get_loop()
    for job, isolate in jobs:
        watch.watch(isolate, job)
    loop.run_until_complete(asyncio.sleep(seconds))


def test_a_spinning_job_is_cut_once_past_its_limit_and_a_sleeping_one_never() -> None:
    loop = asyncio.new_event_loop()
    try:
        over: list[tuple[Job, float]] = []
        watch = CpuWatch(LIMIT, over=lambda job: over.append((job, loop.time())))
        spinner, sleeper, unknown = Job(loop, b"spin"), Job(loop, b"nap"), Job(loop, b"?")
        began = loop.time()
        run(watch, [(spinner, Isolate(Thread(loop))), (sleeper, Isolate(Thread(loop, False))),
                    (unknown, Isolate(None))], LIMIT * 6)
        assert [job for job, _ in over] == [spinner]
        # first looked at within a tick, cut within one more (the loop may lag a little)
        assert LIMIT <= over[0][1] - began < LIMIT + 2 * watch.tick + 0.05
        assert [job for job, *_ in watch.running.values()] == [sleeper]
        sleeper.end()
        loop.run_until_complete(asyncio.sleep(watch.tick * 3))
        assert watch.running == {} and watch.timer is None  # nothing runs: no more ticks
    finally:
        loop.close()


def test_a_thread_a_handler_started_counts_against_the_jobs_on_its_host() -> None:
    """The handler's own thread sleeps (it joined the thread it started, which
    spins): the other threads' CPU is shared among the jobs on that host (two: each
    is cut at twice its limit), and charged to none elsewhere."""
    loop = asyncio.new_event_loop()
    try:
        over: list[Job] = []
        watch = CpuWatch(LIMIT, over=over.append)
        busy, idle = Host(Thread(loop)), Host()
        joiner, neighbour, elsewhere = Job(loop, b"a"), Job(loop, b"b"), Job(loop, b"c")
        run(watch, [(joiner, Isolate(Thread(loop, False), busy)),
                    (neighbour, Isolate(Thread(loop, False), busy)),
                    (elsewhere, Isolate(Thread(loop, False), idle))], LIMIT * 6)
        assert over == [joiner, neighbour]
    finally:
        loop.close()


def test_jobs_that_ended_or_lost_their_thread_are_dropped_unread() -> None:
    loop = asyncio.new_event_loop()
    try:
        over: list[Job] = []
        watch = CpuWatch(LIMIT, over=over.append)
        ended, orphan = Job(loop, b"a"), Job(loop, b"b")
        thread = Thread(loop)
        watch.watch(Isolate(Thread(loop)), ended)
        watch.watch(Isolate(thread), orphan)
        ended.end()
        thread.gone = True  # its host died
        loop.run_until_complete(asyncio.sleep(LIMIT * 3))
        assert over == [] and watch.running == {}
    finally:
        loop.close()


def test_a_job_on_a_host_being_replaced_is_excused_once_for_a_restart() -> None:
    loop = asyncio.new_event_loop()
    try:
        over: list[tuple[Job, float]] = []
        asked: list[Job] = []

        def excused(job: Job) -> bool:
            asked.append(job)
            return True

        watch = CpuWatch(LIMIT, over=lambda job: over.append((job, loop.time())),
                         excused=excused)
        job = Job(loop, b"queued")
        began = loop.time()
        run(watch, [(job, Isolate(Thread(loop)))], LIMIT + RESTART + 0.2)
        assert asked == [job]  # once
        assert [j for j, _ in over] == [job]
        assert LIMIT + RESTART <= over[0][1] - began < LIMIT + RESTART + 2 * watch.tick + 0.1
    finally:
        loop.close()


def test_the_outer_limit_sits_one_watchdog_tick_and_a_grace_past_the_limit() -> None:
    assert tick_of(100, 5000) == 0.025 and tick_of(50, 20) == 0.005
    assert tick_of(60_000, 60_000) == 0.1
    assert outer_limit(100, 5000) == pytest.approx(0.15)
