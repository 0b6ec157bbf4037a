"""`access_log`: one structured line per request on stderr.

    ts=2026-11-30T11:00:00Z method=GET path=/hello status=200 fn=hello@1a2b3c4d
    dur_ms=0.21 bytes=13 rid=9f2c41d0aa3e-1 client=127.0.0.1:50312

(one line; ``format = "json"`` writes the same fields, plus per-stage timings, as
a JSON object). A streamed response is logged when its stream ends, with the
bytes actually sent. Lines are buffered and written once per event-loop
iteration, so a busy PoP pays one write for many requests.
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
from runtime.pipeline.stage import Context, Next, Result, counted, then

TEXT = b"ts=%s.%03dZ method=%s path=%s status=%d fn=%s dur_ms=%.3f bytes=%d rid=%s client=%s\n"
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
        self._labels: dict[str, bytes] = {"-": b"-"}

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        result = call_next(request, ctx)
        if isinstance(result, Response):
            return self._log(result, request, ctx)
        return then(result, self._log, request, ctx)

    def _log(self, response: Response, request: Request, ctx: Context) -> Response:
        body = response.body
        if isinstance(body, bytes):
            self.write(request, ctx, response.status, len(body))
        else:
            response.body = counted(body, partial(self.write, request, ctx, response.status))
        return response

    def write(self, request: Request, ctx: Context, status: int, size: int) -> None:
        now = _time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)).encode()
        label = ctx.target.label if ctx.target is not None else "-"
        fn = self._labels.get(label) or self._labels.setdefault(label, label.encode())
        duration = (_clock() - ctx.started) * 1000
        if self.json:
            line = self._json(request, ctx, status, size, fn, duration, now)
        else:
            # the path as sent: the HTTP front lets no space or control byte through
            line = TEXT % (self._stamp, (now - second) * 1000, request.method, request.path,
                           status, fn, duration, size, ctx.request_id or b"-",
                           ctx.client.encode())
        self.lines.append(line)
        if not self.flush_scheduled:
            self._schedule()

    def _schedule(self) -> None:
        self.flush_scheduled = True
        try:
            asyncio.get_running_loop().call_soon(self.flush)
        except RuntimeError:  # no loop (a direct call in a test): write now
            self.flush()

    def _json(self, request: Request, ctx: Context, status: int, size: int, label: bytes,
              duration: float, now: float) -> bytes:
        ts = b"%s.%03dZ" % (self._stamp, (now - int(now)) * 1000)
        return msgspec.json.encode({
            "ts": ts.decode(), "method": request.method.decode(),
            "path": request.path.decode("latin-1"), "status": status, "fn": label.decode(),
            "dur_ms": round(duration, 3), "bytes": size, "rid": ctx.request_id.decode(),
            "client": ctx.client, "stages": ctx.timings()}) + b"\n"

    def flush(self) -> None:
        self.flush_scheduled = False
        lines, self.lines = self.lines, []
        stream = self.stream or sys.stderr.buffer
        try:
            stream.write(b"".join(lines))
            stream.flush()
        except (OSError, ValueError):  # stderr closed or a broken pipe: drop, keep serving
            pass
