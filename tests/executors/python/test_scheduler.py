"""The Python pool's scheduling without sockets or processes: fake isolates stand
in for subinterpreters (real ones are in tests/test_python.py)."""

from __future__ import annotations

import asyncio
import gc
import heapq
import itertools
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgefn_core.errors import FunctionError
from runtime.executors.python.config import PIPELINE_AUTO
from runtime.executors.python.job import Job
from runtime.executors.python.scheduler import (
    AHEAD_BELOW,
    AUTO_DEPTH,
    PACK_WAIT,
    TIMER_GRAIN,
    TIMER_SLACK,
    Scheduler,
)
from runtime.net.message import Response


class FakeIsolate:
    """Records the jobs it is given; `answer` plays the guest's last frame."""

    def __init__(self, name: str, generation: int = 1, state: str = "idle") -> None:
        self.name = name
        self.generation = generation
        self.state = state
        self.uses = 0
        self.recycling = False
        self.stuck = False
        self.jobs: list[Job] = []
        self.cancels = 0
        self.job: Job | None = None
        self.queue: deque[Job] = deque()
        self.dropping = False
        self.drops = 0
        self.since = 0.0

    def run(self, job: Job) -> None:
        """As `Isolate.run`: it runs now if the isolate has none, else after those sent."""
        self.jobs.append(job)
        if self.job is None or self.job.done:
            self.job = job
        else:
            self.queue.append(job)

    def cancel(self, job: Job) -> None:
        self.cancels += 1

    def drop(self) -> None:
        """As `Isolate.drop` when it cannot tell: the guest's answer (`Harness.hand_back`)
        says which it hands back."""
        self.drops += 1
        if self.queue:
            self.dropping = True

    def __repr__(self) -> str:
        return self.name


class Harness:
    def __init__(self, loop: asyncio.AbstractEventLoop, size: int = 4, started: int = 2,
                 wall_ms: int = 10_000, recycle_after: int = 1000, depth: int = 0,
                 clock: Callable[[], float] | None = None, cpu_ms: int = 50) -> None:
        self.loop = loop
        self.grown: list[FakeIsolate] = []
        self.stuck: list[tuple[FakeIsolate, Job]] = []
        self.drained = 0
        # the CPU watch's calls: a job that starts on an isolate, and one handed back
        self.watched: list[tuple[FakeIsolate, Job]] = []
        self.unwatched: list[tuple[FakeIsolate, Job]] = []
        self.s: Scheduler[FakeIsolate] = Scheduler(
            wall_ms, recycle_after, grow=self.grown.append,
            stuck=lambda i, j: self.stuck.append((i, j)), drained=self._drained, depth=depth,
            clock=clock or time.monotonic, cpu_ms=cpu_ms,
            watch=lambda i, j: self.watched.append((i, j)),
            unwatch=lambda i, j: self.unwatched.append((i, j)))
        self.isolates = [FakeIsolate(f"i{n}", state="idle" if n < started else "unstarted")
                         for n in range(size)]
        self.s.use(1, self.isolates)

    def _drained(self) -> None:
        self.drained += 1

    def submit(self, tag: bytes = b"") -> Job:
        job = Job(self.loop, tag)
        self.s.submit(job)
        return job

    def answer(self, isolate: FakeIsolate, body: bytes = b"ok") -> None:
        """The guest's RESPONSE for the isolate's job, as `Isolate._finish` does: the
        next one sent ahead is its job then, or it is free."""
        job = isolate.job
        assert job is not None
        job.respond(Response(200, [], body))
        if isolate.queue:
            isolate.job = isolate.queue.popleft()
            self.s.begun(isolate, isolate.job)
        else:
            isolate.job = None
            self.s.finished(isolate)

    def hand_back(self, isolate: FakeIsolate) -> None:
        """The guest's answer to a DROP read before it started any of them: all of
        those sent ahead come back (`Isolate._dropped`)."""
        jobs, isolate.queue = list(isolate.queue), deque()
        isolate.dropping = False
        isolate.uses -= len(jobs)
        for job in reversed(jobs):
            self.s.requeue(job)

    def runner(self, job: Job) -> FakeIsolate | None:
        return next((i for i in self.isolates if job in i.jobs), None)


def turn(loop: asyncio.AbstractEventLoop) -> None:
    """Run what the loop's turn left for its end (``call_soon``)."""
    loop.run_until_complete(asyncio.sleep(0))


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_the_most_recently_freed_isolate_takes_the_next_job(
        loop: asyncio.AbstractEventLoop) -> None:
    h = Harness(loop, size=3, started=3)
    a, b = h.submit(), h.submit()
    first, second = h.runner(a), h.runner(b)
    assert first is not None and second is not None and first is not second
    h.answer(second)
    h.answer(first)
    assert h.runner(h.submit()) is first  # LIFO: the warmest
    assert h.runner(h.submit()) is second
    assert h.s.in_flight == 2 and not h.grown


def test_jobs_wait_in_order_when_every_isolate_is_busy(loop: asyncio.AbstractEventLoop) -> None:
    h = Harness(loop, size=2, started=2)
    jobs = [h.submit(bytes([n])) for n in range(5)]
    running = [h.runner(j) for j in jobs]
    assert running[2:] == [None, None, None] and list(h.s.waiting) == jobs[2:]
    assert h.grown == []  # no room to scale up
    freed = running[0]
    assert freed is not None
    h.answer(freed)
    assert h.runner(jobs[2]) is freed and list(h.s.waiting) == jobs[3:]  # oldest first
    assert jobs[0].future.result().body == b"ok"


def test_scale_up_starts_one_isolate_per_waiting_job_up_to_max_and_no_more(
        loop: asyncio.AbstractEventLoop) -> None:
    h = Harness(loop, size=4, started=1)
    jobs = [h.submit() for _ in range(6)]
    assert h.grown == h.isolates[1:]  # three more, in order, then nothing
    assert [i.state for i in h.isolates] == ["busy", "starting", "starting", "starting"]
    h.s.started(h.isolates[2])  # a new isolate said READY: it takes the oldest waiting job
    assert h.runner(jobs[1]) is h.isolates[2]
    h.submit()
    assert len(h.grown) == 3


def test_an_isolate_recycles_after_recycle_after_jobs(loop: asyncio.AbstractEventLoop) -> None:
    h = Harness(loop, size=1, started=1, recycle_after=2)
    (only,) = h.isolates
    h.submit()
    h.answer(only)
    assert only.state == "idle"
    h.submit()
    h.answer(only)
    assert only.state == "recycling" and not h.s.idle
    waiting = h.submit()
    assert h.runner(waiting) is None  # no job for it until its new interpreter is READY
    h.s.started(only)
    assert h.runner(waiting) is only and only.uses == 1


