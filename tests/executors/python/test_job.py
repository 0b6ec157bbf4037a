"""A job's future and its ending: what a client going away does to its job
(runtime/executors/python/job.py `JobFuture`, `Job._cancelled`)."""

from __future__ import annotations

import asyncio

import uvloop

from runtime.executors.python import wire
from runtime.executors.python.job import Job
from runtime.net.message import Response


class Runner:
    """The isolate a job runs on, recording what it is told."""

    def __init__(self) -> None:
        self.cancelled: list[Job] = []

    def cancel(self, job: Job) -> None:
        self.cancelled.append(job)

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass


def test_a_cancelled_job_no_isolate_has_yet_ends_at_once() -> None:
    """Waiting in its scheduler's queue, it ends in the cancel (`on_end`: its
    scheduler counts it out and skips it), and is never sent."""
    async def main() -> None:
        ended: list[Job] = []
        job = Job(asyncio.get_running_loop(), b"req")
        job.on_end = ended.append
        assert job.future.cancel() is True
        assert job.done and ended == [job]

    asyncio.run(main())


def test_a_cancelled_future_stops_what_the_job_left_running_and_tells_its_isolate() -> None:
    """Cancelling a job's future (`connection_lost`, or the task awaiting it
    cancelled) undoes its host calls' leftovers and tells its isolate at once, in
    the cancel itself, once; a job already ended, or a future already answered,
    tells no one."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        runner, undone = Runner(), []
        job = Job(loop, b"req")
        job.isolate = runner
        job.cleanups.append(lambda: undone.append("fetch"))
        assert job.future.cancel() is True
        assert undone == ["fetch"] and runner.cancelled == [job]  # at once, not next turn
        assert job.future.cancel() is False  # a second cancel: nothing more
        await asyncio.sleep(0)
        assert undone == ["fetch"] and runner.cancelled == [job]

        answered = Job(loop, b"req")
        answered.isolate = runner
        answered.respond(Response(200, [], b"ok"))
        assert answered.future.cancel() is False and runner.cancelled == [job]

        ended = Job(loop, b"req")  # ended (failed and cut) with its future still open
        ended.isolate = runner
        ended.end()
        assert ended.future.cancel() is True and runner.cancelled == [job]

        # a task awaiting the future, cancelled: the job is told through it
        waited = Job(loop, b"req")
        waited.isolate = runner
        task = asyncio.ensure_future(waited.future)
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.sleep(0)
        assert task.cancelled() and runner.cancelled == [job, waited]

    uvloop.run(main())


def test_a_job_holds_its_request_as_the_frame_the_isolate_reads() -> None:
    """`Job` frames an encoded request once (`wire.frame`); one framed already (the
    native lane's) is kept as it is; its size is the encoded request's."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        job = Job(loop, b"abc")
        assert job.frame == wire.frame(wire.REQUEST, b"abc") and job.size == 3
        assert job.payload == b"abc" and not job.raw
        framed = Job(loop, wire.frame(wire.REQUEST, b"abcd"), framed=True, raw=True)
        assert framed.frame == wire.frame(wire.REQUEST, b"abcd") and framed.size == 4
        assert framed.payload == b"abcd" and framed.raw

    uvloop.run(main())


class Paused(Runner):
    """A runner that records the pauses and resumes backpressure asks of it."""

    def __init__(self) -> None:
        super().__init__()
        self.told: list[str] = []

    def pause(self) -> None:
        self.told.append("pause")

    def resume(self) -> None:
        self.told.append("resume")


def streamed(loop: asyncio.AbstractEventLoop) -> tuple[Job, Paused]:
    job = Job(loop, b"req")
    runner = job.isolate = Paused()
    return job, runner


def test_a_stream_reaches_its_reader_in_order_and_ends() -> None:
    """The head answers the future (a `Response` whose body iterates the chunks);
    chunks before it (none come from the real guest) and after its end are dropped."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        job, _ = streamed(loop)
        job.chunk(b"before the head")  # dropped: there is no stream yet
        job.start_stream(201, [(b"x-a", b"1")])
        response = job.future.result()
        assert (response.status, response.headers) == (201, [(b"x-a", b"1")])
        for part in (b"one", b"two", b"three"):
            job.chunk(part)
        job.end_stream()
        job.end()
        assert [part async for part in response.body] == [b"one", b"two", b"three"]
        assert job.queued == 0 and job.chunks is None
        job.chunk(b"late")  # after its reader finished: dropped, not queued for no one
        assert job.chunks is None and job.queued == 0

    uvloop.run(main())


def test_a_failure_after_the_head_cuts_the_stream_with_it() -> None:
    """The reader gets what came, then the error (its response cannot change now); a
    failure after the job ended is not queued."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        job, _ = streamed(loop)
        job.start_stream(200, [])
        job.chunk(b"part")
        job.fail(RuntimeError("cut"))
        assert job.done
        job.fail(RuntimeError("again"))  # ended: nothing more is queued
        body = job.future.result().body
        assert await anext(body) == b"part"
        try:
            await anext(body)
        except RuntimeError as e:
            assert str(e) == "cut"
        else:
            raise AssertionError("the stream was not cut")
        assert job.chunks is None

        plain = Job(loop, b"req")  # no head yet: the future takes the error itself
        plain.fail(ValueError("no head"))
        assert isinstance(plain.future.exception(), ValueError) and plain.chunks is None

    uvloop.run(main())


def test_a_stream_past_its_high_mark_pauses_its_isolate_until_read_down_to_low() -> None:
    """Backpressure: past `STREAM_HIGH` unread bytes the isolate is told to pause (once);
    once its reader has taken the queue down to `STREAM_LOW`, to resume (once)."""
    from runtime.executors.python.job import STREAM_HIGH, STREAM_LOW

    async def main() -> None:
        loop = asyncio.get_running_loop()
        job, runner = streamed(loop)
        job.start_stream(200, [])
        body = job.future.result().body
        piece = b"x" * (STREAM_HIGH // 4)
        for _ in range(4):
            job.chunk(piece)
        assert job.queued == STREAM_HIGH and runner.told == []  # at the mark: not past it
        job.chunk(b"y")
        assert job.paused and runner.told == ["pause"]
        job.chunk(b"z")
        assert runner.told == ["pause"] and job.queued == STREAM_HIGH + 2  # paused once
        taken = 0
        while job.queued > STREAM_LOW:
            taken += len(await anext(body))
            assert runner.told == ["pause"] or job.queued <= STREAM_LOW
        assert runner.told == ["pause", "resume"] and not job.paused
        assert job.queued == STREAM_HIGH + 2 - taken and job.queued <= STREAM_LOW
        job.end_stream()
        job.end()
        assert runner.told == ["pause", "resume"]

        exact, runner = streamed(loop)  # read down to STREAM_LOW exactly: it resumes
        exact.start_stream(200, [])
        exact.chunk(b"x" * (STREAM_HIGH - STREAM_LOW + 1))
        exact.chunk(b"y" * STREAM_LOW)
        assert runner.told == ["pause"]
        await anext(exact.future.result().body)
        assert exact.queued == STREAM_LOW and runner.told == ["pause", "resume"]

    uvloop.run(main())


def test_a_job_whose_client_left_before_the_head_fails_quietly() -> None:
    """Cut after its client went away (its future cancelled, no stream): it ends,
    and the error goes nowhere."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        job, _ = streamed(loop)
        job.future.cancel()
        job.fail(RuntimeError("wall limit"))
        assert job.done and job.future.cancelled() and job.chunks is None

    uvloop.run(main())


def test_a_job_that_ends_while_paused_frees_its_isolate() -> None:
    """Its isolate takes the next job whatever the reader left unread: told to resume
    as the job ends, once."""
    from runtime.executors.python.job import STREAM_HIGH

    async def main() -> None:
        loop = asyncio.get_running_loop()
        job, runner = streamed(loop)
        job.start_stream(200, [])
        job.chunk(b"x" * (STREAM_HIGH + 1))
        assert runner.told == ["pause"]
        job.end_stream()
        job.end()
        assert runner.told == ["pause", "resume"] and not job.paused
        job.end()
        assert runner.told == ["pause", "resume"]

    uvloop.run(main())


def test_a_reader_that_leaves_mid_stream_stops_the_guest_and_frees_its_isolate() -> None:
    """The client went away (the body's iterator closed before the end): the host
    calls' leftovers are undone, the isolate is told to cancel the job and to resume
    if it was paused, and what still arrives is dropped. A reader that leaves after
    the job ended tells no one."""
    from runtime.executors.python.job import STREAM_HIGH

    async def main() -> None:
        loop = asyncio.get_running_loop()
        job, runner = streamed(loop)
        undone: list[str] = []
        job.cleanups.append(lambda: undone.append("model call"))
        job.start_stream(200, [])
        job.chunk(b"x" * (STREAM_HIGH + 1))
        body = job.future.result().body
        await anext(body)
        job.chunk(b"more")
        await body.aclose()
        assert runner.cancelled == [job] and undone == ["model call"]
        assert runner.told == ["pause", "resume"] and job.chunks is None and job.queued == 0
        job.chunk(b"after")
        assert job.chunks is None and job.queued == 0

        ended, other = streamed(loop)
        ended.start_stream(200, [])
        ended.chunk(b"a")
        ended.end_stream()
        ended.end()
        rest = ended.future.result().body
        await anext(rest)
        await rest.aclose()
        assert other.cancelled == [] and other.told == []

    uvloop.run(main())


def test_a_job_keeps_its_callers_tenant_and_lineage_and_the_cancels_message() -> None:
    """The tenant its binding calls answer to (data residency) and the lineage its
    fetches add to are the caller's; a cancel's message reaches whoever awaits it."""
    from runtime.bindings.fetch import Lineage

    async def main() -> None:
        loop = asyncio.get_running_loop()
        lineage = Lineage(None)
        job = Job(loop, b"req", tenant="acme", lineage=lineage)
        assert job.tenant == "acme" and job.lineage is lineage
        assert Job(loop, b"req").lineage is not lineage  # made at its first fetch
        job.future.cancel("the client went away")
        try:
            await job.future
        except asyncio.CancelledError as e:
            assert e.args == ("the client went away",)
        else:
            raise AssertionError("not cancelled")

    uvloop.run(main())
