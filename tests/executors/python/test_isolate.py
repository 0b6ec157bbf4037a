"""What an isolate's frames mean for its jobs, with a fake pool and host (`Rig`) and
a real socket to its guest: a whole response (decoded, or raw for the native lane,
bounded by ``limits.max_response_mb``), a stream (its head, chunks, end, and the cut
past the limit), a guest's error, the isolate's lifecycle (THREAD, READY, a
recycling interpreter, a failed start, RETIRE), requests sent ahead and taken back
(DROP, DROPPED), a client gone (CANCEL), and the forged frames that kill its host.

The frames are handed to `Isolate.frame` as its channel would hand them; what the
isolate sends is read from the guest's end of the socket. Fast (no host process):
`make mutate` runs these against runtime/executors/python/isolate.py."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from edgefn_core import hostcall
from edgefn_core.abi import encode_response
from edgefn_core.errors import FunctionError
from runtime.executors.output import escaped
from runtime.executors.output import said as said_of
from runtime.executors.python import isolate as isolate_mod
from runtime.executors.python import wire
from runtime.executors.python.config import HostConfig
from runtime.executors.python.isolate import (
    CALLS_PER_TURN,
    MAX_SMALL_FRAME,
    Isolate,
    read_json,
    response_of,
)
from runtime.executors.python.job import Job
from runtime.net.message import Response
from tests.executors.python.test_channel import available
from tests.executors.python.test_isolate_calls import send_all

CFG = HostConfig(name="f", version="v1", function_dir="/nonexistent", module="main",
                 handler="handle", cpu_ms=50, wall_ms=1000, memory_mb=64, recycle_after=100,
                 min_isolates=1, max_isolates=1, max_response_mb=1)
LIMIT = CFG.max_response


class Recorder:
    """The pool: what the isolate tells it, recorded in `seen`."""

    def __init__(self, seen: list[tuple[str, Any]]) -> None:
        self.seen = seen
        self.isolate: Isolate | None = None  # the one that tells it: each event names it

    def _add(self, isolate: Isolate, event: str, what: Any) -> None:
        assert isolate is self.isolate, (event, isolate)
        self.seen.append((event, what))

    def started(self, isolate: Isolate) -> None:
        self._add(isolate, "started", None)

    def finished(self, isolate: Isolate) -> None:
        self._add(isolate, "finished", None)

    def call(self, isolate: Isolate, msg: dict[str, Any]) -> None:
        self._add(isolate, "call", msg["id"])

    def retiring(self, isolate: Isolate, why: str) -> None:
        self._add(isolate, "retiring", why)

    def requeue(self, isolate: Isolate, job: Job) -> None:
        self._add(isolate, "requeue", job.payload)

    def begun(self, isolate: Isolate, job: Job) -> None:
        self._add(isolate, "begun", job.payload)


class Host:
    """The isolate's owner: this process stands for its host (THREAD names one of its
    threads); a kill and a lost socket are recorded in `seen`."""

    def __init__(self, seen: list[tuple[str, Any]]) -> None:
        self.cfg, self.generation, self.retiring = CFG, 7, False
        self.events: isolate_mod.Events = Recorder(seen)
        self.seen = seen

    @property
    def pid(self) -> int:
        return os.getpid()

    def lost(self, isolate: Isolate) -> None:
        self.seen.append(("lost", None))
        isolate.close()

    def kill(self) -> None:
        self.seen.append(("kill", None))

    def others(self) -> float | None:
        return None


class Rig:
    """An isolate on a fresh loop, its host and pool recorded, its guest's socket."""

    def __init__(self, state: str = "busy") -> None:
        self.loop = asyncio.new_event_loop()
        ours, self.guest = socket.socketpair()
        self.seen: list[tuple[str, Any]] = []
        host = Host(self.seen)
        self.isolate = Isolate(host, ours, state=state)
        self.isolate.attach(self.loop)
        assert isinstance(host.events, Recorder)
        host.events.isolate = self.isolate
        # what it logged (its guest's tracebacks: `functions`), as (level, message)
        self.logged, self.functions = Kept(), Kept()
        logging.getLogger("edgefn.isolates").addHandler(self.logged)
        logging.getLogger("edgefn.functions").addHandler(self.functions)

    def job(self, payload: bytes = b"req", raw: bool = False) -> Job:
        return Job(self.loop, payload, raw=raw)

    def run(self, *jobs: Job) -> list[Job]:
        """Send `jobs`, counted in its uses as the scheduler counts them."""
        for job in jobs:
            self.isolate.uses += 1
            self.isolate.run(job)
        return list(jobs)

    def two_out(self, unread: bool = False) -> Job:
        """Jobs b"1" and b"2" sent, the second ahead (what the guest got is read);
        `unread`: a byte from the guest waits unread (the first may have ended). The
        first job."""
        first, _ = self.run(self.job(b"1"), self.job(b"2"))
        self.turn()
        self.sent()
        if unread:
            self.guest.sendall(b"x")
        return first

    def turn(self) -> None:
        """One turn of the loop: what was scheduled before it runs (frames held for
        the turn's end go out)."""
        self.loop.call_soon(self.loop.stop)
        self.loop.run_forever()

    def sent(self) -> list[tuple[bytes, bytes]]:
        """The frames the guest can read now."""
        return wire.Reader().feed(available(self.guest))

    def kinds(self) -> list[bytes]:
        return [kind for kind, _ in self.sent()]

    def ready(self) -> None:
        """The host's THREAD and a fresh interpreter's READY."""
        self.isolate.frame(wire.THREAD, json.dumps({"tid": threading.get_native_id()}).encode())
        self.isolate.frame(wire.READY, b'{"ok": true}')

    def close(self) -> None:
        logging.getLogger("edgefn.isolates").removeHandler(self.logged)
        logging.getLogger("edgefn.functions").removeHandler(self.functions)
        self.isolate.close()
        self.guest.close()
        self.loop.close()


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    try:
        yield r
    finally:
        r.close()