def test_the_guests_recycling_notice_takes_effect_when_its_job_ends(
        loop: asyncio.AbstractEventLoop) -> None:
    h = Harness(loop, size=1, started=1)
    (only,) = h.isolates
    h.submit()
    only.recycling = True
    assert only.state == "busy"
    h.answer(only)
    assert (only.state, only.recycling) == ("recycling", False)


def test_retiring_runs_the_waiting_jobs_and_reports_drained_once(
        loop: asyncio.AbstractEventLoop) -> None:
    """A redeploy under load failed the jobs that had queued (502 ``crash``): they run
    on the retired version, as those in flight do."""
    h = Harness(loop, size=1, started=1)
    running, *waiting = [h.submit() for _ in range(3)]
    h.s.retire()
    assert not any(job.done for job in waiting) and h.drained == 0
    for job in (running, *waiting):
        assert h.drained == 0
        h.answer(h.isolates[0])
        assert job.future.result().status == 200
    assert h.drained == 1
    h.s.retire()
    assert h.drained == 1


def test_retiring_an_idle_pool_reports_drained_at_once(loop: asyncio.AbstractEventLoop) -> None:
    h = Harness(loop)
    h.s.retire()
    assert h.drained == 1


def test_a_job_for_a_drained_pool_fails_at_once_not_at_its_wall_limit(
        loop: asyncio.AbstractEventLoop) -> None:
    """Its hosts are stopping: it was handed to an isolate of a stopped host and waited
    there to its wall limit (a 504 mid-deploy)."""
    h = Harness(loop)
    h.s.retire()
    late = h.submit()
    assert late.done and not any(i.jobs for i in h.isolates)
    err = late.future.exception()
    assert isinstance(err, FunctionError) and (err.code, err.status) == ("replaced", 503)
    assert h.s.in_flight == 0 and h.drained == 1


def test_a_job_past_its_wall_time_fails_and_its_isolate_is_reported_stuck(
        loop: asyncio.AbstractEventLoop) -> None:
    h = Harness(loop, size=1, started=1, wall_ms=20)
    (only,) = h.isolates
    running, waiting = h.submit(), h.submit()
    for job in (running, waiting):
        with pytest.raises(FunctionError) as err:
            loop.run_until_complete(asyncio.wait_for(job.future, 5))
        assert (err.value.code, err.value.status) == ("wall_limit", 504)
        assert "wall-time limit of 20 ms" in str(err.value)
    assert h.stuck == [(only, running)] and only.stuck  # the waiting job had no isolate
    assert h.s.in_flight == 0
    h.answer(only)  # the guest's late answer: the isolate is free, the dead job is skipped
    assert only.jobs == [running] and list(h.s.idle) == [only]


def test_each_job_fails_at_its_own_wall_limit_whatever_ended_before_it(
        loop: asyncio.AbstractEventLoop) -> None:
    """One timer serves every deadline: a job that ended, or one due earlier, neither
    hastens nor delays a later job's wall limit (TIMER_SLACK past it)."""
    h = Harness(loop, size=3, started=3, wall_ms=60)
    t0 = loop.time()
    answered, early = h.submit(), h.submit()
    h.answer(h.runner(answered))  # type: ignore[arg-type]
    loop.run_until_complete(asyncio.sleep(0.04))
    late = h.submit()
    failed: dict[str, float] = {}
    for name, job in (("early", early), ("late", late)):
        job.future.add_done_callback(lambda _, name=name: failed.setdefault(name, loop.time()))
    with pytest.raises(FunctionError):
        loop.run_until_complete(asyncio.wait_for(early.future, 5))
    assert not late.done  # due 40 ms after the early one
    with pytest.raises(FunctionError):
        loop.run_until_complete(asyncio.wait_for(late.future, 5))
    limit = 0.06 + TIMER_SLACK - TIMER_GRAIN
    assert failed["early"] - t0 >= limit and failed["late"] - t0 >= 0.04 + limit
    assert failed["late"] - failed["early"] >= 0.04 - 2 * TIMER_GRAIN
    assert h.s.in_flight == 0 and answered.future.result().status == 200


def test_a_job_that_ended_is_not_held_until_its_deadline(
        loop: asyncio.AbstractEventLoop) -> None:
    """Only its deadline waits (a float and an empty list): the job, its request and
    its response are freed when it ends."""
    h = Harness(loop, wall_ms=10_000)
    job = h.submit(b"a request body")
    isolate = h.runner(job)
    assert isolate is not None
    h.answer(isolate)
    loop.run_until_complete(asyncio.sleep(0))  # its future's callbacks ran
    isolate.jobs.clear()
    h.watched.clear()  # (the harness's record of the CPU watch's calls)
    gone = weakref.ref(job)
    del job
    gc.collect()
    assert gone() is None
    assert len(h.s.deadlines) == 1 and h.s.timer is not None  # still armed, for nothing
    h.submit()  # an ended job's deadline ahead of it is dropped
    assert len(h.s.deadlines) == 1


def test_a_new_generation_takes_over_and_the_old_one_gets_no_more_jobs(
        loop: asyncio.AbstractEventLoop) -> None:
    h = Harness(loop, size=1, started=1)
    (old,) = h.isolates
    h.submit()
    waiting = h.submit()
    new = FakeIsolate("new", generation=2)
    h.s.use(2, [new])  # the standby was promoted
    assert h.runner(waiting) is None and new.jobs == [waiting]
    h.answer(old)
    assert old not in h.s.idle
    h.submit()
    assert len(old.jobs) == 1


def test_without_an_active_host_jobs_wait_for_the_next_one(
        loop: asyncio.AbstractEventLoop) -> None:
    h = Harness(loop, size=2, started=2)
    h.s.clear()  # the active host died with no standby
    job = h.submit()
    assert list(h.s.waiting) == [job] and h.grown == []
    replacement = FakeIsolate("r", generation=3)
    h.s.use(3, [replacement])
    assert replacement.jobs == [job]


def test_an_isolate_that_died_while_idle_is_passed_over(loop: asyncio.AbstractEventLoop) -> None:
    h = Harness(loop, size=2, started=2)
    h.isolates[1].state = "dead"  # its socket closed; it is still in the idle stack
    assert h.runner(h.submit()) is h.isolates[0]
    assert h.runner(h.submit()) is None and len(h.s.waiting) == 1


