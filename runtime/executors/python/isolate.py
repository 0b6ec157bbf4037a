"""The PoP's side of one subinterpreter: what its frames mean for the job it runs.

An `Isolate` turns READY, RESPONSE, HEAD, CHUNK, END and ERROR frames into a
job's response (checking it, including `limits.max_response_mb`), passes CALL and
CALL_VALUE frames (a KV write, its value raw) to the pool's host-call routing,
tells the pool when its host asks to be replaced (RETIRE, or an interpreter that
fails to restart after recycling), hands back a job its fresh interpreter never
started, and tells its owner (the host) when its socket is gone. Which job it runs
is the scheduler's business.

Requests sent ahead (`pool.pipeline`): jobs sent while one runs wait in `queue`, in
the order sent, and the guest runs them in that order. The first of them becomes
the isolate's `job` when the one before it ends (its last frame arrived): every
frame of a request comes after its predecessor's last one, so from then on it may
have started, and until then it has not. A DROP takes back those not started; the
guest answers DROPPED with how many it handed back (the last ones sent), or hands
back unasked the first ones when its interpreter ends (DROPPED ``ended``). A job
taken back goes to `Events.requeue`, ahead of the waiting ones.

Its first frame, THREAD, names the host thread that serves it (sent by the host
before any function code runs): its clock (`ThreadClock`) is what the pool's CPU
watch reads.

A frame the real guest cannot send then (a second READY from an interpreter
already serving, a second RETIRE, a THREAD after the first, a READY before it) is
forged: it is treated as `garbage`, logged once and its host killed (50,000 forged
READYs in one request wrote 50,000 error lines). Guest text in the PoP's log (a
READY's error, RETIRE's why) is escaped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from edgefn_core import hostcall
from edgefn_core.abi import decode_response
from edgefn_core.errors import FunctionError, ProtocolError
from runtime.executors.output import escaped_lines, said
from runtime.executors.python import wire
from runtime.executors.python.channel import Channel
from runtime.executors.python.config import HostConfig
from runtime.executors.python.job import Job
from runtime.executors.python.thread_clock import ThreadClock
from runtime.net.message import Response

log = logging.getLogger("edgefn.isolates")
functions_log = logging.getLogger("edgefn.functions")  # what functions log, and their tracebacks

# Host calls one isolate gets answered per turn of the PoP's loop: past them its frames
# wait (and its socket is not read) until the next turn, so a guest that writes
# thousands of CALL frames at once holds the loop no longer than these take.
CALLS_PER_TURN = 16
RELAXED_BELOW = 64 << 10  # bytes of a frame msgspec refuses that json may still read
# frames whose JSON the guest keeps small (an ERROR's traceback is cut to its last 64 KiB
# before it is sent): one bigger is forged, and refused before it is parsed (a 50 MB
# ERROR frame froze every tenant for 6 s)
SMALL = (wire.READY, wire.RETIRE, wire.ERROR, wire.THREAD, wire.DROPPED)
MAX_SMALL_FRAME = 256 << 10
CALL_ID = re.compile(rb'\{"id": ([0-9]{1,12}),')  # how the SDK's json.dumps starts a CALL
CALLS = (wire.CALL, wire.CALL_VALUE)
# what a guest (or its host, for RETIRE and THREAD) sends but RESPONSE: any other kind is
# forged (a flood of 5-byte frames of an unknown kind, read and dropped one by one, took
# other tenants' p99 from 3 to 70 ms)
KINDS = frozenset({wire.READY, wire.RETIRE, wire.THREAD, wire.CALL, wire.CALL_VALUE,
                   wire.DROPPED, wire.HEAD, wire.CHUNK, wire.END, wire.ERROR})
# bytes of raw values in calls handed on and not answered yet past which an isolate's
# socket is not read until some are: read raw, 100 forged 16 MiB puts queued 1.4 GB in
# the PoP in 6 s (the SDK makes one call at a time: a value, and those of calls its cut
# requests left running)
MAX_VALUES_WAITING = 64 << 20

# What a guest's ERROR kind becomes: (FunctionError code, HTTP status).
ERRORS = {"exception": ("trap", 500), "binding": ("binding", 500),
          "cpu_limit": ("cpu_limit", 503), "memory_limit": ("memory_limit", 503),
          "wall_limit": ("wall_limit", 504), "bad_response": ("bad_response", 502)}


class Events(Protocol):
    """What the pool does with an isolate's news."""

    def started(self, isolate: Isolate) -> None:
        """A fresh interpreter said READY."""

    def finished(self, isolate: Isolate) -> None:
        """Its job reached its last frame."""

    def call(self, isolate: Isolate, msg: dict[str, Any]) -> None:
        """The guest called into the PoP."""

    def retiring(self, isolate: Isolate, why: str) -> None:
        """Its host asks to be replaced (it is running out of room); it still serves."""

    def requeue(self, isolate: Isolate, job: Job) -> None:
        """It ended without running `job` (its fresh interpreter failed to start), or
        handed back `job`, sent ahead and not started."""

    def begun(self, isolate: Isolate, job: Job) -> None:
        """`job`, sent ahead, is the isolate's job now: the one before it ended."""