def ok(body: bytes = b"hi", status: int = 200) -> bytes:
    return encode_response(status, [(b"content-type", b"text/plain")], body)


def error_of(job: Job) -> FunctionError:
    err = job.future.exception()
    assert isinstance(err, FunctionError), err
    return err


def forged(r: Rig, why: str | None = None) -> bool:
    """Its host was killed and the isolate lost, as for garbage (and the log says
    `why`)."""
    return (r.seen[-2:] == [("kill", None), ("lost", None)] and r.isolate.state == "dead"
            and (why is None or r.logged.records[-1:] == [
                (logging.ERROR, f"f: isolate sent garbage ({why}); killing its host")]))


# -- whole responses ---------------------------------------------------------------------------
def test_a_response_frame_answers_the_job_decoded_and_frees_the_isolate(rig: Rig) -> None:
    (job,) = rig.run(rig.job())
    assert rig.sent() == [(wire.REQUEST, b"req")]  # the next request goes out at once
    rig.isolate.frame(wire.RESPONSE, ok(b"hello", 201))
    response = job.future.result()
    assert isinstance(response, Response)
    assert (response.status, response.body) == (201, b"hello")
    assert list(response.headers) == [(b"content-type", b"text/plain")]
    assert job.done and rig.isolate.job is None and rig.isolate.fresh
    assert rig.seen == [("finished", None)]


def test_a_raw_job_gets_the_frame_s_payload_unread(rig: Rig) -> None:
    (job,) = rig.run(rig.job(raw=True))
    rig.isolate.frame(wire.RESPONSE, b"not a response at all")  # the lane checks it
    assert job.future.result() == b"not a response at all"
    assert rig.seen == [("finished", None)]


@pytest.mark.parametrize("body, fails", [(LIMIT, False), (LIMIT + 1, True)])
def test_a_body_over_max_response_mb_is_a_502(rig: Rig, body: int, fails: bool) -> None:
    (job,) = rig.run(rig.job())
    rig.isolate.frame(wire.RESPONSE, ok(b"x" * body))
    if fails:
        err = error_of(job)
        assert (err.code, err.status) == ("bad_response", 502)
        assert str(err) == (f"response body of {LIMIT + 1} bytes exceeds the limit of "
                            f"{LIMIT} bytes (limits.max_response_mb = 1)")
    else:
        assert len(job.future.result().body) == LIMIT
    assert job.done and rig.seen == [("finished", None)]


def test_response_of_refuses_what_does_not_decode() -> None:
    with pytest.raises(FunctionError) as e:
        response_of(b"\x01\x02", CFG)
    assert e.value.code == "bad_response" and e.value.status == 502


def test_an_invalid_response_fails_its_job_and_still_frees_the_isolate(rig: Rig) -> None:
    (job,) = rig.run(rig.job())
    rig.isolate.frame(wire.RESPONSE, b"\x01\x02")
    assert error_of(job).code == "bad_response"
    assert job.done and rig.isolate.job is None and rig.seen == [("finished", None)]


def test_a_response_with_no_job_is_a_late_frame_and_ignored(rig: Rig) -> None:
    rig.isolate.frame(wire.RESPONSE, ok())
    for kind in (wire.HEAD, wire.CHUNK, wire.END, wire.ERROR):
        rig.isolate.frame(kind, ok() if kind == wire.HEAD else b"{}")
    assert rig.seen == [] and rig.isolate.state == "busy"


def test_a_job_whose_client_left_is_not_answered_but_the_isolate_is_freed(rig: Rig) -> None:
    (job,) = rig.run(rig.job())
    job.future.cancel()
    rig.isolate.frame(wire.RESPONSE, ok())
    assert job.future.cancelled() and job.done and rig.seen == [("finished", None)]


def test_a_frame_after_the_isolate_died_is_ignored(rig: Rig) -> None:
    (job,) = rig.run(rig.job())
    rig.isolate.close()
    rig.isolate.frame(wire.RESPONSE, ok())
    rig.isolate.frame(wire.RETIRE, b'{"why": "x"}')
    assert not job.future.done() and rig.seen == []


# -- requests sent ahead -----------------------------------------------------------------------
def test_it_counts_the_jobs_sent_to_it(rig: Rig) -> None:
    """What its host's look holds its other threads' CPU to (`Host._look`)."""
    assert rig.isolate.sent == 0
    rig.run(rig.job(b"1"), rig.job(b"2"), rig.job(b"3"))
    assert rig.isolate.sent == 3


def test_the_job_sent_ahead_begins_when_the_one_before_it_ends(rig: Rig) -> None:
    first, second, third = rig.run(rig.job(b"1"), rig.job(b"2"), rig.job(b"3"))
    rig.turn()
    assert rig.sent() == [(wire.REQUEST, b) for b in (b"1", b"2", b"3")]
    assert rig.isolate.job is first and list(rig.isolate.queue) == [second, third]
    rig.isolate.frame(wire.RESPONSE, ok(b"one"))
    assert first.future.result().body == b"one" and rig.isolate.job is second
    assert rig.seen == [("begun", b"2")]
    rig.isolate.frame(wire.RESPONSE, ok(b"two"))
    rig.isolate.frame(wire.RESPONSE, ok(b"three"))
    assert third.future.result().body == b"three"
    assert rig.seen == [("begun", b"2"), ("begun", b"3"), ("finished", None)]


def test_a_recycling_interpreter_s_next_job_begins_at_its_ready(rig: Rig) -> None:
    rig.ready()
    _first, second, _third = rig.run(rig.job(b"1"), rig.job(b"2"), rig.job(b"3"))
    rig.isolate.frame(wire.READY, b'{"recycling": true}')
    assert rig.isolate.recycling
    rig.isolate.frame(wire.RESPONSE, ok())
    assert rig.isolate.job is second and rig.seen == [("started", None)]  # not begun yet
    rig.isolate.frame(wire.READY, b'{"ok": true}')  # the fresh interpreter runs it
    assert rig.seen == [("started", None), ("begun", b"2")]
    assert not rig.isolate.recycling and rig.isolate.uses == 2  # it and the one behind it
    assert rig.logged.records == [(logging.ERROR, "f: isolate restarted during a request")]
    rig.isolate.frame(wire.RESPONSE, ok())
    assert rig.seen[-1] == ("begun", b"3")  # no longer recycling: the next begins at once


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, record.getMessage()))