def test_a_job_its_isolate_never_ran_goes_first_to_another_or_fails_if_none_is_left(
        loop: asyncio.AbstractEventLoop) -> None:
    """Handed to an isolate whose fresh interpreter then failed to start, it waited
    there to its wall limit (504) though another isolate was free."""
    h = Harness(loop, size=2, started=2)
    lost, _busy, waiting = h.submit(b"lost"), h.submit(b"busy"), h.submit(b"waiting")
    gone = h.runner(lost)
    assert gone is not None and list(h.s.waiting) == [waiting]
    gone.state = "dead"  # as `Isolate._ready` leaves it before handing the job back
    h.s.requeue(lost)
    assert list(h.s.waiting) == [lost, waiting] and not lost.done  # first in line
    (other,) = [i for i in h.isolates if i is not gone]
    h.answer(other)
    assert other.jobs[-1] is lost and lost.isolate is other
    h.answer(other)
    assert lost.future.result().status == 200 and h.s.in_flight == 1

    # a retired pool gets no new host: with no isolate left, it fails at once
    other.state = "dead"
    job = other.jobs[-1]
    h.s.retire()
    h.s.requeue(job)
    err = job.future.exception()
    assert isinstance(err, FunctionError) and (err.code, err.status) == ("replaced", 503)
    assert "stopped before running" in str(err) and h.s.in_flight == 0 and h.drained == 1


class FakeTimer:
    def __init__(self, when: float, callback: Callable[..., object], args: tuple) -> None:
        self.when, self.callback, self.args, self.cancelled = when, callback, args, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClockLoop:
    """As much of an event loop as jobs and the scheduler use, on a clock that moves
    only in `advance`; its timers fire `early` seconds before they are due, as
    uvloop's (whole milliseconds) may."""

    def __init__(self, early: float) -> None:
        self.now, self.early = 0.0, early
        self.timers: list[tuple[float, int, FakeTimer]] = []
        self.ready: deque[tuple[Callable[..., object], tuple]] = deque()
        self.seq = itertools.count()

    def time(self) -> float:
        return self.now

    def get_debug(self) -> bool:
        return False

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.Future(loop=self)  # type: ignore[arg-type]

    def call_soon(self, callback: Callable[..., object], *args: object,
                  context: object = None) -> None:
        self.ready.append((callback, args))

    def call_at(self, when: float, callback: Callable[..., object], *args: object,
                context: object = None) -> FakeTimer:
        timer = FakeTimer(when, callback, args)
        heapq.heappush(self.timers, (when - self.early, next(self.seq), timer))
        return timer

    def call_later(self, delay: float, callback: Callable[..., object], *args: object,
                   context: object = None) -> FakeTimer:
        return self.call_at(self.now + delay, callback, *args)

    def advance(self, seconds: float) -> None:
        """Run what is ready, then every timer due within `seconds`, each at its time.
        Raises AssertionError past 100,000 timers in one call (one re-armed for the same
        time, again and again, would never let it return)."""
        end = self.now + seconds
        self._run_ready()
        fired = 0
        while self.timers and self.timers[0][0] <= end:
            fired += 1
            assert fired <= 100_000, "a timer is re-armed for the time it fired at"
            at, _, timer = heapq.heappop(self.timers)
            self.now = max(self.now, at)
            if not timer.cancelled:
                timer.callback(*timer.args)
            self._run_ready()
        self.now = end

    def _run_ready(self) -> None:
        while self.ready:
            callback, args = self.ready.popleft()
            callback(*args)


OPS = st.lists(st.one_of(st.just(("submit", 0.0)), st.integers(0, 30).map(lambda i: ("end", i)),
                         st.floats(0, 0.08).map(lambda s: ("advance", s)),
                         st.sampled_from([0.0, 1e-4, 0.0005, 0.001]).map(lambda s: ("advance", s))),
               max_size=40)


@settings(max_examples=200, deadline=None)
@given(OPS, st.sampled_from([1, 7, 30]), st.sampled_from([0.0, 0.0004, TIMER_GRAIN * 0.99]),
       st.integers(1, 3))
def test_every_job_times_out_at_its_own_deadline_and_no_ended_job_does(
        ops: list[tuple[str, float]], wall_ms: int, early: float, size: int) -> None:
    """Model: each job is due ``wall_ms + TIMER_SLACK`` after it was submitted, as when
    each had its own `call_later` (22c4472 made it one timer for all): whatever was
    submitted, ended or waited around it, a job not ended by then fails with
    `wall_limit` at that time (up to `TIMER_GRAIN` early, not later), and one that
    ended never does."""
    loop = FakeClockLoop(early)
    h = Harness(loop, size=size, started=size, wall_ms=wall_ms)  # type: ignore[arg-type]
    jobs: list[tuple[Job, float]] = []
    failed_at: dict[int, float] = {}
    ended: set[int] = set()
    for op, arg in ops:
        if op == "submit":
            job, n = h.submit(), len(jobs)
            jobs.append((job, loop.now + wall_ms / 1000 + TIMER_SLACK))
            job.future.add_done_callback(
                lambda f, n=n: f.exception() is not None and failed_at.setdefault(n, loop.now))
        elif op == "end" and arg < len(jobs) and not jobs[int(arg)][0].done:
            job = jobs[int(arg)][0]
            isolate = job.isolate
            job.respond(Response(200, [], b"ok"))
            ended.add(int(arg))
            if isolate is not None:
                h.s.finished(isolate)  # type: ignore[arg-type]
        elif op == "advance":
            loop.advance(arg)
    loop.advance(wall_ms / 1000 + TIMER_SLACK + 0.01)  # past every deadline
    for n, (job, due) in enumerate(jobs):
        assert job.done
        if n in ended:
            assert n not in failed_at and all(j is not job for _, j in h.stuck)
        else:
            assert due - TIMER_GRAIN - 1e-9 <= failed_at[n] <= due + 1e-9, (n, due, failed_at[n])
            err = job.future.exception()
            assert isinstance(err, FunctionError) and err.code == "wall_limit"
    assert h.s.in_flight == 0 and not any(entry for _, entry in h.s.deadlines)
    assert h.s.timer is None and not h.s.deadlines