class Owner(Protocol):
    """The isolate-host process an isolate lives in."""

    cfg: HostConfig
    generation: int
    events: Events
    retiring: bool

    @property
    def pid(self) -> int: ...

    def lost(self, isolate: Isolate) -> None:
        """The isolate's socket closed."""

    def kill(self) -> None:
        """Kill the whole host process."""

    def others(self) -> float | None:
        """Seconds of CPU its threads other than its main and isolate threads used."""


class Isolate:
    def __init__(self, owner: Owner, sock: socket.socket, state: str = "starting") -> None:
        # Global state: for the life of its socket
        self.owner = owner
        self.cfg = owner.cfg
        self.max_response = self.cfg.max_response  # bytes of a body, at most
        self.generation = owner.generation
        # a whole response up to its limit (and its head) fits one frame
        self.max_frame = max(wire.MAX_FRAME, self.cfg.max_response + (1 << 20))
        self.channel = Channel(sock, self, self.max_frame, self.cfg.owner)
        self.state = state  # unstarted | starting | idle | busy | recycling | dead
        self.sent = 0  # jobs sent to it, ever (its host's CPU look: `Host._look`)
        # Per-interpreter state (recycling starts a new interpreter on the same socket)
        self.uses = 0
        self.recycling = False  # its interpreter is replaced after the job in flight
        # a fresh interpreter may say READY: before its first job, and after each job (it
        # recycled, or restarted because the job left a thread it could not stop)
        self.fresh = True
        self.retire_sent = False  # its host sends RETIRE once
        self.clock: ThreadClock | None = None  # of the host thread serving it (THREAD)
        # Per-job state
        self.job: Job | None = None
        self.queue: deque[Job] = deque()  # sent ahead, behind `job`, not started
        self.dropping = False  # a DROP is unanswered: nothing more is sent ahead
        self.since = 0.0  # when its current job started (the scheduler's clock)
        self.taken = 0  # jobs that DROP took back at once (`drop`), for its answer to confirm
        self.cancel_for: Job | None = None  # CANCEL it once the DROP is answered
        self.stuck = False  # its job ended early (timed out, cut); frames are dropped until its end
        self.streamed = 0
        # Fairness: CALL frames answered this loop turn, and the frames that wait for the next
        self.turn_calls = 0
        self.backlog: deque[tuple[bytes, bytes]] | None = None
        self.job_paused = False  # the job's reader asked for no more frames (`pause`)
        self.values_waiting = 0  # bytes of raw values in calls not answered yet

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.channel.attach(loop)

    def send(self, data: bytes) -> None:
        self.channel.send(data)

    def run(self, job: Job) -> None:
        """Send `job`: it runs now if the isolate has none, else after those sent."""
        self.sent += 1
        frame = job.frame
        if self.job is None:  # at once: its thread starts while the loop goes on
            self.job = job
            self.streamed = 0
            self.send(frame)
        else:  # it is busy: with the others sent ahead in this turn, one write, one wake-up
            self.queue.append(job)
            self.channel.send_soon(frame)

    def cancel(self, job: Job) -> None:
        """`job`'s client went away: tell the guest to stop it (a CANCEL applies to
        the last request sent, so those sent after it are taken back first), or take
        it back if it was sent ahead."""
        if job in self.queue:
            self.drop()
            return
        if job is not self.job:
            return
        if self.queue:
            self.cancel_for = job
            self.drop()
            if self.queue:  # not taken back at once: CANCEL once the guest answers
                return
            self.cancel_for = None
        self.send(wire.frame(wire.CANCEL))

    def drop(self) -> None:
        """Ask the guest for the jobs sent ahead that have not started (DROP). When
        the DROP went out whole while nothing the guest sent waits unread (so the job
        before them has not sent its last frame), the guest sees the DROP before it
        could start them (it reads all it has before starting one): they go
        elsewhere at once, and its answer only confirms them."""
        if not self.queue or self.dropping or self.state == "dead":
            return
        self.dropping = True
        self.send(wire.frame(wire.DROP))
        channel = self.channel
        if channel.out or channel.closed or self.backlog is not None or channel.unread():
            return  # not sure: its answer says which it hands back
        jobs, self.queue = list(self.queue), deque()
        self.taken = len(jobs)
        self.uses -= len(jobs)
        for job in reversed(jobs):  # each goes first in line: the first sent ends first
            self.owner.events.requeue(self, job)

    def unstarted(self) -> list[Job]:
        """Take the jobs sent ahead if none can have started (its socket holds
        nothing unread, no frame waits in a backlog: the job before them did not
        end), for another isolate; [] if one may have. Those whose frames wait for
        the end of the loop's turn (`Channel.send_soon`) are never sent then: the
        isolate ended, and they run elsewhere."""
        if not self.queue or self.backlog is not None or self.channel.unread():
            return []
        self.channel.forget_held()  # only requests sent ahead are held: these
        jobs, self.queue = list(self.queue), deque()
        self.uses -= len(jobs)
        return jobs

    def pause(self) -> None:
        """Backpressure from the job's reader: read no frames until `resume`."""
        self.job_paused = True
        self.channel.pause_reading()

    def resume(self) -> None:
        self.job_paused = False
        self._read_if_free()

    def answered(self, msg: dict[str, Any]) -> None:
        """Call `msg` (handed on by `_call`, its guest waiting) was answered."""
        value = msg["args"].get("value") if isinstance(msg.get("args"), dict) else None
        if isinstance(value, memoryview) and msg.get("wait"):
            self.values_waiting -= len(value)
            self._read_if_free()

    def _read_if_free(self) -> None:
        """Read the socket again unless the job's reader, a backlog of calls or the
        values of calls not answered yet hold it."""
        if not self.job_paused and self.backlog is None \
                and self.values_waiting <= MAX_VALUES_WAITING:
            self.channel.resume_reading()

    def close(self) -> None:
        if self.state != "dead":
            self.state = "dead"
            self.channel.close()
        if self.clock is not None:
            self.clock.close()

    # -- Receiver: what the channel reports ----------------------------------------------------
    def lost(self) -> None:
        self.owner.lost(self)

    def room(self) -> int:
        """The largest frame the guest may send now: a whole response, or a host
        call's value, while it runs a request; between requests only its small
        frames (READY, RETIRE, THREAD, DROPPED)."""
        return MAX_SMALL_FRAME if self.job is None else self.max_frame

    def garbage(self, err: ProtocolError) -> None:
        log.error("%s: isolate sent garbage (%s); killing its host", self.cfg.name, err)
        self.owner.kill()
        self.owner.lost(self)

    def frame(self, kind: bytes, payload: bytes) -> None:
        """One frame from the guest, in order; CALL frames past `CALLS_PER_TURN` in
        one loop turn wait, with every frame after them, for the next turn."""
        if self.state == "dead":
            return  # closed by an earlier frame of the same read (garbage, stopped)
        if self.backlog is not None:
            self.backlog.append((kind, payload))
            return
        if kind == wire.RESPONSE:  # most frames: tested first, here (a call less)
            if self.job is not None:  # else a late frame of a job that already ended
                self._finish(None, payload)
            return
        if kind in CALLS:
            if self.turn_calls >= CALLS_PER_TURN:
                self.backlog = deque([(kind, payload)])
                self.channel.pause_reading()
                return
            if self.turn_calls == 0 and self.channel.loop is not None:
                self.channel.loop.call_soon(self._next_turn)
            self.turn_calls += 1
        self._frame(kind, payload)

    def _next_turn(self) -> None:
        """A new loop turn: answer waiting frames up to the turn's share of calls."""
        self.turn_calls = 0
        backlog, self.backlog = self.backlog, None
        while backlog and self.state != "dead":
            if backlog[0][0] in CALLS and self.turn_calls >= CALLS_PER_TURN:
                self.backlog = backlog  # the next turn goes on (it is scheduled)
                return
            self.frame(*backlog.popleft())
        self._read_if_free()

    def _frame(self, kind: bytes, payload: bytes) -> None:
        """Any frame but RESPONSE (`frame` finishes a job with that at once)."""
        if kind not in KINDS:
            self.garbage(ProtocolError(f"a frame of kind {kind!r}, which no guest sends"))
            return
        if self.state == "unstarted" and kind in CALLS:  # no interpreter reads its socket
            # another isolate of its host wrote the call there: its answer (a 16 MiB KV
            # value each, up to MAX_UNREAD) waited for a reader that never came
            self.garbage(ProtocolError("a host call from an isolate not started (another "
                                       "isolate of its host wrote it)"))
            return
        if kind in SMALL and len(payload) > MAX_SMALL_FRAME:  # before it is parsed
            self.garbage(ProtocolError(f"a frame {kind!r} of {len(payload)} bytes (at "
                                       f"most {MAX_SMALL_FRAME}; the guest sends less)"))
            return
        if kind == wire.READY:
            self._ready(read_json(payload))
        elif kind == wire.RETIRE:
            if self.retire_sent:
                self.garbage(ProtocolError("a second RETIRE (its host sends one)"))
                return
            self.retire_sent = True
            self.owner.events.retiring(self, said(str(read_json(payload).get("why", ""))))
        elif kind == wire.THREAD:
            if (why := self.thread(payload)) is not None:
                self.garbage(ProtocolError(why))
        elif kind == wire.CALL:
            self._call(payload)
        elif kind == wire.CALL_VALUE:
            self._call_value(payload)
        elif kind == wire.DROPPED:
            self._dropped(read_json(payload))
        elif self.job is None:
            return  # a late frame of a job that already ended
        elif kind == wire.HEAD:
            self._head(self.job, payload)
        elif kind == wire.CHUNK:
            self._chunk(self.job, payload)
        elif kind == wire.END:
            self._finish(Job.end_stream)
        elif kind == wire.ERROR:
            self._error(read_json(payload))

    # -- frames ---------------------------------------------------------------------------------
    def _call(self, payload: bytes, value: memoryview | None = None) -> None:
        """A host call: its JSON `payload`, and the `value` a CALL_VALUE carried raw
        (counted as the base64 it was in JSON, so the bounds are those of a CALL)."""
        if (why := hostcall.refused(payload, 0 if value is None else len(value))) is not None:
            # the SDK refuses such a call before sending it: only a forged frame
            self.garbage(ProtocolError(f"a host call the SDK would not send: {why}"))
            return
        msg = read_json(payload)
        if not msg and (m := CALL_ID.match(payload)) is not None:  # answer, not drop:
            # its guest waits for the reply (to its wall limit, had it been dropped)
            self.send(wire.json_frame(wire.REPLY, {"id": int(m[1]), "error": (
                "the call's arguments are JSON the PoP does not read (a lone "
                "surrogate in a string?)")}))
            return
        if value is not None:
            args = msg.get("args")
            if msg.get("name") not in wire.VALUE_CALLS or not isinstance(args, dict):
                self.garbage(ProtocolError(f"a value frame for a call the SDK sends as JSON "
                                           f"({said(str(msg.get('name')), 64)})"))
                return
            msg["args"] = {**args, "value": value}  # where the SDK's JSON holds ""
            if msg.get("wait"):  # else it is dropped unanswered (`HostCalls.handle`)
                self.values_waiting += len(value)
        self.owner.events.call(self, msg)  # may answer it at once (`answered`)
        if self.values_waiting > MAX_VALUES_WAITING:
            self.channel.pause_reading()

    def _call_value(self, payload: bytes) -> None:
        """A CALL_VALUE frame: a head whose length lies is forged (the SDK writes it)."""
        try:
            head, value = wire.split_value(payload)
        except ProtocolError as e:
            self.garbage(e)
            return
        self._call(head, value)

    def thread(self, payload: bytes) -> str | None:
        """A THREAD frame: open the clock of the thread it names; what is wrong with
        it (the host sends one, first, naming one of its threads), or None."""
        tid = read_json(payload).get("tid")
        if self.clock is not None:
            return "a second THREAD frame (its host sends one, before any function code)"
        if type(tid) is not int or tid <= 0:
            return f"a THREAD frame without a thread id ({said(str(tid), 64)})"
        try:
            self.clock = ThreadClock(self.owner.pid, tid)
        except OSError:
            return f"a THREAD frame naming no thread of its host ({tid})"
        return None

    def _dropped(self, info: dict[str, Any]) -> None:
        """The guest handed back jobs it had not started: the last ones sent (the
        answer to a DROP, less those `drop` took back at once) or, its interpreter
        ending, the first ones (``ended``). More than it was sent is forged."""
        n, ended = info.get("n"), info.get("ended") is True
        if not ended:
            if not self.dropping:
                self.garbage(ProtocolError("a DROPPED frame answering no DROP"))
                return
            self.dropping = False
            taken, self.taken = self.taken, 0
            if taken:  # those it took back at once: the guest confirms them, and may hand
                # back the one the PoP runs next too (its predecessor ended, it had not begun)
                if type(n) is not int or n < taken:
                    self.garbage(ProtocolError(f"a DROPPED frame handing back {said(str(n), 64)} "
                                               f"requests where {taken} could not have started"))
                    return
                n -= taken
        jobs = ([self.job] if self.job is not None else []) + list(self.queue)
        if type(n) is not int or not 0 <= n <= len(jobs):
            self.garbage(ProtocolError(f"a DROPPED frame handing back {said(str(n), 64)} of "
                                       f"{len(jobs)} requests"))
            return
        back = jobs[:n] if ended else jobs[len(jobs) - n:]
        kept = jobs[n:] if ended else jobs[:len(jobs) - n]
        if not ended:
            self.uses -= n  # never served by this interpreter
        if self.job is not None and (not kept or kept[0] is not self.job):
            self.stuck = False  # the job it expected next was not started
        self.job = kept[0] if kept else None
        self.queue = deque(kept[1:])
        self.streamed = 0
        cancel, self.cancel_for = self.cancel_for, None
        if cancel is not None and cancel is self.job and not self.queue and not cancel.done:
            self.send(wire.frame(wire.CANCEL))
        if self.job is None and self.state == "busy":  # free before they go elsewhere
            self.fresh = True
            self.owner.events.finished(self)
        for job in reversed(back):  # each goes first in line: the first sent ends first
            self.owner.events.requeue(self, job)

    def _ready(self, info: dict[str, Any]) -> None:
        if info.get("ok"):
            if self.clock is None:  # the host's THREAD comes first
                self.garbage(ProtocolError("a READY before its host's THREAD frame"))
                return
            if not self.fresh:  # it serves already: no interpreter started since its last READY
                self.garbage(ProtocolError("a READY from an interpreter already serving"))
                return
            self.fresh = False
            if self.job is not None:  # handed to it as its last interpreter ended (a thread
                # it could not stop, or it recycled with requests sent ahead unread): the
                # fresh one runs them, and they still own the isolate
                log.error("%s: isolate restarted during a request", self.cfg.name)
                self.recycling = False
                self.uses = 1 + len(self.queue)
                self.owner.events.begun(self, self.job)  # its CPU counts from here
                return
            self.owner.events.started(self)
        elif info.get("recycling"):
            if self.job is None or self.recycling:  # said once, during the job it ends after
                self.garbage(ProtocolError("a recycling READY outside a request, or twice"))
                return
            self.recycling = True  # takes effect when the job in flight ends
        else:  # the guest's text: escaped (one line)
            if info.get("stopped"):  # its host is being replaced (it asked): no error
                log.warning("%s: isolate stopped: %s", self.cfg.name,
                            said(str(info["stopped"])))
            else:
                log.error("%s: isolate failed to start: %s", self.cfg.name,
                          said(str(info.get("error"))))
            if self.state == "recycling":  # it started before: its host is failing
                self.owner.events.retiring(self, "an isolate failed to restart")
            # a job sent while its last interpreter ended unannounced (a thread it could
            # not stop) was never read, nor those sent ahead after what it handed back:
            # they go to another isolate
            jobs = ([self.job] if self.job is not None else []) + list(self.queue)
            self.job, self.queue = None, deque()
            self.close()
            for job in reversed(jobs):  # each goes first in line
                self.owner.events.requeue(self, job)

    def _response(self, payload: bytes) -> Response:
        """Raises `FunctionError` (bad_response) for an invalid or oversized response."""
        return response_of(payload, self.cfg)

    def _head(self, job: Job, payload: bytes) -> None:
        try:
            status, headers, _ = decode_response(payload)
        except FunctionError as e:  # answer now; drop the stream until its last frame
            job.fail(e)
            self.stuck = True
            return
        if not self.stuck:
            job.start_stream(status, headers)

    def _chunk(self, job: Job, payload: bytes) -> None:
        if self.stuck or job.chunks is None:
            return
        self.streamed += len(payload)
        if self.streamed > self.max_response:  # cut the stream; the guest stops at CANCEL
            job.fail(FunctionError("bad_response", 502, f"streamed response body exceeded the "
                                   f"limit of {self._limit()}; the stream was cut"))
            self.stuck = True
            self.cancel(job)
            return
        job.chunk(payload)

    def _error(self, info: dict[str, Any]) -> None:
        if info.get("traceback"):
            # its end says where it failed; a line count bound too ("\nx" * 10M made 10M
            # log lines, 290 MB, in one record)
            tail = "\n".join(str(info["traceback"])[-wire.MAX_TRACEBACK:].split("\n")[-200:])
            functions_log.error("%s: %s", self.cfg.label,
                                escaped_lines(self.cfg.label, tail.rstrip()))
        code, status = ERRORS.get(str(info.get("kind")), ERRORS["exception"])
        message = str(info.get("message", "failed"))  # FunctionError keeps 4 KiB of it
        self._finish(lambda job: job.fail(FunctionError(code, status, message)))

    def _finish(self, deliver: Callable[[Job], object] | None, response: bytes = b"") -> None:
        """The job's last frame: deliver it (None: the RESPONSE frame's payload
        `response`; unless the job already ended), then tell the pool the isolate
        is free."""
        job, self.job = self.job, None
        if job is not None:
            if not self.stuck:
                try:
                    if deliver is None:  # (a raw job's checked where it is written)
                        job.respond(response if job.raw else self._response(response))
                    else:
                        deliver(job)
                except FunctionError as e:  # the response itself was invalid
                    job.fail(e)
            if not job.future.done():  # e.g. END without a HEAD: never leave it hanging
                job.fail(FunctionError("bad_response", 502,
                                       "isolate ended the request without a response"))
            job.end()
        self.stuck = False
        self.fresh = True  # its interpreter may recycle or restart now
        if self.queue:  # the next one sent ahead starts now, or in the next interpreter
            self.job = self.queue.popleft()  # (it said it recycles: from its READY on)
            self.streamed = 0
            if not self.recycling:
                self.owner.events.begun(self, self.job)
            return
        self.owner.events.finished(self)

    def _limit(self) -> str:
        return _limit(self.cfg)