# -- streams -----------------------------------------------------------------------------------
def stream_of(job: Job, rig: Rig) -> list[bytes]:
    response = job.future.result()

    async def read() -> list[bytes]:
        return [chunk async for chunk in response.body]

    return rig.loop.run_until_complete(read())


def test_a_stream_s_head_chunks_and_end(rig: Rig) -> None:
    (job,) = rig.run(rig.job())
    rig.isolate.frame(wire.HEAD, ok(b"", 206))
    assert job.future.result().status == 206 and rig.seen == []
    assert list(job.future.result().headers) == [(b"content-type", b"text/plain")]
    rig.isolate.frame(wire.CHUNK, b"ab")
    rig.isolate.frame(wire.CHUNK, b"cd")
    assert rig.isolate.streamed == 4
    rig.isolate.frame(wire.END, b"")
    assert stream_of(job, rig) == [b"ab", b"cd"]
    assert rig.seen == [("finished", None)] and job.done


def test_a_stream_past_max_response_mb_is_cut_and_cancelled(rig: Rig) -> None:
    (job,) = rig.run(rig.job())
    rig.sent()
    rig.isolate.frame(wire.HEAD, ok(b""))
    rig.isolate.frame(wire.CHUNK, b"x" * LIMIT)  # up to the limit: kept
    assert rig.sent() == [] and not rig.isolate.stuck
    rig.isolate.frame(wire.CHUNK, b"y")
    assert rig.sent() == [(wire.CANCEL, b"")] and rig.isolate.stuck
    rig.isolate.frame(wire.CHUNK, b"z")  # dropped: the stream was cut
    rig.isolate.frame(wire.END, b"")
    with pytest.raises(FunctionError) as e:
        stream_of(job, rig)
    assert str(e.value) == (f"streamed response body exceeded the limit of {LIMIT} bytes "
                            "(limits.max_response_mb = 1); the stream was cut")
    assert (e.value.code, e.value.status) == ("bad_response", 502) and not rig.isolate.stuck  # the next job is read again
    assert rig.seen == [("finished", None)]


def test_a_stream_whose_head_does_not_decode_fails_and_drops_the_rest(rig: Rig) -> None:
    first, second = rig.run(rig.job(b"1"), rig.job(b"2"))
    rig.isolate.frame(wire.HEAD, b"\x01")
    assert error_of(first).code == "bad_response" and rig.isolate.stuck
    rig.isolate.frame(wire.HEAD, ok(b""))  # the same job's: dropped until its end
    rig.isolate.frame(wire.CHUNK, b"x")
    assert rig.isolate.streamed == 0
    rig.isolate.frame(wire.END, b"")
    assert not rig.isolate.stuck and rig.isolate.job is second
    rig.isolate.frame(wire.RESPONSE, ok(b"two"))
    assert second.future.result().body == b"two"


def test_an_end_without_a_head_is_a_502(rig: Rig) -> None:
    (job,) = rig.run(rig.job())
    rig.isolate.frame(wire.END, b"")
    err = error_of(job)
    assert (err.code, err.status, str(err)) == (
        "bad_response", 502, "isolate ended the request without a response")
    assert rig.seen == [("finished", None)]


def test_a_chunk_before_a_head_is_dropped(rig: Rig) -> None:
    (job,) = rig.run(rig.job())
    rig.isolate.frame(wire.CHUNK, b"early")
    assert rig.isolate.streamed == 0 and not job.future.done()


# -- a guest's error ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind, code, status", [
    ("exception", "trap", 500), ("binding", "binding", 500), ("cpu_limit", "cpu_limit", 503),
    ("memory_limit", "memory_limit", 503), ("wall_limit", "wall_limit", 504),
    ("bad_response", "bad_response", 502), ("something else", "trap", 500), (None, "trap", 500),
])
def test_an_error_frame_fails_the_job_as_its_kind_says(rig: Rig, kind: str | None, code: str,
                                                       status: int) -> None:
    (job,) = rig.run(rig.job())
    rig.isolate.frame(wire.ERROR, json.dumps({"kind": kind, "message": "boom"}).encode())
    err = error_of(job)
    assert (err.code, err.status, str(err)) == (code, status, "boom")
    assert rig.seen == [("finished", None)] and rig.isolate.job is None


def test_an_error_without_a_message_says_failed(rig: Rig) -> None:
    (job,) = rig.run(rig.job())
    rig.isolate.frame(wire.ERROR, b"{}")
    assert str(error_of(job)) == "failed"


def test_an_error_s_traceback_is_logged_escaped_and_bounded(rig: Rig) -> None:
    (_job,) = rig.run(rig.job())
    lines = [f"line {i}" for i in range(300)] + ["evil \x1b[31m", "  "]
    rig.isolate.frame(wire.ERROR, json.dumps({"kind": "exception", "message": "m",
                                              "traceback": "\n".join(lines) + "\n"}).encode())
    # its last 200 lines, the blank ones at the end dropped; each after the first marked as its
    # function's (no line of it reads as one of the access log's)
    kept = [*lines[103:300], escaped("evil \x1b[31m")]  # the last 200 end in "  ", ""
    assert "\x1b" not in kept[-1]
    assert rig.functions.records == [(logging.ERROR, f"{CFG.label}: " + "\n".join(
        f"{CFG.label}| {line}" for line in kept)[len(CFG.label) + 2:])]


def test_an_error_s_traceback_is_cut_to_its_last_64_kib(rig: Rig) -> None:
    (_job,) = rig.run(rig.job())
    rig.isolate.frame(wire.ERROR, json.dumps({"traceback": "a" * (wire.MAX_TRACEBACK + 5)
                                              + "b" * 10}).encode())
    ((_, text),) = rig.functions.records
    assert text.count("a") - CFG.label.count("a") + text.count("b") - CFG.label.count("b") \
        == wire.MAX_TRACEBACK