def test_a_busy_isolate_takes_jobs_ahead_up_to_depth_and_runs_them_in_order(
        loop: asyncio.AbstractEventLoop) -> None:
    h = Harness(loop, size=2, started=2, depth=2)
    jobs = [h.submit(bytes([n])) for n in range(7)]
    a, b = h.isolates
    # two run, then each busy isolate takes jobs ahead, the one with fewest first
    assert [b.job, a.job] == jobs[:2] and list(a.queue) == [jobs[2], jobs[4]]
    assert list(b.queue) == [jobs[3], jobs[5]] and list(h.s.waiting) == [jobs[6]]
    assert h.s.sent_ahead == 4
    h.answer(a)
    # the next one sent ahead runs (no wake-up), and the waiting job takes its place
    assert a.job is jobs[2] and list(a.queue) == [jobs[4], jobs[6]] and not h.s.waiting
    assert h.s.sent_ahead == 5 and jobs[6].isolate is a
    h.answer(a)
    h.answer(a)
    assert a.job is jobs[6] and not a.queue
    assert [j.done for j in jobs] == [False, True, True, False, True, False, False]


def test_waiting_jobs_are_sent_ahead_as_places_free_up_oldest_first(
        loop: asyncio.AbstractEventLoop) -> None:
    """A job that waited while every isolate was busy goes ahead to the first one
    with room, not only to one that went idle (each such start was a wake-up)."""
    h = Harness(loop, size=1, started=1, depth=2)
    jobs = [h.submit(bytes([n])) for n in range(6)]
    (a,) = h.isolates
    assert (a.job, list(a.queue), list(h.s.waiting)) == (jobs[0], jobs[1:3], jobs[3:])
    h.answer(a)
    assert (a.job, list(a.queue), list(h.s.waiting)) == (jobs[1], jobs[2:4], jobs[4:])
    jobs[4].future.cancel()  # its client left while it waited: skipped
    jobs[4].end()
    h.answer(a)
    assert (a.job, list(a.queue), list(h.s.waiting)) == (jobs[2], [jobs[3], jobs[5]], [])
    assert a.uses == 5 and h.s.sent_ahead == 4


def test_jobs_waiting_for_a_new_host_start_on_each_of_its_isolates_before_any_goes_ahead(
        loop: asyncio.AbstractEventLoop) -> None:
    """A host becoming active with jobs waiting: each of its idle isolates runs one
    before the rest are sent ahead (topped up on the first, the second would have
    taken back what it had, a DROP and its answer)."""
    h = Harness(loop, size=2, started=0, depth=4)
    jobs = [h.submit(bytes([n])) for n in range(5)]
    assert list(h.s.waiting) == jobs
    fresh = [FakeIsolate("n0", generation=2), FakeIsolate("n1", generation=2)]
    h.s.use(2, fresh)
    assert all(i.job is not None for i in fresh) and not h.s.waiting
    assert sorted(len(i.queue) for i in fresh) == [0, 3]


def test_a_large_job_is_never_sent_ahead_and_no_later_job_passes_it(
        loop: asyncio.AbstractEventLoop) -> None:
    """What an isolate holds unread stays small: a request of `AHEAD_BELOW` bytes or
    more waits for an idle isolate, and the jobs after it wait behind it (sent ahead
    past it, they would keep the isolate from ever going idle)."""
    h = Harness(loop, size=1, started=1, depth=2)
    (a,) = h.isolates
    first = h.submit(b"first")
    big = h.submit(b"x" * AHEAD_BELOW)
    small = h.submit(b"small")
    assert a.job is first and not a.queue and list(h.s.waiting) == [big, small]
    h.answer(a)
    assert a.job is big and list(a.queue) == [small]  # idle: it runs, and small goes ahead
    just_under = h.submit(b"x" * (AHEAD_BELOW - 1))
    big2, after = h.submit(b"y" * AHEAD_BELOW), h.submit(b"after")
    assert list(a.queue) == [small, just_under] and list(h.s.waiting) == [big2, after]
    h.answer(a)  # a place frees up: the waiting big one is not sent ahead, nor what follows
    assert a.job is small and list(a.queue) == [just_under]
    assert list(h.s.waiting) == [big2, after]
    h.answer(a)
    h.answer(a)
    assert a.job is big2 and list(a.queue) == [after] and not h.s.waiting


def test_an_isolate_that_frees_takes_back_the_jobs_sent_ahead_to_another(
        loop: asyncio.AbstractEventLoop) -> None:
    h = Harness(loop, size=2, started=2, depth=1)
    slow, fast, ahead = h.submit(b"slow"), h.submit(b"fast"), h.submit(b"ahead")
    a, b = h.isolates
    assert (b.job, a.job, list(a.queue)) == (slow, fast, [ahead])
    h.answer(a)  # `ahead` runs on a now: nothing to take back
    assert a.job is ahead and a.drops == 0
    behind = h.submit(b"behind")
    assert list(a.queue) == [behind] or list(b.queue) == [behind]
    owner = a if a.queue else b
    other = b if owner is a else a
    h.answer(other)  # the other one frees first: it asks for `behind` back
    assert not owner.dropping  # at the end of the loop's turn, if still idle then
    turn(loop)
    assert owner.dropping and other.state == "idle"
    uses = owner.uses
    h.hand_back(owner)
    assert other.job is behind and behind.isolate is other and h.s.requeued == 1
    assert owner.uses == uses - 1 and not owner.queue  # it never ran there


def test_an_isolate_that_frees_and_takes_a_job_in_the_same_turn_takes_none_back(
        loop: asyncio.AbstractEventLoop) -> None:
    """Under load the requests read in the turn an isolate frees in keep it busy: a
    DROP then (two wake-ups of each side) would only delay the jobs sent ahead."""
    h = Harness(loop, size=2, started=2, depth=2)
    first, second, ahead = h.submit(), h.submit(), h.submit()
    a, b = h.isolates
    owner, other = (a, b) if a.queue else (b, a)
    assert list(owner.queue) == [ahead]
    h.answer(other)
    new = h.submit()  # read in the same turn
    assert other.job is new
    turn(loop)
    assert owner.drops == 0 and list(owner.queue) == [ahead]
    h.answer(other)  # free again, and this turn brings nothing: it takes `ahead` back
    turn(loop)
    assert owner.dropping and owner.drops == 1
    h.hand_back(owner)
    assert other.job is ahead
    assert new.done and owner.job in (first, second) and not owner.job.done  # still runs


def test_an_isolate_that_went_idle_and_died_in_the_same_turn_takes_nothing_back(
        loop: asyncio.AbstractEventLoop) -> None:
    h = Harness(loop, size=2, started=2, depth=1)
    h.submit(), h.submit()
    ahead = h.submit()
    a, b = h.isolates
    owner, other = (a, b) if a.queue else (b, a)
    h.answer(other)
    other.state = "dead"  # its host died in the same turn
    turn(loop)
    assert owner.drops == 0 and list(owner.queue) == [ahead]


