"""Replacing an isolate host that asks for it (its memory cap is running out),
without processes or sockets: the real pool, scheduler and supervisor, with fake
hosts and isolates (the real thing is in tests/test_python.py)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from edgefn_core.errors import DeployError, FunctionError
from runtime.executors.python import supervisor
from runtime.executors.python.config import HostConfig
from runtime.executors.python.job import Job
from runtime.executors.python.pool import Pool
from runtime.net.message import Response

CFG = HostConfig(name="f", version="1", function_dir="/nonexistent", module="main",
                 handler="handle", cpu_ms=50, wall_ms=5_000, memory_mb=64, recycle_after=1,
                 min_isolates=2, max_isolates=2)


class FakeIsolate:
    def __init__(self, owner: FakeHost, n: int) -> None:
        self.owner = owner
        self.name = f"{owner.generation}.{n}"
        self.generation = owner.generation
        self.state = "starting"
        self.uses = 0
        self.recycling = False
        self.stuck = False
        self.job: Job | None = None
        self.clock = None  # no thread to read: the CPU watch leaves its jobs alone

    def run(self, job: Job) -> None:
        self.job = job

    def cancel(self, job: Job) -> None:
        pass

    def answer(self) -> None:
        """The job's last frame, as `Isolate._finish` handles it."""
        job, self.job = self.job, None
        assert job is not None
        job.respond(Response(200, [], job.payload))
        self.owner.events.finished(self)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return self.name


class FakeHost:
    """Ready at once, unless `gate` holds its start (a host starting slowly)."""

    def __init__(self, made: list[FakeHost], gate: threading.Event, cfg: HostConfig,
                 events: Any, died: Callable[[Any, str], None], *, generation: int,
                 warm_request: bytes, check_imports: bool = False) -> None:
        self.cfg, self.events, self.died, self.generation = cfg, events, died, generation
        self.gate = gate
        self.pid = 1000 + generation
        self.dead = False
        self.retiring = False
        self.stopped = False
        self.killed = 0
        self.unkillable = False  # its start ignores a kill (stuck in the kernel, say)
        self.stops = 0
        self.graces: list[float] = []  # what each `finish_stop` was given
        self.stop_gate: threading.Event | None = None  # holds `stop` while it is clear
        self.check_imports = check_imports
        self.grown = 0
        self.attached: asyncio.AbstractEventLoop | None = None
        self.fails = ""  # why its start fails (a DeployError), if it does
        self.never: list[Job] = []  # what `fail_jobs` hands back as never started
        self.isolates = [FakeIsolate(self, n) for n in range(cfg.max_isolates)]
        made.append(self)
        self.on_made(self)

    @staticmethod
    def on_made(host: FakeHost) -> None:
        """Set per test (`World.each`), before the host is started."""

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 10
        while True:  # held until the gate opens; a host killed meanwhile fails, as a real one
            if self.killed and not self.unkillable:
                raise DeployError("killed while starting")
            if self.gate.wait(0.005):
                break
            assert time.monotonic() < deadline
        if self.fails:
            raise DeployError(self.fails)
        for isolate in self.isolates:
            isolate.state = "idle"

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.attached = loop

    def grow(self) -> None:
        self.grown += 1

    def kill(self) -> None:
        self.killed += 1

    def fail_jobs(self, why: str) -> list[Job]:
        for isolate in self.isolates:
            if isolate.job is not None:
                isolate.job.fail(FunctionError("crash", 502, why))
                isolate.job = None
        never, self.never = self.never, []
        return never

    def close_isolates(self) -> None:
        self.dead = True

    def begin_stop(self) -> None:
        self.close_isolates()

    def finish_stop(self, grace: float = 0) -> None:
        self.graces.append(grace)
        self.stopped = True

    def stop(self, grace: float = 0) -> None:
        self.stops += 1
        if self.stop_gate is not None:
            assert self.stop_gate.wait(10)
            time.sleep(0.05)  # a host's exit, reaped after its stdin closed
        self.begin_stop()
        self.finish_stop()