# -- lifecycle ---------------------------------------------------------------------------------
def test_thread_then_ready_starts_it_and_a_second_ready_is_forged(rig: Rig) -> None:
    rig.ready()
    assert rig.seen == [("started", None)] and rig.isolate.clock is not None
    rig.isolate.frame(wire.READY, b'{"ok": true}')
    assert forged(rig, "a READY from an interpreter already serving")


def test_a_ready_after_a_job_ends_is_a_fresh_interpreter(rig: Rig) -> None:
    rig.ready()
    rig.run(rig.job())
    assert not rig.isolate.fresh
    rig.isolate.frame(wire.RESPONSE, ok())
    rig.isolate.frame(wire.READY, b'{"ok": true}')  # it recycled after that job
    assert rig.seen == [("started", None), ("finished", None), ("started", None)]


def test_a_ready_before_the_thread_frame_is_forged(rig: Rig) -> None:
    rig.isolate.frame(wire.READY, b'{"ok": true}')
    assert forged(rig, "a READY before its host's THREAD frame")
    assert ("started", None) not in rig.seen


@pytest.mark.parametrize("payload, why", [
    (b'{"tid": 0}', "without a thread id (0)"), (b'{"tid": -3}', "without a thread id (-3)"),
    (b'{"tid": "1"}', "without a thread id (1)"), (b'{"tid": true}', "without a thread id (True)"),
    (('{"tid": "%s"}' % ("9" * 80)).encode(), f"without a thread id ({'9' * 64} [cut: 16 more characters])"),
    (b"{}", "without a thread id (None)"), (b'{"tid": 1}', "naming no thread of its host (1)"),
    (b'{"tid": 999999999}', "naming no thread of its host (999999999)"),
])
def test_a_thread_frame_naming_no_thread_is_forged(payload: bytes, why: str) -> None:
    r = Rig()
    try:
        assert why in (r.isolate.thread(payload) or "")
        r.isolate.frame(wire.THREAD, payload)
        assert forged(r, f"a THREAD frame {why}") and r.isolate.clock is None
    finally:
        r.close()


def test_a_second_thread_frame_is_forged(rig: Rig) -> None:
    tid = json.dumps({"tid": threading.get_native_id()}).encode()
    rig.isolate.frame(wire.THREAD, tid)
    assert rig.seen == [] and rig.isolate.clock is not None
    assert rig.isolate.thread(tid) == ("a second THREAD frame (its host sends one, before "
                                       "any function code)")
    rig.isolate.frame(wire.THREAD, tid)
    assert forged(rig, "a second THREAD frame (its host sends one, before any function code)")


def test_a_recycling_ready_outside_a_job_or_twice_is_forged(rig: Rig) -> None:
    rig.ready()
    rig.isolate.frame(wire.READY, b'{"recycling": true}')
    assert forged(rig, "a recycling READY outside a request, or twice")
    r = Rig()
    try:
        r.ready()
        r.run(r.job())
        r.isolate.frame(wire.READY, b'{"recycling": true}')
        assert r.isolate.state == "busy"
        r.isolate.frame(wire.READY, b'{"recycling": true}')
        assert forged(r, "a recycling READY outside a request, or twice")
    finally:
        r.close()


@pytest.mark.parametrize("state", ["starting", "recycling"])
def test_an_interpreter_that_fails_to_start_hands_back_its_jobs_in_order(state: str) -> None:
    r = Rig(state)
    try:
        r.run(r.job(b"1"), r.job(b"2"), r.job(b"3"))
        r.isolate.frame(wire.READY, json.dumps({"error": "bad \x1b import"}).encode())
        retiring = [("retiring", "an isolate failed to restart")] if state == "recycling" else []
        # each goes first in line, the last first: the first sent is first again
        assert r.seen == [*retiring, ("requeue", b"3"), ("requeue", b"2"), ("requeue", b"1")]
        assert r.isolate.state == "dead" and r.isolate.job is None and not r.isolate.queue
        ((level, text),) = r.logged.records
        assert level == logging.ERROR and text.startswith("f: isolate failed to start: bad ")
        assert "\x1b" not in text
    finally:
        r.close()


def test_an_interpreter_stopped_for_its_host_s_replacement_warns(rig: Rig) -> None:
    rig.isolate.frame(wire.READY, b'{"stopped": "host replaced"}')
    assert rig.logged.records == [(logging.WARNING, "f: isolate stopped: host replaced")]
    assert rig.isolate.state == "dead" and rig.seen == []


def test_retire_is_passed_on_once_escaped_and_a_second_is_forged(rig: Rig) -> None:
    rig.isolate.frame(wire.RETIRE, json.dumps({"why": "memory \x1b[2J"}).encode())
    ((event, why),) = rig.seen
    assert event == "retiring" and why.startswith("memory ") and "\x1b" not in why
    assert rig.isolate.state == "busy"
    rig.isolate.frame(wire.RETIRE, b'{"why": "again"}')
    assert forged(rig, "a second RETIRE (its host sends one)")


def test_retire_without_a_reason_says_none(rig: Rig) -> None:
    rig.isolate.frame(wire.RETIRE, b"{}")
    assert rig.seen == [("retiring", "")]


@pytest.mark.parametrize("kind", [wire.READY, wire.RETIRE, wire.ERROR, wire.THREAD,
                                  wire.DROPPED])
def test_a_small_frame_past_its_bound_is_forged_before_it_is_read(kind: bytes) -> None:
    """Refused unparsed (a 50 MB ERROR frame froze every tenant for 6 s)."""
    r = Rig()
    try:
        (job,) = r.run(r.job())
        r.isolate.frame(kind, b" " * MAX_SMALL_FRAME + b"{}")  # valid JSON: not parsed
        assert forged(r, f"a frame {kind!r} of {MAX_SMALL_FRAME + 2} bytes (at most "
                         f"{MAX_SMALL_FRAME}; the guest sends less)")
        assert not job.future.done()
    finally:
        r.close()


