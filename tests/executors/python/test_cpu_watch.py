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


@pytest.mark.parametrize(("limit", "tick"), [
    (0.01, 0.005),  # never finer than 5 ms
    (0.04, 0.005),
    (0.08, 0.01),  # an eighth of the limit
    (0.4, 0.05),
    (0.8, 0.1),
    (30.0, 0.1),  # never coarser than 100 ms
])
def test_the_watch_ticks_at_an_eighth_of_its_limit_within_5_to_100_ms(limit: float,
                                                                       tick: float) -> None:
    assert CpuWatch(limit, over=lambda job: None).tick == pytest.approx(tick)


def test_one_timer_ticks_for_every_job_watched_and_close_stops_it() -> None:
    loop = asyncio.new_event_loop()
    try:
        watch = CpuWatch(LIMIT, over=lambda job: None)
        first, second = Job(loop, b"a"), Job(loop, b"b")
        watch.watch(Isolate(Thread(loop, False)), first)
        timer = watch.timer
        assert timer is not None
        watch.watch(Isolate(Thread(loop, False)), second)
        assert watch.timer is timer  # not armed again
        watch.close()
        assert timer.cancelled() and watch.timer is None
        assert watch.running == {} and watch.others == {}
        loop.run_until_complete(asyncio.sleep(watch.tick * 2))
        assert watch.timer is None  # the cancelled tick never ran
    finally:
        loop.close()


def test_forget_drops_only_the_job_it_names() -> None:
    loop = asyncio.new_event_loop()
    try:
        watch = CpuWatch(LIMIT, over=lambda job: None)
        isolate, job, other = Isolate(Thread(loop, False)), Job(loop, b"a"), Job(loop, b"b")
        watch.watch(isolate, job)
        watch.forget(isolate, other)  # handed back: it never started, the one running did
        assert [j for j, *_ in watch.running.values()] == [job]
        watch.forget(Isolate(Thread(loop, False)), job)  # an isolate never watched
        watch.forget(isolate, job)
        assert watch.running == {}
        watch.close()
    finally:
        loop.close()


@dataclass(eq=False)
class Dial:
    """A clock the test sets: an isolate thread's CPU, or a host's other threads'."""

    value: float | None = 0.0

    def read(self) -> float | None:
        return self.value

    def others(self) -> float | None:
        return self.value


def test_other_threads_are_shared_among_the_jobs_still_running_on_their_host() -> None:
    """What the other threads used in a tick is split among that host's jobs that
    have not ended (one that ended counts for none); a count that fell (its thread
    ended and was no longer summed) charges nothing, and a host that is gone drops
    its jobs unread."""
    loop = asyncio.new_event_loop()
    try:
        watch = CpuWatch(LIMIT, over=lambda job: None)
        host = Dial(0.0)
        a, b, ended = Job(loop, b"a"), Job(loop, b"b"), Job(loop, b"c")
        ia, ib, ie = (Isolate(Thread(loop, False), host) for _ in range(3))  # type: ignore[arg-type]
        watch.watch(ia, a)
        watch.watch(ib, b)
        watch.watch(ie, ended)
        ended.end()  # between two ticks: still in `running` until the next
        assert watch._shares() == {host: 0.0}  # first read: nothing before it to charge
        host.value = 0.03
        assert watch._shares() == {host: pytest.approx(0.015)}  # two jobs, not three
        host.value = 0.01  # fell
        assert watch._shares() == {host: 0.0}
        host.value = None
        assert watch._shares() == {host: None}
        watch.close()
    finally:
        loop.close()


def test_a_host_with_no_job_running_is_forgotten_and_charges_none() -> None:
    """Between requests, what a host's other threads use (its watchdogs' ticks) is
    charged to no job: a job that starts later counts from the next reading on."""
    loop = asyncio.new_event_loop()
    try:
        watch = CpuWatch(LIMIT, over=lambda job: None)
        host = Dial(1.0)
        first = Job(loop, b"a")
        watch.watch(Isolate(Thread(loop, False), host), first)  # type: ignore[arg-type]
        watch._shares()
        first.end()
        assert watch._shares() == {} and watch.others == {}
        host.value = 5.0  # used while nothing ran
        second = Job(loop, b"b")
        watch.watch(Isolate(Thread(loop, False), host), second)  # type: ignore[arg-type]
        assert watch._shares() == {host: 0.0}
        watch.close()
    finally:
        loop.close()


class Stepped:
    """A watch whose ticks the test takes one at a time (`tick`), on dials it sets:
    exact binary fractions, so that a count landing on the limit is exactly on it."""

    def __init__(self, limit: float, excuse: bool = False) -> None:
        self.loop = asyncio.new_event_loop()
        self.over: list[Job] = []
        self.asked: list[Job] = []
        self.watch = CpuWatch(limit, over=self.over.append, excused=self._excused)
        self.excuse = excuse
        self.ticks = 0

    def _excused(self, job: Job) -> bool:
        self.asked.append(job)
        return self.excuse

    def job(self, thread: Dial, host: Dial) -> Job:
        job = Job(self.loop, b"job")
        self.watch.watch(Isolate(thread, host), job)  # type: ignore[arg-type]
        return job

    def tick(self) -> None:
        self.ticks += 1
        self.watch._check(self.loop)

    def close(self) -> None:
        self.watch.close()
        self.loop.close()


def test_a_job_is_cut_the_tick_its_count_reaches_its_limit_not_before() -> None:
    s = Stepped(0.5)
    try:
        thread = Dial(3.0)  # what the thread used before this job: not the job's
        job = s.job(thread, Dial())
        s.tick()  # the first look: the count starts here
        thread.value = 3.25
        s.tick()
        thread.value = 3.4375
        s.tick()
        assert s.over == [] and s.asked == []
        thread.value = 3.5  # exactly the limit
        s.tick()
        assert s.over == [job] and s.asked == [job]
        assert s.watch.running == {}
    finally:
        s.close()


def test_a_jobs_count_adds_its_share_of_its_hosts_other_threads_each_tick() -> None:
    """Two jobs whose own threads sleep, on a host whose other threads use 0.25 s a
    tick: each is charged 0.125 a tick from the second look on, so both reach the
    0.5 s limit at the fifth tick; excused, they get `RESTART` more (1.0 s) and
    reach it at the ninth."""
    s = Stepped(0.5, excuse=True)
    try:
        host = Dial(0.0)
        a, b = s.job(Dial(), host), s.job(Dial(), host)
        for n in range(1, 12):
            s.tick()
            assert (s.asked == []) == (n < 5), n
            assert (s.over == []) == (n < 9), n
            host.value = n * 0.25
        assert s.asked == [a, b] and s.over == [a, b]
    finally:
        s.close()


def test_a_job_that_ended_or_lost_its_thread_is_dropped_whatever_its_thread_does() -> None:
    """Ended: its thread may go on (the next job, a thread the handler left): nothing
    of that is charged to it, and it is never cut. An isolate whose thread is gone
    (its `clock` None) is dropped too."""
    s = Stepped(0.5)
    try:
        host = Dial(0.0)
        thread = Dial(0.0)
        ended, running = s.job(thread, host), Job(s.loop, b"b")
        lost = Isolate(Dial(0.0), host)  # type: ignore[arg-type]
        s.watch.watch(lost, running)
        s.tick()
        ended.end()
        thread.value = 9.0
        lost.clock = None
        s.tick()
        assert s.over == [] and s.watch.running == {}
        assert not running.done
    finally:
        s.close()