class World:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made: list[FakeHost] = []
        self.gate = threading.Event()
        self.gate.set()
        monkeypatch.setattr(supervisor, "Host",
                            lambda *a, **kw: FakeHost(self.made, self.gate, *a, **kw))
        monkeypatch.setattr(supervisor, "DRAIN_CHECK", 0.01)
        self.monkeypatch = monkeypatch
        self.pool: Pool | None = None

    def each(self, made: Callable[[FakeHost], None]) -> None:
        """Run `made` on every host made from now on, before it starts."""
        self.monkeypatch.setattr(FakeHost, "on_made", staticmethod(made))

    def fail_starts(self, why: str, *generations: int) -> None:
        """The hosts of these generations fail to start, with `why`."""

        def made(host: FakeHost) -> None:
            if host.generation in generations:
                host.fails = why

        self.each(made)

    def start(self, standby: bool) -> Pool:
        self.pool = Pool(CFG, standby, b"warm")
        self.pool.start()
        self.pool.activate()
        return self.pool

    async def submit(self, tag: str) -> tuple[asyncio.Future[Response], FakeIsolate]:
        """A job, and the isolate it runs on (there must be an idle one)."""
        assert self.pool is not None
        fut = asyncio.ensure_future(self.pool.submit(tag.encode()))
        await asyncio.sleep(0)
        isolate = self.running(tag)
        assert isolate is not None, f"{tag} is waiting"
        return fut, isolate

    def running(self, tag: str) -> FakeIsolate | None:
        for host in self.made:
            for isolate in host.isolates:
                if isolate.job is not None and isolate.job.payload == tag.encode():
                    return isolate
        return None

    async def replaced(self) -> tuple[Pool, FakeHost, FakeHost, asyncio.Future[Response],
                                      FakeIsolate]:
        """A pool with a standby whose active host asked to be replaced while job "1"
        ran there: the standby took over and a new standby is warm. (The pool, the
        old host, the one active now, job "1"'s future, its isolate.)"""
        pool = self.start(standby=True)
        old, standby = self.made
        fut, isolate = await self.submit("1")
        self.retire_request(old)
        await until(lambda: pool.hosts.standby is not None)
        return pool, old, standby, fut, isolate

    def retire_request(self, host: FakeHost) -> None:
        """Its host's RETIRE frame, as `Isolate.frame` passes it on."""
        assert self.pool is not None
        self.pool.retiring(host.isolates[0], "low on room")  # type: ignore[arg-type]


async def until(check: Callable[[], bool], within: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.005)


@pytest.fixture
def run() -> Iterator[Callable[[Coroutine[Any, Any, None]], None]]:
    loop = asyncio.new_event_loop()
    yield loop.run_until_complete
    loop.close()


