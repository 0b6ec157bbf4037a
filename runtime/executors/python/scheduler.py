"""Which isolate takes a job: the PoP-side scheduling of one function version.

LIFO dispatch (the most recently used isolate is the warmest), a FIFO queue of
jobs waiting when all are busy, scale-up one isolate per waiting job up to the
pool's max, recycling after `recycle_after` jobs, and a generation: only the
isolates of the active host take jobs, and promoting a standby switches the
generation at once. A job handed to an isolate that ended before running it
goes first in line again. The wall-time limit covers waiting, the handler and a
streamed body; `overran` cuts a job its CPU watch (`cpu_watch`) found past
`limits.cpu_ms`, the same way. A retired scheduler takes no new job; those waiting and in flight
still run, and it reports when the last one ends.

Requests sent ahead (`depth`, the manifest's `pool.pipeline`): when no isolate is
idle, a job goes to a busy one with fewer than `depth` jobs sent ahead (the fewest
first) rather than waiting here, so that the guest picks it up without a wake-up
round trip; and a job waiting here goes ahead, oldest first, to the first
isolate with room (`_top_up`). A job of `AHEAD_BELOW` bytes or more never goes
ahead, and none goes ahead past it. Its wall-time limit still runs from when it
was submitted; its CPU watch from when the job before it ends (`begun`). It never
waits longer than it would have here, but for the rest of a loop turn: an isolate
that went idle while none wait and is still idle at the end of that turn takes
back the jobs sent ahead to another (a DROP; those not started come back through
`requeue`, ahead of the waiting ones), and so does a job cut while it runs. (Under load the
requests read in that turn keep it busy: taken back at once, their DROP and its
answer cost each side two wake-ups and delayed them.) A job cut while
sent ahead is taken back too; if it started meanwhile, it is handled as stuck.
An isolate that recycles after its next job gets none sent ahead.

Packed (`PIPELINE_AUTO`, the manifest's default ``pool.pipeline = "auto"``): the
scheduler follows the mean time a job holds its isolate (from its start there to
its last frame). While that mean is at most PACK_WAIT / 2, jobs go ahead (up to
AUTO_DEPTH), and a new job is packed onto the busy isolate with the most sent ahead
that can still finish them within PACK_WAIT (`room` of them) rather than wake an
idle one: a wake-up saved on each side of the hop, at most PACK_WAIT of waiting.
An isolate whose job has run past PACK_WAIT gets none packed, and the jobs packed
behind it are taken back, by an isolate going idle or by a patrol every 2 x PACK_WAIT
while any are sent ahead (which starts one more isolate when none is idle); an
isolate going idle takes back nothing else. Otherwise (longer jobs, and at first)
nothing goes ahead, as with ``pipeline = 0``.

No sockets, processes or threads: isolates are seen through `Worker`, and what
scheduling needs done elsewhere (start an isolate, handle a stuck one, stop the
hosts) goes through the callbacks it is built with.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol, cast

from edgefn_core.errors import FunctionError
from runtime.executors.python.config import PIPELINE_AUTO
from runtime.executors.python.job import Job

# a job this large (its encoded request) is never sent ahead: it waits for an idle
# isolate, so that what an isolate holds unread stays small (at most `depth` of
# these: 2 MiB at the largest `pool.pipeline`), far from the guest's memory limit and
# from `channel.MAX_UNREAD` (32 requests of 16 MiB would pass it: the host killed)
AHEAD_BELOW = 64 << 10
TIMER_SLACK = 0.05  # past wall_ms: the guest's own watchdog should answer first
# how early the deadline timer may fire (uvloop's timers count whole milliseconds): the
# jobs due by then fail with it, rather than the timer being armed again for them
TIMER_GRAIN = 0.001
# `pool.pipeline = "auto"`: jobs go ahead (up to AUTO_DEPTH) while the mean time a job
# holds its isolate is at most PACK_WAIT / 2, and then are packed onto busy isolates
# (below); otherwise none goes ahead. The mean starts at PACK_WAIT (none ahead) and
# follows each job by SERVICE_WEIGHT.
AUTO_DEPTH = 32
PACK_WAIT = 0.001  # the longest a packed job is expected to wait behind its isolate's
SERVICE_WEIGHT = 1 / 8


class Worker(Protocol):
    """An isolate as the scheduler sees it."""

    state: str  # unstarted | starting | idle | busy | recycling | dead
    generation: int  # its host's; only the current generation takes jobs
    uses: int  # jobs since its interpreter started
    recycling: bool  # the guest said it recycles after the job in flight
    stuck: bool  # its job timed out: frames are dropped until that job's last one
    job: Job | None  # the job it runs (or runs next: the one before it ended)
    queue: deque[Job]  # jobs sent ahead, behind `job`
    dropping: bool  # asked to hand back its jobs sent ahead; none is sent ahead meanwhile
    since: float  # when its current job started on it (the scheduler's `clock`)

    def run(self, job: Job) -> None:
        """Send `job` to the guest."""

    def cancel(self, job: Job) -> None:
        """Tell the guest to stop streaming `job`."""

    def drop(self) -> None:
        """Ask the guest for its jobs sent ahead that have not started."""

    def pause(self) -> None:
        """Stop taking frames from the guest (its reader is behind)."""

    def resume(self) -> None:
        """Take frames again."""


class Scheduler[W: Worker]:
    def __init__(self, wall_ms: int, recycle_after: int, *, grow: Callable[[W], None],
                 stuck: Callable[[W, Job], None], drained: Callable[[], None],
                 watch: Callable[[W, Job], None] | None = None, cpu_ms: int = 0,
                 unwatch: Callable[[W, Job], None] | None = None, depth: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`grow(isolate)` starts an unstarted isolate; `stuck(isolate, job)` is told
        when a running job timed out or overran its CPU limit; `drained()` once a
        retired pool has nothing in flight; `watch(isolate, job)` as a job starts
        on an isolate (the CPU watch), `unwatch` when it was handed back unstarted,
        `cpu_ms` the limit it keeps; `depth`: jobs sent ahead to a busy isolate, at
        most, or `PIPELINE_AUTO` (as many as the jobs' mean time allows: `_pack_onto`);
        `clock`: seconds, for the time a job holds its isolate (finer than the
        loop's: uvloop's counts whole milliseconds)."""
        # Global state
        self.wall_ms = wall_ms
        self.recycle_after = recycle_after
        self.clock = clock
        self.auto = depth == PIPELINE_AUTO
        self.depth = 0 if self.auto else depth  # auto: AUTO_DEPTH while jobs are short
        self.service = PACK_WAIT  # mean seconds a job held its isolate (auto only)
        self.room = 0  # auto: jobs a busy isolate is packed up to (0: no packing)
        self.patrol: asyncio.TimerHandle | None = None  # auto: looks for overdue isolates
        self.unwatch = unwatch
        self.grow, self.stuck, self.drained = grow, stuck, drained
        self.watch, self.cpu_ms = watch, cpu_ms
        self.retired = False
        self.reported_drained = False
        self.recycled = 0  # interpreters recycled after their jobs (for the metrics)
        self.sent_ahead = 0  # jobs sent ahead to a busy isolate
        self.requeued = 0  # jobs an isolate handed back unstarted (taken back, or it ended)
        # Per-generation state: the active host's isolates
        self.generation = 0
        self.isolates: Sequence[W] = ()
        self.idle: deque[W] = deque()
        # Per-request state
        self.waiting: deque[Job] = deque()
        self.in_flight = 0
        # Each job's wall-time deadline, in the order submitted, which is the order they
        # fall due (one wall limit for all), with one timer armed for the first: a timer
        # armed and cancelled per request cost ~4 us of the PoP's loop. A job's list is
        # emptied when it ends, so that only a float and an empty list wait for its deadline.
        self.deadlines: deque[tuple[float, list[Job]]] = deque()
        self.timer: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the jobs' (set by `submit`)
        self.steal_due = False  # `_steal_idle` is scheduled for the end of the loop's turn
        self.job_ended = self._job_ended  # each job's `on_end` (one bound method for all)

    # -- generations ----------------------------------------------------------------------------
    def use(self, generation: int, isolates: Sequence[W]) -> None:
        """Serve from `isolates` (a host became active) and give them waiting jobs."""
        self.generation = generation
        self.isolates = isolates
        self.idle = deque(i for i in isolates if i.state == "idle")
        self.drain_waiting()

    def clear(self) -> None:
        """No host is active: jobs wait until `use` is called again."""
        self.generation = 0
        self.isolates = ()
        self.idle.clear()

    # -- jobs -----------------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Run `job` on an idle isolate, or queue it (and start one more isolate if
        the pool has room). It fails with `wall_limit` if it has not ended in time,
        and at once with `replaced` (503) when this retired pool's hosts already
        stopped: a request routed here before a switch that reached its function
        only after an asynchronous stage (it waited on a stopped isolate to its
        wall limit)."""
        if self.reported_drained:
            job.fail(FunctionError("replaced", 503, "this version was replaced while the "
                                   "request was on its way to it; retry"))
            return
        self.in_flight += 1
        loop = self.loop = job.future.get_loop()
        deadlines, entry = self.deadlines, [job]
        while deadlines and not deadlines[0][1]:  # those that ended: nothing to time out
            deadlines.popleft()
        deadlines.append((loop.time() + self.wall_ms / 1000 + TIMER_SLACK, entry))
        if self.timer is None:
            self.timer = loop.call_at(deadlines[0][0], self._expire, loop)
        job.deadline = entry
        job.on_end = self.job_ended
        self._dispatch(job)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        """The first deadline is due: fail the jobs due, then wait for the next one."""
        self.timer = None
        deadlines, due = self.deadlines, loop.time() + TIMER_GRAIN
        while deadlines and (not deadlines[0][1] or deadlines[0][0] <= due):
            _, entry = deadlines.popleft()
            if entry:
                self._timeout(entry[0])
        if deadlines:
            self.timer = loop.call_at(deadlines[0][0], self._expire, loop)

    def _job_ended(self, job: Job) -> None:
        """`job` ended (its `on_end`): nothing of it to time out."""
        if job.deadline is not None:
            job.deadline.clear()
        self.in_flight -= 1
        if self.retired and self.in_flight == 0:
            self._report_drained()

    def _dispatch(self, job: Job, first: bool = False) -> None:
        """Run `job` on the warmest idle isolate, or send it ahead to a busy one, or
        queue it (`first`: ahead of the others); and start one more isolate if the
        pool has room."""
        if (self.room and not self.waiting and job.size < AHEAD_BELOW
                and (busy := self._pack_onto()) is not None):
            self._send_ahead(busy, job)
            if self.patrol is None and self.loop is not None:
                self.patrol = self.loop.call_later(2 * PACK_WAIT, self._patrolled)
            return
        while self.idle:
            isolate = self.idle.pop()  # LIFO: the most recently used isolate is the warmest
            if isolate.state == "idle" and isolate.generation == self.generation:
                self._run(isolate, job)
                return
        if (self.depth and not self.waiting and job.size < AHEAD_BELOW
                and (busy := self._ahead()) is not None):
            self._send_ahead(busy, job)
        elif first:
            self.waiting.appendleft(job)
        else:
            self.waiting.append(job)
        self._scale_up()

    def _ahead(self) -> W | None:
        """The busy isolate to send a job ahead to: of the active host, not stuck,
        not taking back its jobs, not recycling after the ones it has, with the
        fewest sent ahead (under `depth`)."""
        best: W | None = None
        for isolate in self.isolates:
            if self._takes_ahead(isolate) and (best is None
                                               or len(isolate.queue) < len(best.queue)):
                best = isolate
        return best

    def _pack_onto(self) -> W | None:
        """Auto, short jobs (`room`): the busy isolate to pack a job onto rather than
        wake an idle one: the one with the most jobs ahead under `room` whose job has
        not run past PACK_WAIT (a wake-up saved on each side; the job waits behind
        a few short ones instead)."""
        now, limit = self.clock(), min(self.room, self.depth)
        generation, recycle_after = self.generation, self.recycle_after
        best: W | None = None
        most = -1
        for isolate in self.isolates:  # (`_takes_ahead`'s test, inlined: once a request)
            n = len(isolate.queue)
            if (most < n < limit and isolate.state == "busy" and now - isolate.since < PACK_WAIT
                    and not isolate.stuck and not isolate.dropping and not isolate.recycling
                    and isolate.uses < recycle_after and isolate.generation == generation):
                best, most = isolate, n
        return best

    def _patrolled(self) -> None:
        """Auto: jobs packed behind an isolate whose job ran past PACK_WAIT go to an
        idle isolate (a DROP), or one more isolate starts to take them; looked at
        again while any isolate holds jobs ahead."""
        self.patrol = None
        overdue = self.clock() - PACK_WAIT
        if any(i.queue and i.since < overdue and not i.dropping for i in self.isolates):
            if any(i.state == "idle" for i in self.idle):
                self._steal(overdue)
            else:
                self._scale_up()
        if self.loop is not None and any(i.queue for i in self.isolates):
            self.patrol = self.loop.call_later(2 * PACK_WAIT, self._patrolled)

    def _served(self, isolate: W, now: float) -> None:
        """Auto: `isolate`'s job ended at `now` (the scheduler's clock): follow the mean
        time a job holds its isolate, and send jobs ahead (and pack them) only while
        it is short."""
        self.service += (now - isolate.since - self.service) * SERVICE_WEIGHT
        if self.service <= PACK_WAIT / 2:
            self.depth = AUTO_DEPTH
            self.room = min(AUTO_DEPTH, int(PACK_WAIT / max(self.service, 1e-9)) - 1)
        else:
            self.depth = self.room = 0

    def _takes_ahead(self, isolate: W) -> bool:
        """Whether a job may be sent ahead to `isolate`: busy on the active host, with
        room under `depth`, not stuck, not taking back its jobs, not recycling after
        the ones it has."""
        return (isolate.state == "busy" and len(isolate.queue) < self.depth
                and not isolate.stuck and not isolate.dropping and not isolate.recycling
                and isolate.uses < self.recycle_after and isolate.generation == self.generation)

    def _send_ahead(self, isolate: W, job: Job) -> None:
        isolate.uses += 1
        self.sent_ahead += 1
        job.isolate = isolate
        isolate.run(job)

    def _top_up(self, isolate: W) -> None:
        """Send `isolate` (busy) the oldest waiting jobs ahead, up to `depth`: a job
        that waited while every isolate was busy ran only once an isolate went idle,
        each after a wake-up of its own (so with `pool.max = 1` a deep pipeline was
        used only for the jobs that came while none waited). It stops at a job too
        large to send ahead, which waits for an idle isolate (new jobs wait behind
        it: `_dispatch` sends none ahead while any waits)."""
        waiting = self.waiting
        while waiting and self._takes_ahead(isolate):
            if waiting[0].size >= AHEAD_BELOW:
                return
            job = waiting.popleft()
            if not job.done:
                self._send_ahead(isolate, job)

    def requeue(self, job: Job) -> None:
        """`job`'s isolate ended without running it (it was handed the job while its
        interpreter was being replaced, and the fresh one failed to start): another
        isolate takes it, or it waits first in line, its wall-time limit still
        running (it waited on that isolate to its wall limit: a 504). It fails at
        once with `replaced` (503) when this retired pool has no isolate left to run
        it (no new host comes for a retired pool)."""
        if job.done:
            return
        self.requeued += 1
        if job.isolate is not None and self.unwatch is not None:
            self.unwatch(cast(W, job.isolate), job)
        job.isolate = None
        if job.future.done():  # its client went away while it was sent ahead
            job.end()
            return
        if self.retired and all(i.state == "dead" for i in self.isolates):
            job.fail(FunctionError("replaced", 503, "this version was replaced and its "
                                   "isolate stopped before running the request; retry"))
            return
        self._dispatch(job, first=True)

    def _scale_up(self) -> None:
        """Start the next unstarted isolate of the active host, if there is one left."""
        for isolate in self.isolates:
            if isolate.state == "unstarted":
                isolate.state = "starting"
                self.grow(isolate)
                return

    def _run(self, isolate: W, job: Job) -> None:
        isolate.state = "busy"
        isolate.since = self.clock()
        isolate.uses += 1
        job.isolate = isolate
        isolate.run(job)
        if self.watch is not None:
            self.watch(isolate, job)

    def _timeout(self, job: Job) -> None:
        self._cut(job, FunctionError("wall_limit", 504,
                                     f"exceeded its wall-time limit of {self.wall_ms} ms"))

    def overran(self, job: Job) -> None:
        """`job`'s thread ran past the CPU limit, its own watchdog did not stop it:
        fail it (503 ``cpu_limit``) and handle its isolate as stuck."""
        self._cut(job, FunctionError("cpu_limit", 503,
                                     f"exceeded its CPU limit of {self.cpu_ms} ms"))

    def _cut(self, job: Job, error: FunctionError) -> None:
        if job.done:
            return
        isolate = cast(W | None, job.isolate)
        job.fail(error)
        if isolate is not None and isolate.job is not job:  # sent ahead: taken back
            isolate.drop()
        elif isolate is not None:
            isolate.stuck = True  # its own watchdog should stop it; if not, its host goes
            isolate.drop()  # those sent ahead behind it go elsewhere
            self.stuck(isolate, job)

    def begun(self, isolate: W, job: Job) -> None:
        """`job`, sent ahead to `isolate`, is its job now (the one before it ended).
        One cut meanwhile that was not taken back in time is handled as stuck."""
        now = self.clock()
        if self.auto:
            self._served(isolate, now)
        isolate.since = now
        if job.done:
            isolate.stuck = True
            self.stuck(isolate, job)
        elif self.watch is not None:
            self.watch(isolate, job)
        if self.waiting:
            self._top_up(isolate)

    # -- isolates -------------------------------------------------------------------------------
    def started(self, isolate: W) -> None:
        """A fresh interpreter said READY (its first start, or after recycling)."""
        isolate.state = "idle"
        isolate.uses = 0
        self._offer(isolate)

    def finished(self, isolate: W) -> None:
        """Its job reached its last frame: idle again, or recycling (no job until READY)."""
        if isolate.state != "busy":
            return
        if self.auto:
            self._served(isolate, self.clock())
        if isolate.recycling or isolate.uses >= self.recycle_after:
            isolate.recycling = False
            isolate.state = "recycling"
            self.recycled += 1
        else:
            isolate.state = "idle"
            self._offer(isolate)

    def _offer(self, isolate: W) -> None:
        """Give an idle isolate of the active host the oldest waiting job, else idle it."""
        if isolate.generation != self.generation:
            return
        while self.waiting:
            job = self.waiting.popleft()
            if not job.done:
                self._run(isolate, job)
                if self.depth and not any(i.state == "idle" for i in self.idle):
                    self._top_up(isolate)  # (an idle one takes the next waiting job first)
                return
        self.idle.append(isolate)
        if (self.depth or self.auto) and not self.steal_due and self.loop is not None:
            self.steal_due = True
            self.loop.call_soon(self._steal_idle)

    def _steal_idle(self) -> None:
        """At the end of the loop turn an isolate went idle in: each isolate still
        idle takes back the jobs sent ahead to one busy isolate. Most turns under
        load give it a new job first (those read in the same turn), which a DROP
        and its answer (two wake-ups of each side) would only have delayed."""
        self.steal_due = False
        # `idle` holds the active host's isolates (`use` renews it); a DROP answered at
        # once gives one of them a job, and one may have died since it went idle
        for isolate in list(self.idle):
            if isolate.state == "idle":
                self._steal(self.clock() - PACK_WAIT if self.room else None)

    def _steal(self, overdue: float | None = None) -> None:
        """An isolate is idle and no job waits: take back the jobs sent ahead to the
        busy isolate that has the most (they come back through `requeue`); while
        jobs are packed (`room`), only from one whose job started before `overdue`."""
        busiest: W | None = None
        for isolate in self.isolates:
            if isolate.queue and not isolate.dropping and (
                    overdue is None or isolate.since < overdue) and (
                    busiest is None or len(isolate.queue) > len(busiest.queue)):
                busiest = isolate
        if busiest is not None:
            busiest.drop()

    def drain_waiting(self) -> None:
        while self.waiting and self.idle:
            isolate = self.idle.popleft()
            if isolate.state == "idle":
                self._offer(isolate)

    # -- lifecycle ------------------------------------------------------------------------------
    def retire(self) -> None:
        """Take no more jobs (requests go to the new version now); the waiting ones
        still run here, as those in flight do (they failed with a 502 ``crash``: a
        redeploy under load lost requests that had only queued); `drained()` once
        none is left."""
        self.retired = True
        if self.in_flight == 0:
            self._report_drained()

    def _report_drained(self) -> None:
        if not self.reported_drained:
            self.reported_drained = True
            if self.patrol is not None:
                self.patrol.cancel()
                self.patrol = None
            self.drained()
