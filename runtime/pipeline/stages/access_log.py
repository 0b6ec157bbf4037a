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
from collections.abc import AsyncIterator
from typing import IO

import msgspec

from runtime.config import AccessLogStage
from runtime.net.message import Request, Response
from runtime.pipeline.stage import Context, Next, Result, then


class AccessLog:
    name = "access_log"

    def __init__(self, config: AccessLogStage, stream: IO[str] | None = None) -> None:
        self.json = config.format == "json"
        self.stream = stream
        self.lines: list[str] = []
        self.flush_scheduled = False
        self._second = -1
        self._stamp = ""

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        def log(response: Response) -> Response:
            if isinstance(response.body, bytes):
                self.write(request, ctx, response.status, len(response.body))
            else:
                response.body = self._counted(request, ctx, response.status, response.body)
            return response

        return then(call_next(request, ctx), log)

    async def _counted(self, request: Request, ctx: Context, status: int,
                       body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        sent = 0
        try:
            async for chunk in body:
                sent += len(chunk)
                yield chunk
        finally:
            aclose = getattr(body, "aclose", None)
            if aclose is not None:
                await aclose()
            self.write(request, ctx, status, sent)

    def write(self, request: Request, ctx: Context, status: int, size: int) -> None:
        target = ctx.target.label if ctx.target is not None else "-"
        duration = round(ctx.elapsed_ms(), 3)
        path = request.path.decode("latin-1")
        if self.json:
            line = msgspec.json.encode({
                "ts": self._now(), "method": request.method.decode(), "path": path,
                "status": status, "fn": target, "dur_ms": duration, "bytes": size,
                "rid": ctx.request_id, "client": ctx.client, "stages": ctx.timings()}).decode()
        else:
            line = (f"ts={self._now()} method={request.method.decode()} path={_quote(path)} "
                    f"status={status} fn={target} dur_ms={duration} bytes={size} "
                    f"rid={ctx.request_id or '-'} client={ctx.client}")
        self.lines.append(line)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop (a direct call in a test): write now
                self.flush()

    def flush(self) -> None:
        self.flush_scheduled = False
        lines, self.lines = self.lines, []
        stream = self.stream or sys.stderr
        try:
            stream.write("\n".join(lines) + "\n")
            stream.flush()
        except (OSError, ValueError):  # stderr closed or a broken pipe: drop, keep serving
            pass

    def _now(self) -> str:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._stamp}.{int((now - second) * 1000):03d}Z"


def _quote(text: str) -> str:
    """logfmt quoting: only values with spaces, quotes or ``=`` get quotes."""
    if any(c in text for c in ' "='):
        return msgspec.json.encode(text).decode()
    return text