def response_of(payload: bytes, cfg: HostConfig) -> Response:
    """A RESPONSE frame's payload as the function's response. Raises `FunctionError`
    (bad_response) for an invalid one, or one whose body is over the function's
    `limits.max_response_mb`."""
    status, headers, body = decode_response(payload)
    if len(body) > cfg.max_response:
        raise FunctionError("bad_response", 502, f"response body of {len(body)} bytes "
                            f"exceeds the limit of {_limit(cfg)}")
    return Response(status, headers, body)


def _limit(cfg: HostConfig) -> str:
    return f"{cfg.max_response} bytes (limits.max_response_mb = {cfg.max_response_mb})"


def read_json(payload: bytes) -> dict[str, Any]:
    """A JSON object frame's payload; {} for anything else (nested past the decoder's
    depth too: the RecursionError escaped the reader, and the response read with it
    was lost; and numbers too slow to parse, `hostcall.huge_numbers`: 256 KiB of 1e300
    held the loop ~0.4 s)."""
    if hostcall.huge_numbers(payload) is not None:
        return {}
    try:
        obj = msgspec.json.decode(payload)
    except msgspec.DecodeError:  # what the SDK's json.dumps writes and msgspec refuses
        if len(payload) > RELAXED_BELOW:  # (a lone surrogate), read again, small only:
            return {}  # a large one ending in NaN was parsed twice, the second by json
        try:
            obj = json.loads(payload)
        except (ValueError, RecursionError):
            return {}
    except RecursionError:
        return {}
    return obj if isinstance(obj, dict) else {}