@pytest.mark.parametrize("kind", [wire.READY, wire.RETIRE, wire.ERROR])
def test_a_small_frame_at_its_bound_is_read(rig: Rig, kind: bytes) -> None:
    rig.run(rig.job())
    rig.isolate.frame(kind, b" " * (MAX_SMALL_FRAME - 2) + b"{}")
    assert ("kill", None) not in rig.seen


def test_between_requests_only_a_small_frame_may_begin(rig: Rig) -> None:
    """A response-sized frame begun with no request running (a thread of the guest's
    own, after its handler returned) held up to max_response_mb of the PoP for as long
    as the guest liked; its length alone now kills the host. In a request, a
    response up to its limit (and its head) may come."""
    assert rig.isolate.room() == MAX_SMALL_FRAME
    rig.guest.sendall(wire.frame(wire.RESPONSE, b"x" * (MAX_SMALL_FRAME + 1))[:64])
    rig.turn()
    assert forged(rig, f"a frame of {MAX_SMALL_FRAME + 2} bytes begun where at most "
                       f"{MAX_SMALL_FRAME} may come now")
    assert rig.isolate.channel.reader.buf == bytearray()  # closed: nothing held


def test_a_response_up_to_its_limit_may_come_in_a_request(rig: Rig) -> None:
    (job,) = rig.run(rig.job())
    assert rig.isolate.room() == max(wire.MAX_FRAME, CFG.max_response + (1 << 20))
    whole = memoryview(wire.frame(wire.RESPONSE, ok(b"x" * CFG.max_response)))
    rig.guest.setblocking(False)
    while whole:  # what the socket takes, then the loop reads it
        with contextlib.suppress(BlockingIOError):
            whole = whole[rig.guest.send(whole):]
        rig.turn()
        assert ("kill", None) not in rig.seen and (not job.future.done() or not whole)
    rig.turn()
    assert job.future.result().status == 200 and rig.isolate.room() == MAX_SMALL_FRAME


def test_garbage_from_the_channel_kills_the_host_and_is_logged(rig: Rig) -> None:
    from edgefn_core.errors import ProtocolError

    rig.isolate.garbage(ProtocolError("bad bytes"))
    assert forged(rig, "bad bytes") and len(rig.logged.records) == 1


# -- taken back: DROP and DROPPED --------------------------------------------------------------
def test_a_drop_with_nothing_unread_takes_the_jobs_back_at_once(rig: Rig) -> None:
    first, *_ahead = rig.run(rig.job(b"1"), rig.job(b"2"), rig.job(b"3"))
    rig.turn()
    rig.sent()
    rig.isolate.drop()
    assert rig.kinds() == [wire.DROP]
    assert rig.seen == [("requeue", b"3"), ("requeue", b"2")]  # the first sent first in line
    assert not rig.isolate.queue and rig.isolate.taken == 2 and rig.isolate.uses == 1
    rig.isolate.drop()  # nothing left to take: no second DROP
    assert rig.kinds() == []
    rig.isolate.frame(wire.DROPPED, b'{"n": 2}')  # the guest confirms them
    assert not rig.isolate.dropping and rig.isolate.taken == 0
    assert rig.isolate.job is first and ("kill", None) not in rig.seen


def test_a_confirmation_handing_back_fewer_than_were_taken_is_forged(rig: Rig) -> None:
    rig.run(rig.job(b"1"), rig.job(b"2"), rig.job(b"3"))
    rig.isolate.drop()
    rig.isolate.frame(wire.DROPPED, b'{"n": 1}')
    assert forged(rig, "a DROPPED frame handing back 1 requests where 2 could not have started")


def test_a_confirmation_may_hand_back_the_next_job_too(rig: Rig) -> None:
    _first, _second = rig.run(rig.job(b"1"), rig.job(b"2"))
    rig.isolate.frame(wire.RESPONSE, ok())  # `second` is the job now: it may not have begun
    rig.run(rig.job(b"3"))
    rig.isolate.drop()  # takes b"3" at once
    del rig.seen[:]
    rig.isolate.frame(wire.DROPPED, b'{"n": 2}')  # and the guest had not begun b"2" either
    assert rig.seen == [("finished", None), ("requeue", b"2")]
    assert rig.isolate.job is None and rig.isolate.fresh


def test_a_drop_while_frames_wait_unread_waits_for_the_guest_s_answer(rig: Rig) -> None:
    first, *ahead = rig.run(rig.job(b"1"), rig.job(b"2"), rig.job(b"3"))
    rig.turn()
    rig.guest.sendall(b"x")  # something the guest sent, not read yet: b"2" may have begun
    rig.isolate.drop()
    assert rig.seen == [] and len(rig.isolate.queue) == 2 and rig.isolate.dropping
    rig.isolate.drop()  # one DROP at a time
    rig.sent()
    assert rig.kinds() == []
    rig.isolate.frame(wire.DROPPED, b'{"n": 1}')  # it had started b"2": only b"3" comes back
    assert rig.seen == [("requeue", b"3")] and rig.isolate.uses == 2
    assert rig.isolate.job is first and list(rig.isolate.queue) == [ahead[0]]


def test_dropped_answering_no_drop_or_handing_back_too_many_is_forged(rig: Rig) -> None:
    rig.run(rig.job(b"1"), rig.job(b"2"))
    rig.isolate.frame(wire.DROPPED, b'{"n": 1}')
    assert forged(rig, "a DROPPED frame answering no DROP")
    for n, said in ((b"3", "3"), (b"-1", "-1"), (b'"1"', "1"), (b"null", "None"),
                    (b'"%s"' % (b"7" * 70), "7" * 64 + " [cut: 6 more characters]")):
        r = Rig()
        try:
            r.run(r.job(b"1"), r.job(b"2"))
            r.guest.sendall(b"x")
            r.isolate.drop()
            r.isolate.frame(wire.DROPPED, b'{"n": ' + n + b"}")
            assert forged(r, f"a DROPPED frame handing back {said} of 2 requests"), n
        finally:
            r.close()


