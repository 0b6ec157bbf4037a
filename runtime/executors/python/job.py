"""One request in flight on a Python isolate: a future for the response head,
then, for a streamed body, a queue of chunks the HTTP front reads.

The queue is bounded by backpressure: past `STREAM_HIGH` unread bytes the
isolate's socket is no longer read (so the guest blocks in its send) until the
reader has taken the queue down to `STREAM_LOW`. What is queued is then at most
`STREAM_HIGH` plus what one read of the socket delivered (`channel.RECV_SIZE`,
or one frame when a single chunk is larger).

A job ends exactly once (its last frame arrived, or it failed); `on_end` runs
then, which is how the scheduler counts what is in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from runtime.bindings.fetch import Lineage
from runtime.executors.python import wire
from runtime.net.message import Response

STREAM_HIGH = 256 << 10
STREAM_LOW = 64 << 10


class Runner(Protocol):
    """The isolate a job runs on, as far as the job is concerned."""

    def cancel(self, job: Job) -> None:
        """Tell the guest to stop `job`'s stream (its client went away), or take
        `job` back if it was sent ahead and has not started."""

    def pause(self) -> None:
        """Stop taking frames from the guest (its reader is behind)."""

    def resume(self) -> None:
        """Take frames again."""


class JobFuture(asyncio.Future[Any]):
    """A job's future: its cancel (the client went away: `connection_lost`, or the
    task awaiting it cancelled) tells the job at once. (A done-callback on a plain
    future did that, scheduled on the loop for every response: ~0.4 us of each.)
    Made as ``JobFuture(loop=loop)``, its `job` set after (an ``__init__`` of its
    own cost a Python frame per request)."""

    __slots__ = ("job",)
    job: Job | None  # None once the job ended (no cycle left for the collector)

    def cancel(self, msg: object = None) -> bool:
        if not super().cancel(msg):
            return False
        if self.job is not None:
            self.job._cancelled()
        return True


class Job:
    __slots__ = ("__weakref__", "_lineage", "chunks", "cleanups", "deadline", "done", "frame",
                 "future", "isolate", "on_end", "paused", "queued", "raw", "size", "tenant")

    def __init__(self, loop: asyncio.AbstractEventLoop, payload: bytes,
                 tenant: str | None = None, lineage: Lineage | None = None, *,
                 framed: bool = False, raw: bool = False) -> None:
        """`payload`: the encoded request (`framed`: the whole REQUEST frame, as the
        native lane makes it). `tenant`: the calling principal's (its binding calls
        answer to its data residency: `runtime.bindings.ai.AIBinding.as_caller`);
        `lineage`: the request's ``CDN-Loop`` and tree (its fetch calls add to it
        and are counted against it: `runtime.bindings.fetch`); None: a request
        without one (made at its first fetch). `raw`: a whole
        response is the future's as the guest's RESPONSE frame sent it (its payload,
        bytes: not decoded or checked; the native lane's `respond_frame` does that);
        a streamed one is a `Response` either way.

        Raises `ProtocolError` for a request over the frame's limit (`wire.MAX_FRAME`)."""
        self.frame = payload if framed else wire.frame(wire.REQUEST, payload)
        self.size = len(self.frame) - wire.FRAME_HEAD  # of the encoded request
        self.raw = raw
        self.tenant = tenant
        self._lineage = lineage
        future = self.future = JobFuture(loop=loop)
        future.job = self
        self.chunks: asyncio.Queue[bytes | BaseException | None] | None = None
        self.isolate: Runner | None = None
        self.done = False
        # run as the job ends (the scheduler's count of what is in flight), and what
        # `on_end` is given then: its wall-time deadline's entry (`Scheduler.submit`)
        self.on_end: Callable[[Job], None] | None = None
        self.deadline: list[Job] | None = None
        self.queued = 0  # bytes in `chunks` not yet taken by the reader
        self.paused = False  # the isolate was told to pause for this job
        # what the job's host calls left running on the PoP (a model call, an AI
        # stream), undone when it ends or its client goes away (`let_go`)
        self.cleanups: list[Callable[[], None]] = []

    @property
    def lineage(self) -> Lineage:
        """The request's place in its tree of subrequests (`__init__`'s `lineage`)."""
        if self._lineage is None:
            self._lineage = Lineage(None)
        return self._lineage

    @property
    def payload(self) -> bytes:
        """The encoded request (a copy: its frame is what is kept)."""
        return self.frame[wire.FRAME_HEAD:]

    def end(self) -> None:
        """The job reached its last frame (or failed); runs `on_end` once."""
        if not self.done:
            self.done = True
            self.future.job = None  # a cancel from now on has nothing to stop
            if self.paused:  # its isolate is free for the next job, whatever is queued here
                self._resume()
            if self.cleanups:
                self.let_go()
            if self.on_end is not None:
                self.on_end(self)

    def let_go(self) -> None:
        """Undo what its host calls left running (`cleanups`), once."""
        cleanups, self.cleanups = self.cleanups, []
        for undo in cleanups:
            undo()

    def _cancelled(self) -> None:
        """The client went away before the response (the future was cancelled): stop
        the model calls the handler waits on (their error reply ends it) and tell
        the isolate; a job no isolate has yet (waiting in its scheduler's queue)
        ends here, and is never started (it ran later, for no one, and held the
        isolate from those still waiting: their wall limit ran out behind it)."""
        if not self.done:
            self.let_go()
            if self.isolate is not None:
                self.isolate.cancel(self)
            else:
                self.end()

    def fail(self, err: BaseException) -> None:
        """Answer with `err`, or cut the stream with it if the head was sent."""
        if not self.future.done():
            self.future.set_exception(err)
        elif self.chunks is not None and not self.done:
            self.chunks.put_nowait(err)
        self.end()

    def respond(self, response: Response | bytes) -> None:
        """Answer with `response` (bytes: a RESPONSE frame's payload, for a `raw` job)."""
        if not self.future.done():
            self.future.set_result(response)
        self.end()

    def start_stream(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.chunks = asyncio.Queue()
        if not self.future.done():
            self.future.set_result(Response(status, headers, self._stream()))

    def chunk(self, data: bytes) -> None:
        if self.chunks is not None:
            self.chunks.put_nowait(data)
            self.queued += len(data)
            if self.queued > STREAM_HIGH and not self.paused and self.isolate is not None:
                self.paused = True
                self.isolate.pause()

    def _resume(self) -> None:
        if self.paused:
            self.paused = False
            if self.isolate is not None:
                self.isolate.resume()

    def end_stream(self) -> None:
        if self.chunks is not None:
            self.chunks.put_nowait(None)

    async def _stream(self) -> AsyncIterator[bytes]:
        assert self.chunks is not None
        try:
            while True:
                item = await self.chunks.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                self.queued -= len(item)
                if self.queued <= STREAM_LOW:
                    self._resume()
                yield item
        finally:
            self.chunks = None  # what still arrives is dropped, not queued for no one
            self.queued = 0
            self._resume()
            if not self.done and self.isolate is not None:  # the client went away
                self.let_go()
                self.isolate.cancel(self)
