"""`access_log`: one structured line per request on stderr.

    ts=2026-11-30T11:00:00.123Z method=GET path=/hello status=200 fn=hello@1a2b3c4d
    dur_ms=0.21 bytes=13 rid=9f2c41d0aa3e-1 client=127.0.0.1

(one line; ``ts`` is when the request arrived; ``format = "json"`` writes the same
fields, plus per-stage timings, as a JSON object). A streamed response is logged
when its stream ends, with the bytes actually sent. Lines are buffered and
written once per event-loop iteration, so a busy PoP pays one write for many
requests.

With an ``events`` stage in the pipeline, the log is written from each request's
`Event` (an observer: `AccessLog.observe`) instead of gathering the same fields a
second time as a stage: `runtime.pipeline.build` decides. The native lane's events
come as an `EventBatch` whose lines its C already wrote in this log's format
(`observe_batch`; tests/observe/events/test_batch.py holds them to `observe`'s bytes).
"""

from __future__ import annotations

import asyncio
import sys
import time
from functools import partial
from typing import IO

import msgspec

from runtime.config import AccessLogStage
from runtime.net.message import Request, Response
from runtime.observe.batch import EventBatch
from runtime.observe.event import Event
from runtime.pipeline.stage import Context, Next, Result, counted, then

TEXT = b"ts=%s.%03dZ method=%s path=%s status=%d fn=%s dur_ms=%.3f bytes=%d rid=%s client=%s\n"
TEXT_STR = "ts=%s.%03dZ method=%s path=%s status=%d fn=%s dur_ms=%.3f bytes=%d rid=%s client=%s\n"
_time, _clock = time.time, time.perf_counter


class AccessLog:
    name = "access_log"

    def __init__(self, config: AccessLogStage, stream: IO[bytes] | None = None) -> None:
        self.json = config.format == "json"
        self.stream = stream
        self.lines: list[bytes] = []
        self.flush_scheduled = False
        self._second = -1
        self._stamp = b""
        self._stamp_text = ""  # the same second as text: the event's line is a str
        self._labels: dict[str, bytes] = {"-": b"-"}

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        result = call_next(request, ctx)
        if isinstance(result, Response):
            return self._log(result, request, ctx)
        return then(result, self._log, request, ctx)

    def _log(self, response: Response, request: Request, ctx: Context) -> Response:
        body = response.body
        if isinstance(body, bytes):  # a HEAD's body is not sent
            self.write(request, ctx, response.status,
                       len(body) if request.method != b"HEAD" else 0)
        elif request.method == b"HEAD":  # the front takes a chunk and sends none
            response.body = counted(body, lambda _: self.write(request, ctx, response.status, 0))
        else:
            response.body = counted(body, partial(self.write, request, ctx, response.status))
        return response

    def write(self, request: Request, ctx: Context, status: int, size: int) -> None:
        if ctx.quiet:  # a warm-up is not logged
            return
        duration = (_clock() - ctx.started) * 1000
        arrived = _time() - duration / 1000
        stamp = self._stamp_of(int(arrived))
        label = ctx.target.label if ctx.target is not None else "-"
        fn = self._labels.get(label) or self._labels.setdefault(label, label.encode())
        if self.json:
            line = self._json(request.method.decode(), request.path.decode("latin-1"), status,
                              fn.decode(), duration, size, ctx.request_id.decode(), ctx.ip,
                              ctx.timings(), arrived)
        else:
            # the path as sent: the HTTP front lets no space or control byte through
            line = TEXT % (stamp, (arrived % 1) * 1000, request.method, request.path,
                           status, fn, duration, size, ctx.request_id or b"-",
                           ctx.ip.encode())
        self._add(line)

    def observe(self, event: Event) -> None:
        """The request's line, from its `Event` (fields the events stage gathered)."""
        if self.json:
            line = self._json(event.method, event.path, event.status, event.target or "-",
                              event.duration_ms, event.bytes_out, event.rid, event.client,
                              event.stages_ms, event.ts)
        else:
            ts = event.ts
            if int(ts) != self._second:
                self._stamp_of(int(ts))
            line = (TEXT_STR % (self._stamp_text, ts % 1 * 1000, event.method, event.path,
                                event.status, event.target or "-", event.duration_ms,
                                event.bytes_out, event.rid or "-", event.client)
                    ).encode("latin-1", "replace")
        self._add(line)

    @property
    def line_format(self) -> str:
        """The format of the lines `observe_batch` takes from an `EventBatch` as they
        are (its producer wrote them as `observe` would: ``text`` or ``json``)."""
        return "json" if self.json else "text"

    def observe_batch(self, batch: EventBatch) -> None:
        """The lines of `batch`'s events: its `lines` as they are when written in this
        log's format, else each event's (`observe`)."""
        if batch.lines is not None and batch.line_format == self.line_format:
            if batch.lines:
                self._add(batch.lines)
        else:
            for event in batch.events:
                self.observe(event)

    def _stamp_of(self, second: int) -> bytes:
        if second != self._second:
            self._second = second
            self._stamp_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._stamp = self._stamp_text.encode()
        return self._stamp

    def _add(self, line: bytes) -> None:
        self.lines.append(line)
        if not self.flush_scheduled:
            self._schedule()

    def _schedule(self) -> None:
        self.flush_scheduled = True
        try:
            asyncio.get_running_loop().call_soon(self.flush)
        except RuntimeError:  # no loop (a direct call in a test): write now
            self.flush()

    def _json(self, method: str, path: str, status: int, fn: str, duration: float, size: int,
              rid: str, client: str, stages: dict[str, float], arrived: float) -> bytes:
        ts = b"%s.%03dZ" % (self._stamp_of(int(arrived)), (arrived % 1) * 1000)
        return msgspec.json.encode({
            "ts": ts.decode(), "method": method, "path": path, "status": status, "fn": fn,
            "dur_ms": round(duration, 3), "bytes": size, "rid": rid, "client": client,
            "stages": stages}) + b"\n"

    def flush(self) -> None:
        self.flush_scheduled = False
        lines, self.lines = self.lines, []
        stream = self.stream or sys.stderr.buffer
        try:
            stream.write(b"".join(lines))
            stream.flush()
        except (OSError, ValueError):  # stderr closed or a broken pipe: drop, keep serving
            pass
