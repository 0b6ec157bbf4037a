"""Replacing an isolate host that asks for it (its memory cap is running out),
without processes or sockets: the real pool, scheduler and supervisor, with fake
hosts and isolates (the real thing is in tests/test_python.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from edgefn_core.errors import FunctionError
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
        self.isolates = [FakeIsolate(self, n) for n in range(cfg.max_isolates)]
        made.append(self)

    def wait_ready(self) -> None:
        assert self.gate.wait(10)
        for isolate in self.isolates:
            isolate.state = "idle"

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        pass

    def grow(self) -> None:
        pass

    def kill(self) -> None:
        pass

    def fail_jobs(self, why: str) -> list[Job]:
        for isolate in self.isolates:
            if isolate.job is not None:
                isolate.job.fail(FunctionError("crash", 502, why))
                isolate.job = None
        return []

    def close_isolates(self) -> None:
        self.dead = True

    def begin_stop(self) -> None:
        self.close_isolates()

    def finish_stop(self, grace: float = 0) -> None:
        self.stopped = True

    def stop(self, grace: float = 0) -> None:
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
        self.pool: Pool | None = None

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
        pool = w.start(standby=True)
        old, standby = w.made
        fut, _isolate = await w.submit("1")
        w.retire_request(old)
        await until(lambda: pool.hosts.standby is not None)
        made = len(w.made)
        old.died(old, "signal SIGSEGV")  # as `Host.lost` reports it
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
        pool = w.start(standby=True)
        old, _standby = w.made
        fut, isolate = await w.submit("1")
        w.retire_request(old)
        await until(lambda: pool.hosts.standby is not None)
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