def test_a_job_cut_while_sent_ahead_is_taken_back_and_one_cut_running_takes_its_queue_back(
        loop: asyncio.AbstractEventLoop) -> None:
    h = Harness(loop, size=1, started=1, depth=1)
    running, ahead = h.submit(b"running"), h.submit(b"ahead")
    (a,) = h.isolates
    h.s.overran(ahead)  # as if its CPU watch had cut it (e.g. re-sent ahead after a hand-back)
    err = ahead.future.exception()
    assert isinstance(err, FunctionError) and err.code == "cpu_limit"
    assert a.dropping and not a.stuck and h.stuck == []  # its isolate is not stuck for it
    h.hand_back(a)
    assert h.s.requeued == 0 and not h.s.waiting  # it ended: nothing to run again
    later = h.submit(b"later")
    assert list(a.queue) == [later]
    h.s.overran(running)
    assert a.stuck and h.stuck == [(a, running)] and a.dropping  # and `later` is asked back
    h.hand_back(a)
    assert list(h.s.waiting) == [later] and not later.done


def test_a_job_cut_while_sent_ahead_that_started_anyway_is_handled_as_stuck(
        loop: asyncio.AbstractEventLoop) -> None:
    h = Harness(loop, size=1, started=1, depth=1)
    _running, ahead = h.submit(b"running"), h.submit(b"ahead")
    (a,) = h.isolates
    h.s.overran(ahead)
    h.answer(a)  # the guest started it before it read the DROP
    assert a.job is ahead and a.stuck and h.stuck == [(a, ahead)]


def test_an_isolate_recycling_after_its_jobs_gets_none_sent_ahead(
        loop: asyncio.AbstractEventLoop) -> None:
    h = Harness(loop, size=1, started=1, depth=2, recycle_after=2)
    jobs = [h.submit() for _ in range(4)]
    (a,) = h.isolates
    assert (a.job, list(a.queue), list(h.s.waiting)) == (jobs[0], [jobs[1]], jobs[2:])
    h.answer(a)
    h.answer(a)
    assert a.state == "recycling" and a.uses == 2


def auto_harness(size: int, started: int, job_seconds: float,
                 jobs: int = 60) -> tuple[Harness, FakeClockLoop]:
    """`pipeline = "auto"` on a fake clock, after `jobs` jobs of `job_seconds` each
    ran one at a time (the mean the scheduler follows is then close to it)."""
    loop = FakeClockLoop(0.0)
    h = Harness(loop, size=size, started=started, depth=PIPELINE_AUTO,  # type: ignore[arg-type]
                clock=lambda: loop.now)
    for _ in range(jobs):
        job = h.submit()
        runner = h.runner(job)
        assert runner is not None
        loop.advance(job_seconds)
        h.answer(runner)
    loop.advance(0)
    return h, loop


def test_auto_sends_none_ahead_until_the_jobs_are_known_to_be_short(
        loop: asyncio.AbstractEventLoop) -> None:
    """Its mean starts at PACK_WAIT: the first jobs spread over idle isolates and
    wait, as with `pipeline = 0`."""
    h = Harness(loop, size=2, started=2, depth=PIPELINE_AUTO)
    jobs = [h.submit() for _ in range(4)]
    assert all(i.job is not None and not i.queue for i in h.isolates)
    assert list(h.s.waiting) == jobs[2:] and h.s.sent_ahead == 0
    assert (h.s.depth, h.s.room) == (0, 0)


def test_auto_packs_short_jobs_onto_a_busy_isolate_rather_than_wake_an_idle_one() -> None:
    """Jobs of 20 us (python-hello's): AUTO_DEPTH packed behind the one running (1 ms /
    20 us - 1 is more), so a function's default 32 requests in flight wake one isolate;
    the job past them wakes a second."""
    h, loop = auto_harness(size=3, started=3, job_seconds=0.00002)
    assert h.s.service == pytest.approx(0.00002, rel=0.05)
    assert (h.s.depth, h.s.room) == (AUTO_DEPTH, AUTO_DEPTH) == (32, 32)
    jobs = [h.submit() for _ in range(AUTO_DEPTH + 2)]
    busy = [next(i for i in h.isolates if i.job is jobs[n]) for n in (0, AUTO_DEPTH + 1)]
    assert len([i for i in h.isolates if i.job is not None]) == 2
    assert list(busy[0].queue) == jobs[1:AUTO_DEPTH + 1] and not busy[1].queue
    assert h.s.sent_ahead == AUTO_DEPTH and not h.grown
    for _ in range(AUTO_DEPTH + 1):
        loop.advance(0.00002)
        h.answer(busy[0])
    h.answer(busy[1])
    assert all(j.done for j in jobs) and busy[0].state == "idle" and busy[0].drops == 0


def test_auto_packs_only_as_many_as_finish_within_pack_wait() -> None:
    """Jobs of 0.2 ms: 1 ms / 0.2 ms - 1 = 3 behind the one running; the next job
    wakes an idle isolate, and the one after that is packed onto the emptier one."""
    h, _ = auto_harness(size=2, started=2, job_seconds=0.0002)
    assert h.s.room == 3
    jobs = [h.submit() for _ in range(6)]
    a = next(i for i in h.isolates if i.job is jobs[0])
    b = next(i for i in h.isolates if i is not a)
    assert list(a.queue) == jobs[1:4] and b.job is jobs[4] and list(b.queue) == [jobs[5]]


def test_auto_an_isolate_going_idle_takes_nothing_back_from_one_whose_job_is_short() -> None:
    """Packed jobs stay where they are when another isolate goes idle (taking them
    back would spread them again: a DROP and a wake-up each side), unless the job
    they wait behind has run past PACK_WAIT."""
    h, loop = auto_harness(size=2, started=2, job_seconds=0.0002)
    jobs = [h.submit() for _ in range(6)]
    x, y = (next(i for i in h.isolates if i.job is jobs[n]) for n in (0, 4))
    assert list(x.queue) == jobs[1:4] and list(y.queue) == [jobs[5]]
    for _ in range(2):
        loop.advance(0.0002)
        h.answer(y)
    assert y.state == "idle"
    loop.advance(0)  # the end of the turn y went idle in
    assert x.drops == 0 and list(x.queue) == jobs[1:4]
    loop.advance(0.0016)  # the patrol, 2 ms after the first was packed: x's job ran on
    assert x.dropping