@pytest.mark.parametrize("n, said", [(b'"2"', "2"), (b"null", "None"),
                                     (b'"%s"' % (b"7" * 70), "7" * 64 + " [cut: 6 more characters]")])
def test_a_confirmation_handing_back_no_number_is_forged(rig: Rig, n: bytes, said: str) -> None:
    rig.run(rig.job(b"1"), rig.job(b"2"), rig.job(b"3"))
    rig.isolate.drop()  # took 2 at once
    rig.isolate.frame(wire.DROPPED, b'{"n": ' + n + b"}")
    assert forged(rig, f"a DROPPED frame handing back {said} requests where 2 could not have "
                       "started")


def test_an_idle_isolate_handing_back_what_it_was_not_sent_is_forged(rig: Rig) -> None:
    rig.isolate.frame(wire.DROPPED, b'{"n": 1, "ended": true}')
    assert forged(rig, "a DROPPED frame handing back 1 of 0 requests")


@pytest.mark.parametrize("n, stuck", [(2, False), (1, True)])
def test_a_cut_job_stays_cut_unless_it_was_handed_back(rig: Rig, n: int, stuck: bool) -> None:
    """A job cut (timed out) drops its frames until its end; handed back, it was never
    started there, and the isolate's next job is read again."""
    first, _second = rig.run(rig.job(b"1"), rig.job(b"2"))
    rig.isolate.stuck = True
    rig.isolate.streamed = 5
    rig.guest.sendall(b"x")
    rig.isolate.drop()
    rig.isolate.frame(wire.DROPPED, json.dumps({"n": n}).encode())
    assert rig.isolate.stuck is stuck and rig.isolate.streamed == 0
    assert rig.isolate.job is (None if n == 2 else first)


def test_a_drop_with_nothing_sent_ahead_or_already_asked_sends_nothing(rig: Rig) -> None:
    rig.run(rig.job(b"1"))
    rig.sent()
    rig.isolate.drop()  # nothing sent ahead
    assert rig.kinds() == [] and not rig.isolate.dropping
    rig.run(rig.job(b"2"), rig.job(b"3"))
    rig.turn()
    rig.sent()
    rig.guest.sendall(b"x")
    rig.isolate.drop()
    rig.isolate.drop()  # its answer is awaited: one DROP at a time
    assert rig.kinds() == [wire.DROP]


def test_a_drop_while_calls_wait_in_a_backlog_waits_for_the_guest_s_answer(rig: Rig) -> None:
    """A backlog holds frames the guest sent after its job's: the job may have ended."""
    rig.run(rig.job(b"1"), rig.job(b"2"))
    rig.isolate.backlog = collections.deque([(wire.CALL, b"{}")])
    assert rig.isolate.unstarted() == []
    rig.isolate.drop()
    assert rig.seen == [] and len(rig.isolate.queue) == 1 and rig.isolate.dropping


def test_a_drop_while_its_writes_wait_waits_for_the_guest_s_answer(rig: Rig) -> None:
    """A DROP not yet written whole may reach the guest after it began the next job."""
    rig.two_out()
    rig.isolate.send(wire.frame(wire.REPLY, b"x" * (4 << 20)))  # more than the socket holds
    assert rig.isolate.channel.out
    rig.isolate.drop()
    assert rig.seen == [] and len(rig.isolate.queue) == 1 and rig.isolate.dropping


def test_the_backlog_of_a_turn_is_answered_at_the_next_and_reading_resumes(rig: Rig) -> None:
    (job,) = rig.run(rig.job())
    rig.isolate.backlog = collections.deque([(wire.RESPONSE, ok(b"late"))])
    rig.isolate.channel.pause_reading()
    rig.isolate._next_turn()
    assert job.future.result().body == b"late" and rig.isolate.backlog is None
    assert rig.isolate.channel.reading and rig.seen == [("finished", None)]


def test_a_call_of_the_largest_size_is_passed_on(rig: Rig) -> None:
    head = b'{"id": 5, "name": "kv.get", "args": {"pad": "'
    tail = b'"}, "wait": true}'
    call = head + b"x" * (hostcall.MAX_BYTES - len(head) - len(tail)) + tail
    assert len(call) == hostcall.MAX_BYTES
    rig.isolate.frame(wire.CALL, call)
    assert rig.seen == [("call", 5)]
    rig.isolate.frame(wire.CALL, call + b" ")
    assert forged(rig, f"a host call the SDK would not send: its arguments are "
                       f"{hostcall.MAX_BYTES + 1} bytes of JSON (at most {hostcall.MAX_BYTES})")


def test_a_call_whose_json_cannot_be_read_is_answered_with_an_error(rig: Rig) -> None:
    rig.sent()
    rig.isolate.frame(wire.CALL, b'{"id": 12, "name": "kv.get", "args": [}')
    ((kind, payload),) = rig.sent()
    assert kind == wire.REPLY and json.loads(payload) == {"id": 12, "error": (
        "the call's arguments are JSON the PoP does not read (a lone surrogate in a "
        "string?)")}
    assert rig.seen == []


def test_a_value_frame_for_a_call_sent_as_json_is_forged(rig: Rig) -> None:
    name = "kv.get" + "x" * 70
    head = json.dumps({"id": 1, "name": name, "args": {"value": ""}, "wait": True}).encode()
    rig.isolate.frame(wire.CALL_VALUE, b"".join(wire.value_frame(wire.CALL_VALUE, head, b"v"))
                      [wire.FRAME_HEAD:])
    assert forged(rig, f"a value frame for a call the SDK sends as JSON ({said_of(name, 64)})")


def test_a_value_frame_whose_head_lies_is_forged(rig: Rig) -> None:
    rig.isolate.frame(wire.CALL_VALUE, b"\xff\xff\xff\x7f{}")
    assert forged(rig, "a value frame's head of 2147483647 bytes is longer than the 2 bytes "
                       "after its length")