def test_a_standby_takes_over_at_once_and_the_old_host_stops_after_its_jobs(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    w = World(monkeypatch)

    async def scenario() -> None:
        pool = w.start(standby=True)
        old, standby = w.made
        fut1, on_old = await w.submit("1")
        assert on_old.owner is old
        w.retire_request(old)
        fut2, on_new = await w.submit("2")  # at once, on the standby
        assert on_new.owner is standby and pool.hosts.active is standby
        await asyncio.sleep(0.05)
        assert not old.stopped  # its job is still in flight
        on_old.answer()
        on_new.answer()
        assert (await fut1).body == b"1" and (await fut2).body == b"2"
        await until(lambda: old.stopped)
        await until(lambda: pool.hosts.standby is not None)  # a new standby, warm
        assert len(w.made) == 3 and pool.hosts.standby is w.made[2]
        assert not pool.hosts.draining
        pool.close()

    run(scenario())


def test_without_a_standby_the_old_host_serves_until_a_new_one_is_warm(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    w = World(monkeypatch)

    async def scenario() -> None:
        pool = w.start(standby=False)
        (old,) = w.made
        w.gate.clear()  # the replacement starts slowly
        fut1, first = await w.submit("1")
        w.retire_request(old)
        w.retire_request(old)  # asked twice: still one replacement
        await until(lambda: len(w.made) == 2)
        fut2, second = await w.submit("2")  # meanwhile the old host keeps serving
        assert first.owner is old and second.owner is old
        first.answer()
        assert (await fut1).body == b"1"
        w.gate.set()
        new = w.made[1]
        await until(lambda: pool.hosts.active is new)
        fut3, third = await w.submit("3")
        assert third.owner is new
        assert not old.stopped  # "2" is still in flight there
        second.answer()
        third.answer()
        assert [(await f).body for f in (fut2, fut3)] == [b"2", b"3"]
        await until(lambda: old.stopped)
        await asyncio.sleep(0.05)
        assert len(w.made) == 2 and pool.hosts.standby is None  # no standby wanted
        pool.close()

    run(scenario())


def test_jobs_queued_while_the_old_host_has_no_room_run_on_the_new_one(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    w = World(monkeypatch)

    async def scenario() -> None:
        pool = w.start(standby=False)
        (old,) = w.made
        w.gate.clear()
        w.retire_request(old)
        for isolate in old.isolates:  # recycled, and out of room: never READY again
            isolate.state = "recycling"
        assert pool.hosts.active is old
        waiting = asyncio.ensure_future(pool.submit(b"w"))
        await asyncio.sleep(0.02)
        assert w.running("w") is None
        w.gate.set()
        await until(lambda: w.running("w") is not None)
        isolate = w.running("w")
        assert isolate is not None and isolate.owner is w.made[1]
        isolate.answer()
        assert (await waiting).body == b"w"
        await until(lambda: old.stopped)
        pool.close()

    run(scenario())


def test_a_host_that_dies_while_draining_is_not_replaced_again(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    w = World(monkeypatch)

    async def scenario() -> None:
        pool, old, standby, fut, _isolate = await w.replaced()
        made = len(w.made)
        old.died(old, "signal SIGSEGV")  # as `Host.lost` reports it
        assert not pool.hosts.draining  # at once, not at the next drain check
        with pytest.raises(FunctionError):
            await fut
        await asyncio.sleep(0.05)
        assert len(w.made) == made and pool.hosts.active is standby
        assert not pool.hosts.draining
        pool.close()

    run(scenario())


def test_retiring_the_pool_stops_a_draining_host_too(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    w = World(monkeypatch)

    async def scenario() -> None:
        pool, old, _standby, fut, isolate = await w.replaced()
        pool.retire()
        assert not old.stopped
        isolate.answer()
        assert (await fut).body == b"1"
        await until(lambda: all(h.stopped for h in w.made))

    run(scenario())


def test_a_stuck_host_is_drained_never_kept_as_the_standby(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    """The stuck host was swapped in as the standby: a second stuck request made it
    active again, and the requests after it died with it when it was killed (502)."""
    w = World(monkeypatch)

    async def scenario() -> None:
        pool = w.start(standby=True)
        first, standby = w.made
        fut1, stuck1 = await w.submit("1")
        assert stuck1.job is not None
        pool.hosts.stuck(stuck1, stuck1.job)  # as the scheduler does past wall_ms
        assert pool.hosts.active is standby and first in pool.hosts.draining
        assert first.retiring is True  # (`Pool._restarting`: its jobs' CPU watch excuses it)
        await until(lambda: pool.hosts.standby is not None)
        fut2, stuck2 = await w.submit("2")
        assert stuck2.owner is standby and stuck2.job is not None
        pool.hosts.stuck(stuck2, stuck2.job)
        assert pool.hosts.active not in (first, standby)  # the fresh one
        fut3, on = await w.submit("3")
        assert on.owner is pool.hosts.active and on.owner not in (first, standby)
        on.answer()
        assert (await fut3).body == b"3"
        for f in (fut1, fut2):
            f.cancel()
        pool.close()

    run(scenario())


def test_a_standby_that_cannot_start_fails_the_start_and_stops_the_active_host(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The deploy fails (its error is the standby's); the active host, started first
    and the only one to check the function's imports, is stopped, not left running."""
    w = World(monkeypatch)
    w.fail_starts("no room for a standby", 2)
    with pytest.raises(DeployError, match="no room for a standby"):
        Pool(CFG, True, b"warm").start()
    active, standby = w.made
    assert active.stopped and active.stops == 1 and not standby.stopped
    assert (active.check_imports, standby.check_imports) == (True, False)

    w = World(monkeypatch)
    Pool(CFG, False, b"warm").start()  # no standby wanted: one host
    assert len(w.made) == 1 and not w.made[0].stopped


def test_a_host_made_while_closing_is_killed_before_it_is_waited_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    w = World(monkeypatch)
    pool = Pool(CFG, False, b"warm")
    pool.start()
    pool.hosts.closing = True  # `close` looked at the hosts starting just before
    with pytest.raises(DeployError, match="killed while starting"):
        pool.hosts._spawn()
    assert w.made[-1].killed == 1 and not pool.hosts.starting
    assert w.made[0].killed == 0


def test_only_the_active_host_grows(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    w = World(monkeypatch)

    async def scenario() -> None:
        pool = w.start(standby=True)
        active, standby = w.made
        assert active.attached is standby.attached is asyncio.get_running_loop()
        pool.hosts.grow(standby.isolates[0])  # type: ignore[arg-type]
        assert (active.grown, standby.grown) == (0, 0)
        pool.hosts.grow(active.isolates[1])  # type: ignore[arg-type]
        assert (active.grown, standby.grown) == (1, 0)
        pool.close()

    run(scenario())


def test_a_stuck_isolate_s_host_is_killed_after_the_grace_unless_its_job_ended(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None],
        caplog: pytest.LogCaptureFixture) -> None:
    """Without a standby the stuck host keeps serving (nothing to swap to); past
    `KILL_GRACE` it is killed if the isolate still runs that job, not if the job
    ended, nor for an isolate already dead."""
    monkeypatch.setattr(supervisor, "KILL_GRACE", 0.25)
    w = World(monkeypatch)

    async def scenario() -> None:
        pool = w.start(standby=False)
        (host,) = w.made
        fut1, stuck = await w.submit("1")
        assert stuck.job is not None
        pool.hosts.stuck(stuck, stuck.job)  # type: ignore[arg-type]
        assert pool.hosts.active is host and not pool.hosts.draining and len(w.made) == 1
        await asyncio.sleep(0.1)
        assert host.killed == 0  # not before the grace
        await until(lambda: host.killed == 1)
        fut2, ends = await w.submit("2")
        assert ends.job is not None
        pool.hosts.stuck(ends, ends.job)  # type: ignore[arg-type]
        ends.answer()  # within the grace
        assert (await fut2).body == b"2"
        job = stuck.job
        assert job is not None
        pool.hosts.stuck(stuck, job)  # type: ignore[arg-type]
        stuck.state = "dead"  # its host went meanwhile
        await asyncio.sleep(0.4)
        assert host.killed == 1 and len(w.made) == 1
        fut1.cancel()
        pool.close()

    with caplog.at_level(logging.WARNING, logger="edgefn.isolates"):
        run(scenario())
    assert [r.getMessage() for r in caplog.records] == [
        "f@1: isolate stuck in native code past its limit; restarting its host"]


def test_a_stuck_isolate_of_the_standby_or_a_retired_pool_swaps_nothing(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    monkeypatch.setattr(supervisor, "KILL_GRACE", 0.01)
    w = World(monkeypatch)

    async def scenario() -> None:
        pool = w.start(standby=True)
        active, standby = w.made
        fut, stuck = await w.submit("1")
        assert stuck.job is not None
        pool.hosts.stuck(standby.isolates[0], stuck.job)  # type: ignore[arg-type]
        assert pool.hosts.active is active and pool.hosts.standby is standby
        pool.scheduler.retired = True  # a retired pool swaps to no standby either
        pool.hosts.stuck(stuck, stuck.job)  # type: ignore[arg-type]
        assert pool.hosts.active is active and pool.hosts.standby is standby
        assert not pool.hosts.draining
        await until(lambda: active.killed == 1)  # its own isolate: killed past the grace
        assert standby.killed == 0 and len(w.made) == 2
        fut.cancel()
        pool.close()

    run(scenario())


def test_an_active_host_that_dies_hands_over_to_the_standby_and_requeues_what_never_ran(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None],
        caplog: pytest.LogCaptureFixture) -> None:
    """Its jobs in flight fail (502), the standby takes new jobs at once, a new
    standby starts; the jobs it was sent but never started go back in line, the
    first sent first (each to the front, last first), and run on the new active."""
    w = World(monkeypatch)

    async def scenario() -> None:
        pool = w.start(standby=True)
        old, standby = w.made
        requeued: list[bytes] = []
        requeue = pool.scheduler.requeue

        def record(job: Job) -> None:
            requeued.append(job.payload)
            requeue(job)

        monkeypatch.setattr(pool.scheduler, "requeue", record)
        fut1, _running = await w.submit("1")
        fut2, sent = await w.submit("2")
        job2 = sent.job
        assert job2 is not None
        sent.job = None  # as if sent behind another and not started
        old.never = [job2]
        old.died(old, "signal SIGSEGV")  # as `Host.lost` reports it
        with pytest.raises(FunctionError, match="signal SIGSEGV"):
            await fut1
        assert pool.hosts.active is standby and old.stopped
        assert requeued == [b"2"] and pool.hosts.crashed == 1
        on = w.running("2")
        assert on is not None and on.owner is standby
        on.answer()
        assert (await fut2).body == b"2"
        await until(lambda: pool.hosts.standby is not None)
        assert pool.hosts.standby is w.made[2] and pool.hosts.replacements == 1

        # the order back in line: the last handed back first, each to the front
        requeued.clear()
        jobs = [Job(asyncio.get_running_loop(), tag) for tag in (b"a", b"b", b"c")]
        standby.never = list(jobs)
        standby.died(standby, "signal SIGKILL")
        assert requeued == [b"c", b"b", b"a"]
        assert pool.hosts.crashed == 2 and pool.hosts.replacements == 2
        assert pool.hosts.active is w.made[2]
        await until(lambda: pool.hosts.standby is not None)
        assert pool.hosts.standby is w.made[3]
        assert w.made[3].attached is asyncio.get_running_loop()  # its sockets read
        for job in jobs:
            job.future.cancel()
        pool.close()

    with caplog.at_level(logging.WARNING, logger="edgefn.isolates"):
        run(scenario())
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING][:1] == [
        "f@1: isolate host 1001 died (signal SIGSEGV)"]


def test_without_a_standby_jobs_wait_for_the_replacement_of_a_dead_host(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    w = World(monkeypatch)

    async def scenario() -> None:
        pool = w.start(standby=False)
        (old,) = w.made
        w.gate.clear()  # the replacement starts slowly
        old.died(old, "signal SIGKILL")
        assert pool.hosts.active is None and pool.hosts.crashed == 1
        waiting = asyncio.ensure_future(pool.submit(b"w"))
        await asyncio.sleep(0.02)
        assert w.running("w") is None  # no host to run it on yet
        w.gate.set()
        await until(lambda: w.running("w") is not None)
        on = w.running("w")
        assert on is not None and on.owner is w.made[1] is pool.hosts.active
        on.answer()
        assert (await waiting).body == b"w"
        await asyncio.sleep(0.05)
        assert len(w.made) == 2 and pool.hosts.standby is None
        pool.close()

    run(scenario())


def test_a_dead_standby_is_replaced_and_the_active_host_keeps_serving(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    w = World(monkeypatch)

    async def scenario() -> None:
        pool = w.start(standby=True)
        active, standby = w.made
        standby.died(standby, "signal SIGKILL")
        assert pool.hosts.active is active and standby.stopped
        await until(lambda: pool.hosts.standby is not None)
        assert pool.hosts.standby is w.made[2] and len(w.made) == 3
        fut, on = await w.submit("1")
        assert on.owner is active
        on.answer()
        assert (await fut).body == b"1"
        pool.close()

    run(scenario())


def test_a_host_that_dies_after_the_pool_retired_or_while_closing_is_not_replaced(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    w = World(monkeypatch)

    async def scenario() -> None:
        pool = w.start(standby=True)
        active, standby = w.made
        pool.retire()  # nothing in flight: its hosts stop
        await until(lambda: active.stopped and standby.stopped)
        active.died(active, "signal SIGKILL")
        await asyncio.sleep(0.05)
        assert len(w.made) == 2 and pool.hosts.crashed == 1

        w2 = World(monkeypatch)
        pool2 = w2.start(standby=False)
        pool2.hosts.closing = True  # a PoP shutting down: its hosts die, no crash counted
        w2.made[0].died(w2.made[0], "signal SIGTERM")
        assert pool2.hosts.crashed == 0
        pool2.close()

    run(scenario())


def test_a_standby_that_asks_to_be_replaced_is_replaced_once(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None],
        caplog: pytest.LogCaptureFixture) -> None:
    """Its RETIRE: drained (it has no jobs: stopped at once) and a new standby
    started; asked again, or by a retired pool, nothing more happens. The active
    host's RETIRE is logged the same way."""
    w = World(monkeypatch)

    async def scenario() -> None:
        pool = w.start(standby=True)
        active, standby = w.made
        pool.retiring(standby.isolates[0], "low on room")  # type: ignore[arg-type]
        pool.retiring(standby.isolates[1], "low on room")  # type: ignore[arg-type]
        assert pool.hosts.active is active
        await until(lambda: standby.stopped and pool.hosts.standby is not None)
        await asyncio.sleep(0.05)
        assert len(w.made) == 3 and pool.hosts.standby is w.made[2]
        pool.scheduler.retired = True
        w.retire_request(active)
        w.retire_request(w.made[2])
        await asyncio.sleep(0.05)
        assert len(w.made) == 3 and not active.retiring and pool.hosts.active is active
        pool.scheduler.retired = False
        w.retire_request(active)
        assert pool.hosts.active is w.made[2]
        await until(lambda: active.stopped)
        pool.close()

    with caplog.at_level(logging.INFO, logger="edgefn.isolates"):
        run(scenario())
    assert [r.getMessage() for r in caplog.records if r.name == "edgefn.isolates"] == [
        "f@1: replacing standby isolate host 1002 (low on room)",
        "f@1: replacing isolate host 1001 (low on room)"]


def test_a_replacement_that_cannot_start_is_tried_again_while_the_active_host_retires(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None],
        caplog: pytest.LogCaptureFixture) -> None:
    """Logged; retried after `RESPAWN_DELAY` while the active host still waits for a
    successor (it serves meanwhile), not for a standby nobody waits on."""
    monkeypatch.setattr(supervisor, "RESPAWN_DELAY", 0.3)
    w = World(monkeypatch)
    w.fail_starts("out of memory", 2, 4)

    async def scenario() -> None:
        pool = w.start(standby=False)
        (old,) = w.made
        w.retire_request(old)
        await until(lambda: len(w.made) == 2)
        await asyncio.sleep(0.1)
        assert len(w.made) == 2 and pool.hosts.active is old  # not before the delay
        await until(lambda: pool.hosts.active is not old)
        assert pool.hosts.active is w.made[2]
        await until(lambda: old.stopped)

        w2 = World(monkeypatch)
        w2.fail_starts("out of memory", 3)
        pool2 = w2.start(standby=True)
        w2.made[1].died(w2.made[1], "signal SIGKILL")  # its standby: the new one fails
        await until(lambda: len(w2.made) == 3)
        await asyncio.sleep(0.5)
        assert len(w2.made) == 3 and pool2.hosts.standby is None  # not tried again
        pool.close()
        pool2.close()

    with caplog.at_level(logging.ERROR, logger="edgefn.isolates"):
        run(scenario())
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        "f: cannot restart its isolate host: out of memory"] * 2


def test_stopping_the_hosts_stops_each_once_and_closing_kills_those_starting(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None],
        caplog: pytest.LogCaptureFixture) -> None:
    w = World(monkeypatch)

    async def scenario() -> None:
        pool = w.start(standby=True)
        active, standby = w.made
        pool.hosts.stop_hosts()
        pool.hosts.stop_hosts()
        supervisor.wait_stopped(5)
        assert not supervisor.stopping()
        assert (active.stops, standby.stops) == (1, 1)

        w2 = World(monkeypatch)
        pool2 = w2.start(standby=True)
        first, second = w2.made
        w2.gate.clear()
        second.died(second, "signal SIGKILL")  # its replacement is held starting
        await until(lambda: len(w2.made) == 3)
        starting = w2.made[2]
        await asyncio.to_thread(pool2.close)  # blocks: off the loop's thread
        assert starting.killed == 1 and first.stopped and not starting.stopped
        assert pool2.hosts.standby is None

    with caplog.at_level(logging.ERROR, logger="edgefn.isolates"):
        run(scenario())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # closing: no error


def test_a_dead_host_whose_replacement_cannot_start_is_tried_again_until_one_does(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    """No standby, the active host died, and its replacement failed to start: the
    function had no host until its next deploy (its requests waited to their wall
    limit). Now the start is tried again after `RESPAWN_DELAY` until one is up, and
    the request waiting meanwhile runs there. Not once the pool retired."""
    monkeypatch.setattr(supervisor, "RESPAWN_DELAY", 0.1)
    w = World(monkeypatch)
    w.fail_starts("cannot fork", 2, 3)

    async def scenario() -> None:
        pool = w.start(standby=False)
        (old,) = w.made
        old.died(old, "signal SIGKILL")
        waiting = asyncio.ensure_future(pool.submit(b"w"))
        await until(lambda: w.running("w") is not None)
        on = w.running("w")
        assert on is not None and on.owner is w.made[3] is pool.hosts.active
        assert len(w.made) == 4  # two failed starts, then this one
        on.answer()
        assert (await waiting).body == b"w"

        w2 = World(monkeypatch)
        w2.fail_starts("cannot fork", 2)
        pool2 = w2.start(standby=False)
        w2.made[0].died(w2.made[0], "signal SIGKILL")
        await until(lambda: len(w2.made) == 2)
        pool2.retire()  # during the delay: no more tries
        await asyncio.sleep(0.3)
        assert len(w2.made) == 2
        pool.close()
        pool2.close()

    run(scenario())


def test_a_retiring_host_s_failed_successor_is_not_tried_again_once_the_pool_retired(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    monkeypatch.setattr(supervisor, "RESPAWN_DELAY", 0.1)
    w = World(monkeypatch)
    w.fail_starts("cannot fork", 2)

    async def scenario() -> None:
        pool = w.start(standby=False)
        (old,) = w.made
        w.retire_request(old)
        await until(lambda: len(w.made) == 2)
        await asyncio.sleep(0.02)
        pool.retire()  # within the delay
        await asyncio.sleep(0.3)
        assert len(w.made) == 2
        pool.close()

    run(scenario())


def test_a_host_that_starts_after_it_is_needed_is_stopped_not_kept(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    """A spawn that lands when the pool retired meanwhile, when a standby is already
    there, or for a pool that wants none, is stopped (and never reads its sockets)."""
    w = World(monkeypatch)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()

        def landing(pool: Pool, generation: int) -> FakeHost:
            host = FakeHost(w.made, w.gate, CFG, pool, pool.hosts.host_died,
                            generation=generation, warm_request=b"")
            host.wait_ready()
            pool.hosts.pending += 1  # as `_replace` counts a spawn
            pool.hosts._landed(host)  # type: ignore[arg-type]
            return host

        with_standby = w.start(standby=True)
        active, standby = w.made
        extra = landing(with_standby, 50)
        await asyncio.to_thread(supervisor.wait_stopped, 5)
        assert extra.stopped and with_standby.hosts.standby is standby
        assert with_standby.hosts.active is active and with_standby.hosts.pending == 0

        without = Pool(CFG, False, b"warm")
        without.start()
        without.activate()
        extra = landing(without, 51)
        await asyncio.to_thread(supervisor.wait_stopped, 5)
        assert extra.stopped and without.hosts.standby is None

        with_standby.scheduler.retired = True  # retired while it started
        late = landing(with_standby, 52)
        await asyncio.to_thread(supervisor.wait_stopped, 5)
        assert late.stopped and late.attached is None
        assert with_standby.hosts.standby is standby and standby.attached is loop
        with_standby.close()
        without.close()

    run(scenario())


def test_two_starts_in_flight_end_with_one_active_and_one_standby(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    """The standby died (its replacement starting) and then the active host asked
    to be replaced: two starts in flight. The first to land becomes the active, the
    second the standby, and no third is started."""
    w = World(monkeypatch)

    async def scenario() -> None:
        pool = w.start(standby=True)
        old, standby = w.made
        w.gate.clear()
        standby.died(standby, "signal SIGKILL")
        w.retire_request(old)
        await until(lambda: len(w.made) == 4)
        assert pool.hosts.pending == 2 and pool.hosts.active is old
        w.gate.set()
        await until(lambda: pool.hosts.standby is not None and pool.hosts.active is not old)
        await until(lambda: old.stopped)
        await asyncio.sleep(0.05)
        assert {pool.hosts.active, pool.hosts.standby} == {w.made[2], w.made[3]}
        assert len(w.made) == 4 and pool.hosts.pending == 0
        pool.close()

    run(scenario())


def test_a_draining_host_stops_as_its_last_job_ends_or_at_a_drain_check(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    """Told by the job's end (no wait for the next check: `DRAIN_CHECK` is long
    here); a job that ended otherwise (cut by its wall limit: no last frame) is
    found by the check."""
    w = World(monkeypatch)

    async def scenario() -> None:
        monkeypatch.setattr(supervisor, "DRAIN_CHECK", 30.0)
        pool = w.start(standby=True)
        old, _standby = w.made
        fut1, on_old = await w.submit("1")
        fut2, other = await w.submit("2")
        w.retire_request(old)
        await until(lambda: pool.hosts.standby is not None)
        assert old in pool.hosts.draining
        # a job of another host ending tells nothing about this one
        fut3, on_new = await w.submit("3")
        on_new.answer()
        on_old.answer()
        await asyncio.sleep(0.05)
        assert not old.stopped  # "2" still runs there
        other.answer()
        await until(lambda: old.stopped, within=1.0)
        assert [(await f).body for f in (fut1, fut2, fut3)] == [b"1", b"2", b"3"]

        monkeypatch.setattr(supervisor, "DRAIN_CHECK", 0.02)
        current = pool.hosts.active
        assert current is not None
        fut4, on = await w.submit("4")
        w.retire_request(current)  # type: ignore[arg-type]
        assert current in pool.hosts.draining
        job = on.job
        assert job is not None
        job.fail(FunctionError("wall_limit", 504, "past its limit"))  # no last frame
        await until(lambda: current.stopped, within=1.0)  # type: ignore[attr-defined]
        with pytest.raises(FunctionError):
            await fut4
        pool.close()

    run(scenario())


def test_a_draining_host_s_retire_request_changes_nothing(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    w = World(monkeypatch)

    async def scenario() -> None:
        pool, old, standby, fut, on_old = await w.replaced()
        new_standby = pool.hosts.standby
        w.retire_request(old)  # again, from the host being drained
        assert pool.hosts.active is standby and pool.hosts.standby is new_standby
        await asyncio.sleep(0.05)
        assert len(w.made) == 3
        on_old.answer()
        assert (await fut).body == b"1"
        pool.close()

    run(scenario())


def test_its_threads_never_hold_the_pop_s_exit_and_stopping_is_waited_for(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    """The spawn and stop threads are daemons (a host stuck starting or stopping
    must not keep the PoP's process alive), the spawn one named for `py-spy`;
    `stopping()` says a stop is under way and `wait_stopped` waits for it, up to its
    timeout."""
    w = World(monkeypatch)

    async def scenario() -> None:
        pool = w.start(standby=True)
        active, standby = w.made
        w.gate.clear()
        standby.died(standby, "signal SIGKILL")
        await until(lambda: len(w.made) == 3)
        (spawn,) = [t for t in threading.enumerate() if t.name == "edgefn-host-spawn"]
        assert spawn.daemon
        gate = threading.Event()
        active.stop_gate = gate
        before = set(threading.enumerate())
        pool.retire()  # nothing in flight: its hosts stop, on threads of their own
        await until(lambda: active.stops == 1)
        stoppers = set(threading.enumerate()) - before
        assert stoppers and all(t.daemon for t in stoppers)
        assert supervisor.stopping()
        started = time.monotonic()
        await asyncio.to_thread(supervisor.wait_stopped, 0.2)
        assert 0.15 < time.monotonic() - started < 1.0 and supervisor.stopping()
        gate.set()
        await asyncio.to_thread(supervisor.wait_stopped, 5)
        assert not supervisor.stopping() and active.stopped
        w.gate.set()
        await asyncio.to_thread(supervisor.wait_stopped, 5)
        pool.close()

    run(scenario())


def test_closing_gives_each_host_the_grace_and_does_not_wait_out_a_stuck_start(
        monkeypatch: pytest.MonkeyPatch, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    monkeypatch.setattr(supervisor, "READY_TIMEOUT", 0.2)
    w = World(monkeypatch)

    async def scenario() -> None:
        pool = w.start(standby=True)
        active, standby = w.made
        w.gate.clear()
        w.each(lambda host: setattr(host, "unkillable", True))
        standby.died(standby, "signal SIGKILL")
        await until(lambda: len(w.made) == 3)
        started = time.monotonic()
        await asyncio.to_thread(pool.close)
        assert time.monotonic() - started < 1.5  # its spawn waited for up to READY_TIMEOUT
        assert w.made[2].killed == 1 and not w.made[2].stopped
        (grace,) = active.graces
        assert 0 < grace <= supervisor.STOP_GRACE
        w.gate.set()

    run(scenario())
