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