@pytest.mark.parametrize("size, paused", [(10, False), (11, True)])
def test_values_waiting_past_their_bound_pause_the_socket(
        rig: Rig, monkeypatch: pytest.MonkeyPatch, size: int, paused: bool) -> None:
    monkeypatch.setattr(isolate_mod, "MAX_VALUES_WAITING", 10)
    payload = b"".join(wire.value_frame(wire.CALL_VALUE, json.dumps({
        "id": 3, "name": "kv.put", "args": {"namespace": "n", "key": "k", "value": ""},
        "wait": True}).encode(), b"v" * size))[wire.FRAME_HEAD:]
    rig.isolate.frame(wire.CALL_VALUE, payload)
    assert rig.seen == [("call", 3)] and rig.isolate.values_waiting == size
    assert rig.isolate.channel.reading is not paused


def test_an_ending_interpreter_hands_back_the_first_jobs_unasked(rig: Rig) -> None:
    _first, _second, third = rig.run(rig.job(b"1"), rig.job(b"2"), rig.job(b"3"))
    rig.isolate.frame(wire.DROPPED, b'{"n": 2, "ended": true}')
    assert rig.seen == [("requeue", b"2"), ("requeue", b"1")]
    assert rig.isolate.job is third and not rig.isolate.queue
    assert rig.isolate.uses == 3  # they were its uses: a fresh interpreter counts anew


def test_an_ending_interpreter_handing_back_all_frees_a_busy_isolate(rig: Rig) -> None:
    rig.run(rig.job(b"1"))
    rig.isolate.frame(wire.DROPPED, b'{"n": 1, "ended": true}')
    assert rig.seen == [("finished", None), ("requeue", b"1")]
    assert rig.isolate.job is None and rig.isolate.fresh


def test_an_idle_isolate_is_not_reported_free_again(rig: Rig) -> None:
    r = Rig("idle")
    try:
        r.isolate.frame(wire.DROPPED, b'{"n": 0, "ended": true}')
        assert r.seen == []
    finally:
        r.close()


def test_unstarted_takes_back_what_was_held_for_the_turn_s_end(rig: Rig) -> None:
    _first, *ahead = rig.run(rig.job(b"1"), rig.job(b"2"), rig.job(b"3"))
    assert rig.isolate.unstarted() == ahead
    assert rig.isolate.uses == 1 and not rig.isolate.queue  # they are not its uses now
    rig.turn()
    assert rig.sent() == [(wire.REQUEST, b"1")]  # b"2" and b"3" never went out
    assert rig.isolate.unstarted() == []


def test_unstarted_takes_nothing_while_the_guest_s_frames_wait_unread(rig: Rig) -> None:
    rig.run(rig.job(b"1"), rig.job(b"2"))
    rig.guest.sendall(b"x")
    assert rig.isolate.unstarted() == [] and len(rig.isolate.queue) == 1


# -- a client gone: CANCEL ---------------------------------------------------------------------
def test_a_cancel_of_the_running_job_sends_cancel(rig: Rig) -> None:
    (job,) = rig.run(rig.job())
    rig.sent()
    rig.isolate.cancel(job)
    assert rig.kinds() == [wire.CANCEL]
    rig.isolate.cancel(rig.job(b"other"))  # not its job: nothing
    assert rig.kinds() == []


def test_a_cancel_of_a_job_sent_ahead_takes_it_back(rig: Rig) -> None:
    rig.two_out()
    rig.isolate.cancel(rig.isolate.queue[0])
    assert rig.kinds() == [wire.DROP] and rig.seen == [("requeue", b"2")]


def test_a_cancel_with_jobs_behind_it_drops_them_first(rig: Rig) -> None:
    first = rig.two_out()
    rig.isolate.cancel(first)  # nothing unread: b"2" is taken back at once, then CANCEL
    assert rig.kinds() == [wire.DROP, wire.CANCEL] and rig.isolate.cancel_for is None


def test_a_cancel_waiting_for_a_drop_s_answer_is_sent_after_it(rig: Rig) -> None:
    first = rig.two_out(unread=True)
    rig.isolate.cancel(first)
    assert rig.kinds() == [wire.DROP] and rig.isolate.cancel_for is first
    rig.isolate.frame(wire.DROPPED, b'{"n": 1}')
    assert rig.kinds() == [wire.CANCEL] and rig.isolate.cancel_for is None
    assert rig.seen == [("requeue", b"2")]


def test_no_cancel_after_the_drop_s_answer_when_the_job_ended_meanwhile(rig: Rig) -> None:
    first = rig.two_out(unread=True)
    rig.isolate.cancel(first)
    rig.sent()
    rig.isolate.frame(wire.RESPONSE, ok())  # it ended first; b"2" is its job now
    rig.isolate.frame(wire.DROPPED, b'{"n": 1}')  # and it is handed back
    assert rig.kinds() == [] and rig.isolate.job is None


# -- backpressure and values -------------------------------------------------------------------
def test_pause_and_resume_follow_the_job_s_reader(rig: Rig) -> None:
    rig.isolate.pause()
    assert rig.isolate.job_paused and not rig.isolate.channel.reading
    rig.isolate.resume()
    assert not rig.isolate.job_paused and rig.isolate.channel.reading


def test_an_answered_value_call_frees_the_socket_once_under_the_bound(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolate_mod, "MAX_VALUES_WAITING", 10)
    rig.isolate.values_waiting = 15
    rig.isolate.channel.pause_reading()
    value = memoryview(b"x" * 5)
    rig.isolate.answered({"args": {"value": value}, "wait": False})  # not counted: unasked
    assert rig.isolate.values_waiting == 15
    rig.isolate.answered({"args": {"value": b"xxxxx"}, "wait": True})  # not raw: not counted
    assert rig.isolate.values_waiting == 15
    rig.isolate.answered({"args": "nope", "wait": True})
    rig.isolate.answered({"args": {"value": value}, "wait": True})
    assert rig.isolate.values_waiting == 10 and rig.isolate.channel.reading