def test_auto_sends_none_ahead_while_jobs_are_long() -> None:
    """A mean past PACK_WAIT / 2: no job goes ahead, none is packed (jobs wait for an
    isolate to free up, and more isolates start)."""
    h, _ = auto_harness(size=3, started=1, job_seconds=0.0006)
    assert (h.s.depth, h.s.room) == (0, 0)
    jobs = [h.submit() for _ in range(3)]
    assert list(h.s.waiting) == jobs[1:] and h.s.sent_ahead == 0
    assert h.grown == h.isolates[1:]


def test_auto_takes_back_jobs_packed_behind_one_that_runs_on(
        ) -> None:
    """Jobs packed behind a job that turns out slow are asked back (a DROP) once it
    has run past PACK_WAIT, by the patrol 2 x PACK_WAIT after they were packed, and
    run on the isolate that was idle; an isolate whose job runs on gets none packed."""
    h, loop = auto_harness(size=2, started=2, job_seconds=0.00005)
    slow, b, c = h.submit(b"slow"), h.submit(b"b"), h.submit(b"c")
    x = next(i for i in h.isolates if i.job is slow)
    y = next(i for i in h.isolates if i is not x)
    assert list(x.queue) == [b, c] and y.state == "idle"
    loop.advance(PACK_WAIT)  # not yet: the patrol comes at 2 x PACK_WAIT
    assert not x.dropping
    late = h.submit(b"late")  # x's job has run PACK_WAIT already: `late` wakes y
    assert y.job is late
    h.answer(y)
    loop.advance(PACK_WAIT)
    assert x.dropping and x.drops == 1
    h.hand_back(x)
    assert {y.job, *y.queue} == {b, c} and not x.queue and x.job is slow
    assert h.s.requeued == 2


def test_auto_starts_an_isolate_for_jobs_packed_behind_one_that_runs_on_when_none_is_idle(
        ) -> None:
    h, loop = auto_harness(size=2, started=1, job_seconds=0.00005)
    x, y = h.isolates
    slow, ahead = h.submit(b"slow"), h.submit(b"ahead")
    assert x.job is slow and list(x.queue) == [ahead] and h.grown == []
    loop.advance(2 * PACK_WAIT)
    assert h.grown == [y] and not x.dropping
    h.s.started(y)  # READY: idle, and at the end of the turn it takes `ahead` back
    loop.advance(0)
    assert x.dropping
    h.hand_back(x)
    assert y.job is ahead


def test_auto_looks_for_an_overrun_only_while_jobs_are_sent_ahead() -> None:
    h, loop = auto_harness(size=2, started=2, job_seconds=0.00005)
    assert h.s.patrol is None  # none was ever packed
    job, ahead = h.submit(), h.submit()
    x = next(i for i in h.isolates if i.job is job)
    assert list(x.queue) == [ahead] and h.s.patrol is not None
    loop.advance(0.00005)
    h.answer(x)
    h.answer(x)
    loop.advance(2 * PACK_WAIT)
    assert h.s.patrol is None and x.drops == 0


DEPTH_OPS = st.lists(st.one_of(
    st.just(("submit", 0)), st.just(("submit", AHEAD_BELOW)),
    st.integers(0, 2).map(lambda i: ("end", i)),
    st.integers(0, 2).map(lambda i: ("back", i)),
    st.sampled_from([0.0, 0.0002, 0.002, 0.01, 0.04]).map(lambda s: ("advance", s))),
    max_size=50)


@settings(max_examples=200, deadline=None)
@given(DEPTH_OPS, st.sampled_from([1, 2, PIPELINE_AUTO]), st.integers(1, 3))
def test_jobs_sent_ahead_run_once_in_the_order_sent_and_keep_their_own_deadlines(
        ops: list[tuple[str, float]], depth: int, size: int) -> None:
    """Model: a guest runs what it was sent in order, one at a time; asked for its
    jobs sent ahead, it hands back all of them at some later point. Whatever was
    submitted (small jobs, and jobs too large to send ahead), answered, handed back
    or timed out around it, every job ends once, no job runs twice, each isolate
    runs its jobs in the order it was sent them (less those it handed back), a job
    not answered by its own deadline (``wall_ms + TIMER_SLACK`` after it was
    submitted) fails then, never later, and a large job is only ever given to an
    idle isolate. With ``pipeline = "auto"`` the same holds as the jobs' mean time
    moves, and jobs are packed and taken back from one whose job runs on."""
    loop = FakeClockLoop(0.0)
    wall_ms = 30
    h = Harness(loop, size=size, started=size, wall_ms=wall_ms,  # type: ignore[arg-type]
                depth=depth, clock=lambda: loop.now)
    if depth == PIPELINE_AUTO:  # short jobs first, one at a time: it packs from the start
        for _ in range(30):  # (7/8)^30 of 1 ms: 1 ms / 18 us - 1 > 32
            runner = h.runner(h.submit())
            assert runner is not None
            h.answer(runner)
        assert h.s.room == AUTO_DEPTH
    due: dict[Job, float] = {}
    ran: dict[FakeIsolate, list[Job]] = {i: [] for i in h.isolates}
    failed_at: dict[Job, float] = {}
    answered_at: dict[Job, float] = {}
    for op, arg in ops:
        if op == "submit":
            job = h.submit(b"x" * int(arg))
            due[job] = loop.now + wall_ms / 1000 + TIMER_SLACK
            job.future.add_done_callback(
                lambda f, job=job: f.exception() is not None and failed_at.setdefault(
                    job, loop.now))
        elif op == "end" and int(arg) < size:
            isolate = h.isolates[int(arg)]
            if isolate.job is not None:
                assert all(isolate.job not in r for r in ran.values()), "ran twice"
                ran[isolate].append(isolate.job)
                if not isolate.job.done:
                    answered_at[isolate.job] = loop.now
                if isolate.stuck:  # a cut job's last frame: as `Isolate._finish`
                    isolate.stuck = False
                    job = isolate.job
                    isolate.job = isolate.queue.popleft() if isolate.queue else None
                    if isolate.job is not None:
                        h.s.begun(isolate, isolate.job)
                    else:
                        h.s.finished(isolate)
                else:
                    h.answer(isolate)
        elif op == "back" and int(arg) < size and h.isolates[int(arg)].dropping:
            h.hand_back(h.isolates[int(arg)])
        elif op == "advance":
            loop.advance(arg)
        for isolate in h.isolates:  # nothing sent ahead to an idle isolate, nor a large job
            assert isolate.state == "busy" or (isolate.job is None and not isolate.queue)
            assert all(len(job.payload) < AHEAD_BELOW for job in isolate.queue)
    loop.advance(wall_ms / 1000 + TIMER_SLACK + 0.01)
    for job, when in due.items():
        assert job.done
        ended = failed_at.get(job, answered_at.get(job))
        assert ended is not None and ended <= when + 1e-9, "ended after its deadline"
    for isolate, jobs in ran.items():  # in the order sent (a subsequence of it)
        sent = iter(isolate.jobs)
        assert all(job in sent for job in jobs)


# -- what `make mutate` found untested (its survivors, 2026-12-06) ------------------------


def test_each_job_gets_its_cpu_watch_when_it_starts_and_loses_it_when_handed_back(
        loop: asyncio.AbstractEventLoop) -> None:
    """The CPU watch counts a job from when it starts on its isolate: at once on an
    idle one, when the one before it ends for one sent ahead (`begun`); a job handed
    back unstarted is no longer watched there (`requeue`), and is watched again where
    it runs next."""
    h = Harness(loop, size=2, started=2, depth=1)
    a, b = h.isolates
    first, second, ahead = h.submit(b"first"), h.submit(b"second"), h.submit(b"ahead")
    assert h.watched == [(b, first), (a, second)]  # `ahead` waits behind `second` on a
    assert list(a.queue) == [ahead] and ahead.isolate is a
    h.answer(a)  # `ahead` starts on a now
    assert h.watched[2:] == [(a, ahead)] and h.unwatched == []
    behind = h.submit(b"behind")  # sent ahead to one of them
    owner = next(i for i in h.isolates if i.queue)
    other = b if owner is a else a
    h.answer(other)
    turn(loop)  # other stays idle: it takes `behind` back
    h.hand_back(owner)
    assert h.unwatched == [(owner, behind)]  # handed back by the isolate it was sent to
    assert h.watched[-1] == (other, behind) and behind.isolate is other


def test_a_retired_pool_runs_a_handed_back_job_on_an_isolate_it_still_has(
        loop: asyncio.AbstractEventLoop) -> None:
    """Only a retired pool with no live isolate fails it (503 ``replaced``, with its
    message); a pool that is not retired keeps it waiting for a new host even with
    every isolate dead."""
    h = Harness(loop, size=2, started=2)
    lost, busy = h.submit(b"lost"), h.submit(b"busy")
    gone, alive = h.runner(lost), h.runner(busy)
    assert gone is not None and alive is not None
    gone.state = "dead"
    h.s.retire()
    h.s.requeue(lost)
    assert not lost.done and list(h.s.waiting) == [lost]  # `alive` runs it next
    h.answer(alive)
    assert alive.job is lost
    h.answer(alive)
    assert lost.future.result().status == 200

    h2 = Harness(loop, size=1, started=1)
    job = h2.submit()
    (only,) = h2.isolates
    only.state = "dead"  # not retired: a new host may come
    h2.s.requeue(job)
    assert not job.done and list(h2.s.waiting) == [job]
    h2.s.retire()
    h2.s.requeue(h2.s.waiting.popleft())
    err = job.future.exception()
    assert isinstance(err, FunctionError) and (err.code, err.status) == ("replaced", 503)
    assert str(err) == ("this version was replaced and its isolate stopped before running "
                        "the request; retry")


def test_a_job_for_a_drained_pool_says_why(loop: asyncio.AbstractEventLoop) -> None:
    h = Harness(loop)
    h.s.retire()
    err = h.submit().future.exception()
    assert str(err) == "this version was replaced while the request was on its way to it; retry"


def test_a_cut_for_cpu_is_a_503_naming_the_limit(loop: asyncio.AbstractEventLoop) -> None:
    h = Harness(loop, size=1, started=1, cpu_ms=40)
    job = h.submit()
    h.s.overran(job)
    err = job.future.exception()
    assert isinstance(err, FunctionError) and (err.code, err.status) == ("cpu_limit", 503)
    assert str(err) == "exceeded its CPU limit of 40 ms"


def test_recycled_interpreters_are_counted_once_each(loop: asyncio.AbstractEventLoop) -> None:
    """`recycled` is the pool's metric of interpreters replaced after their jobs."""
    h = Harness(loop, size=1, started=1, recycle_after=1)
    (only,) = h.isolates
    assert h.s.recycled == 0
    for n in (1, 2):
        h.submit()
        h.answer(only)
        assert only.state == "recycling" and h.s.recycled == n
        h.s.started(only)


def test_a_scheduler_sends_nothing_ahead_unless_told_to(loop: asyncio.AbstractEventLoop) -> None:
    s: Scheduler[FakeIsolate] = Scheduler(10_000, 1000, grow=lambda i: None,
                                          stuck=lambda i, j: None, drained=lambda: None)
    a = FakeIsolate("a")
    s.use(1, [a])
    first, second = Job(loop, b"1"), Job(loop, b"2")
    s.submit(first)
    s.submit(second)
    assert a.jobs == [first] and list(s.waiting) == [second]


def test_only_the_active_hosts_isolates_take_jobs(loop: asyncio.AbstractEventLoop) -> None:
    """Before any host is in use, and after `clear` (the active host died), an isolate
    that says READY or finishes its job takes none of the waiting jobs."""
    s: Scheduler[FakeIsolate] = Scheduler(10_000, 1000, grow=lambda i: None,
                                          stuck=lambda i, j: None, drained=lambda: None)
    early = FakeIsolate("early", generation=1, state="starting")
    waiting = Job(loop, b"w")
    s.submit(waiting)  # no host yet: it waits
    s.started(early)
    assert early.jobs == [] and list(s.waiting) == [waiting]
    s.use(1, [early])
    assert early.jobs == [waiting]

    h = Harness(loop, size=1, started=1)
    (old,) = h.isolates
    h.submit()
    h.s.clear()
    later = h.submit()
    h.answer(old)  # its host is no longer active
    assert old.jobs[-1] is not later and list(h.s.waiting) == [later]


def test_an_isolate_that_goes_idle_before_any_job_looks_for_jobs_to_take_back(
        loop: asyncio.AbstractEventLoop) -> None:
    """A READY before the first request (no loop known yet) idles it quietly."""
    h = Harness(loop, size=2, started=0, depth=1)
    fresh = h.isolates[0]
    fresh.state = "starting"
    h.s.started(fresh)
    assert list(h.s.idle) == [fresh] and not h.s.steal_due