def test_an_answered_value_call_leaves_the_socket_paused_above_the_bound(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolate_mod, "MAX_VALUES_WAITING", 10)
    rig.isolate.values_waiting = 16
    rig.isolate.channel.pause_reading()
    rig.isolate.answered({"args": {"value": memoryview(b"x" * 5)}, "wait": True})
    assert rig.isolate.values_waiting == 11 and not rig.isolate.channel.reading


def test_close_closes_its_channel_and_clock_once(rig: Rig) -> None:
    rig.isolate.frame(wire.THREAD, json.dumps({"tid": threading.get_native_id()}).encode())
    clock = rig.isolate.clock
    assert clock is not None
    rig.isolate.close()
    assert rig.isolate.state == "dead" and rig.isolate.channel.closed
    rig.isolate.close()  # again: nothing more
    rig.isolate.lost()
    assert rig.seen == [("lost", None)]


# -- JSON frames -------------------------------------------------------------------------------
@pytest.mark.parametrize("payload, expected", [
    (b'{"a": 1}', {"a": 1}), (b"[1]", {}), (b"3", {}), (b"not json", {}), (b"", {}),
    (b"[" * 5000 + b"]" * 5000, {}),
    (b'{"s": "\\ud800"}', {"s": "\ud800"}),  # a lone surrogate: json reads it
])
def test_read_json(payload: bytes, expected: dict[str, Any]) -> None:
    assert read_json(payload) == expected


def test_read_json_reads_a_large_frame_msgspec_refuses_as_nothing() -> None:
    big = b'{"s": "\\ud800", "pad": "' + b"x" * isolate_mod.RELAXED_BELOW + b'"}'
    assert read_json(big) == {}
    small = b'{"s": "\\ud800", "pad": "' + b"x" * (isolate_mod.RELAXED_BELOW - 26) + b'"}'
    assert len(small) == isolate_mod.RELAXED_BELOW and read_json(small)["s"] == "\ud800"


# -- the socket's frame bound ------------------------------------------------------------------
def through_socket(cfg: HostConfig, frame: bytes) -> tuple[Job, list[tuple[str, Any]]]:
    """`frame` written by the guest (from a thread: it outgrows the socket's buffer) to
    an isolate of `cfg` running one job; the job and what reached the pool and host."""
    async def go() -> tuple[Job, list[tuple[str, Any]]]:
        ours, guest = socket.socketpair()
        seen: list[tuple[str, Any]] = []
        host = Host(seen)
        host.cfg = cfg
        isolate = Isolate(host, ours, state="busy")
        assert isinstance(host.events, Recorder)
        host.events.isolate = isolate
        isolate.attach(asyncio.get_running_loop())
        job = Job(asyncio.get_running_loop(), b"req", raw=True)
        isolate.run(job)
        writer = threading.Thread(target=send_all, args=(guest, frame))
        writer.start()
        for _ in range(2000):
            if job.done or seen:
                break
            await asyncio.sleep(0.005)
        isolate.close()
        writer.join()
        guest.close()
        return job, seen

    return asyncio.run(go())


def test_a_response_of_the_largest_body_fits_the_socket_s_frame_bound() -> None:
    """An isolate reads frames up to its response limit and a MiB for the head, past
    the wire's own bound (`MAX_FRAME`, 64 MiB) when the limit is larger; a frame past
    that is garbage."""
    cfg = dataclasses.replace(CFG, max_response_mb=64)
    bound = max(wire.MAX_FRAME, cfg.max_response + (1 << 20))
    head = ok(b"")
    whole = wire.frame(wire.RESPONSE, ok(b"x" * cfg.max_response), wire.RESPONSE_FRAMING)
    job, seen = through_socket(cfg, whole)
    assert len(job.future.result()) == len(whole) - wire.FRAME_HEAD and seen == [
        ("finished", None)]
    over = wire.frame(wire.RESPONSE, head + b"x" * (bound - len(head)), wire.RESPONSE_FRAMING)
    assert len(over) - wire.FRAME_HEAD == bound  # with its kind byte, one past the bound
    job, seen = through_socket(cfg, over)
    assert seen == [("kill", None), ("lost", None)] and not job.future.done()


# -- calls: a share per loop turn --------------------------------------------------------------
def call(i: int) -> bytes:
    return json.dumps({"id": i, "name": "kv.get", "args": {}, "wait": True}).encode()


def test_each_turn_answers_exactly_its_share_of_calls_whatever_came_before(rig: Rig) -> None:
    rig.isolate.frame(wire.CALL, call(0))  # a lone call in a turn of its own
    rig.turn()
    del rig.seen[:]
    n = 2 * CALLS_PER_TURN + 3
    for i in range(n):  # then a flood in one read
        rig.isolate.frame(wire.CALL, call(i))
    shares = []
    while rig.seen and len(shares) < 10:
        shares.append(len(rig.seen))
        del rig.seen[:]
        rig.turn()
    assert shares == [CALLS_PER_TURN, CALLS_PER_TURN, 3]
    assert rig.isolate.backlog is None and rig.isolate.channel.reading


# -- streams one after the other ---------------------------------------------------------------
def test_the_next_job_s_stream_is_counted_from_zero(rig: Rig) -> None:
    first, second = rig.run(rig.job(b"1"), rig.job(b"2"))
    rig.isolate.frame(wire.HEAD, ok(b""))
    rig.isolate.frame(wire.CHUNK, b"x" * 10)
    rig.isolate.frame(wire.END, b"")
    rig.isolate.frame(wire.HEAD, ok(b""))
    rig.isolate.frame(wire.CHUNK, b"y" * LIMIT)  # exactly the limit: not cut
    rig.isolate.frame(wire.END, b"")
    assert stream_of(first, rig) == [b"x" * 10]
    assert stream_of(second, rig) == [b"y" * LIMIT] and wire.CANCEL not in rig.kinds()