def test_isolates_going_idle_in_one_turn_share_one_look_for_jobs_to_take_back() -> None:
    loop = FakeClockLoop(0.0)
    h = Harness(loop, size=3, started=3, depth=1)  # type: ignore[arg-type]
    for _ in range(4):
        h.submit()
    owner = next(i for i in h.isolates if i.queue)
    others = [i for i in h.isolates if i is not owner]
    loop.ready.clear()
    for isolate in others:
        h.answer(isolate)
    assert len(loop.ready) == 1 and h.s.steal_due  # one `_steal_idle` for both
    loop.advance(0)
    assert not h.s.steal_due and owner.drops == 1


def test_a_deadline_due_within_the_timer_grain_fails_then_rather_than_rearming() -> None:
    """uvloop's timers count whole milliseconds: one may fire a whole TIMER_GRAIN
    early, and the job due then fails then (armed again for the same time, the timer
    fired again and again)."""
    loop = FakeClockLoop(TIMER_GRAIN)
    h = Harness(loop, size=1, started=1, wall_ms=950)  # type: ignore[arg-type]
    job = h.submit()  # due at 0.95 + TIMER_SLACK = 1.0
    loop.advance(0.5)
    assert not job.done
    loop.advance(0.5)
    assert job.done and loop.now == 1.0
    assert isinstance(job.future.exception(), FunctionError)


def test_auto_packs_while_the_mean_is_at_most_half_of_pack_wait() -> None:
    """Jobs of 0.4 ms (under PACK_WAIT / 2): one packed behind the one running (1 ms /
    0.4 ms - 1); jobs of 0.6 ms: none (`test_auto_sends_none_ahead_while_jobs_are_long`)."""
    h, _ = auto_harness(size=2, started=2, job_seconds=0.0004)
    assert (h.s.depth, h.s.room) == (AUTO_DEPTH, 1)
    first, packed, other = h.submit(), h.submit(), h.submit()
    x = next(i for i in h.isolates if i.job is first)
    assert list(x.queue) == [packed] and other.isolate is not x


def test_auto_packs_nothing_onto_an_isolate_that_recycles_after_its_job() -> None:
    h, _ = auto_harness(size=2, started=2, job_seconds=0.00002)
    assert h.s.room == AUTO_DEPTH
    first = h.submit()
    x = next(i for i in h.isolates if i.job is first)
    y = next(i for i in h.isolates if i is not x)
    x.uses = h.s.recycle_after  # its next interpreter starts after this job
    second = h.submit()
    assert not x.queue and y.job is second


def test_auto_patrol_comes_every_two_pack_waits_while_jobs_are_packed() -> None:
    """The patrol is armed once when jobs are packed (not again for each job packed),
    comes 2 x PACK_WAIT later, and again every 2 x PACK_WAIT while any isolate holds
    jobs ahead."""
    h, loop = auto_harness(size=2, started=1, job_seconds=0.00002)
    x, y = h.isolates
    first = h.submit()
    h.submit()
    patrol = h.s.patrol
    assert patrol is not None and list(x.queue) and x.job is first
    h.submit()
    assert h.s.patrol is patrol  # one patrol for all
    start = loop.now
    loop.advance(2 * PACK_WAIT - 1e-6)
    assert h.s.patrol is patrol and not h.grown
    loop.advance(2e-6)  # x's job has run past PACK_WAIT: one more isolate starts for them
    assert h.grown == [y] and h.s.patrol is not patrol and h.s.patrol is not None
    assert h.s.patrol.when == pytest.approx(start + 4 * PACK_WAIT, abs=2e-6)  # type: ignore[attr-defined]


def test_auto_patrol_takes_back_only_from_an_isolate_whose_job_runs_on() -> None:
    """Jobs packed behind a job that started less than PACK_WAIT ago stay, however
    many they are; those behind one that has run past it come back; no isolate starts
    for jobs that are not overdue."""
    h, loop = auto_harness(size=4, started=3, job_seconds=0.0001)
    assert h.s.room == 8  # 1 ms / ~0.1 ms, less the one running, rounded down
    slow = h.submit(b"slow")
    x = next(i for i in h.isolates if i.job is slow)
    x_packed = [h.submit(b"x")]
    assert list(x.queue) == x_packed
    loop.advance(0.0015)  # x's job runs on; a later job on another isolate is fresh
    fresh = h.submit(b"fresh")
    z = next(i for i in h.isolates if i.job is fresh)
    z_packed = [h.submit(b"z") for _ in range(3)]
    assert list(z.queue) == z_packed and z is not x
    y = next(i for i in h.isolates[:3] if i not in (x, z))
    assert y.state == "idle"
    loop.advance(0.0006)  # the patrol (2 ms after the first packing): x is overdue, z not
    assert x.dropping and not z.dropping and z.drops == 0 and not h.grown


def test_auto_patrol_starts_no_isolate_while_no_job_is_overdue() -> None:
    h, loop = auto_harness(size=2, started=1, job_seconds=0.0001)
    x, _ = h.isolates
    first = h.submit()
    h.submit()
    assert x.job is first and len(x.queue) == 1
    loop.advance(0.0015)
    h.answer(x)  # its packed job starts now: not overdue at the patrol (2 ms)
    loop.advance(0.0006)
    assert h.grown == [] and not x.dropping


def test_a_job_handed_back_that_waits_past_its_wall_limit_fails_with_no_isolate_blamed(
        loop: asyncio.AbstractEventLoop) -> None:
    """Handed back, it belongs to no isolate while it waits: cut there, it fails with
    `wall_limit`, no isolate is taken for stuck for it, and the jobs due after it
    still fail at their own limits (the timer goes on)."""
    h = Harness(loop, size=2, started=2, depth=1, wall_ms=30)
    jobs = [h.submit(b"1"), h.submit(b"2")]
    ahead = h.submit(b"ahead")
    owner = next(i for i in h.isolates if i.queue)
    jobs += [ahead, h.submit(b"4")]  # the last ahead to the other one: every place taken
    owner.recycling = True  # (it takes none ahead now)
    owner.dropping = True
    h.hand_back(owner)  # it waits, first in line
    assert list(h.s.waiting) == [ahead] and ahead.isolate is None
    done = loop.run_until_complete(asyncio.wait([j.future for j in jobs], timeout=5))[0]
    assert len(done) == 4
    for job in jobs:
        err = job.future.exception()
        assert isinstance(err, FunctionError) and err.code == "wall_limit"
    assert all(job is not ahead for _, job in h.stuck) and len(h.stuck) == 2
