"""`events`: one `Event` per request, handed to the PoP's `Observers` once the
response is done (a streamed body: when its stream ends or the client goes
away, with the bytes actually sent).

Placed right after ``request_id``, it sees the final response of everything
after it, contained errors and refusals included. The event is a msgspec
Struct holding references to what the stages recorded (``ctx.decisions`` is
not copied); nothing is encoded here. Sampling (`[events] sample`, errors always
kept) marks an event for the ring and the file only; redaction applies before
any observer sees it.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec

from runtime.config import PopConfig
from runtime.net.message import Request, Response
from runtime.observe.event import AIUsage, Event
from runtime.observe.observers import Observers
from runtime.observe.redact import Redactor, scrub
from runtime.pipeline.stage import Context, Next, Result, then

AI_OPERATIONS = {"/v1/chat/completions": "chat", "/v1/completions": "text_completion",
                 "/v1/embeddings": "embeddings", "/v1/rerank": "rerank"}


class _Asked(msgspec.Struct):
    model: str = ""
    stream: bool = False


class Events:
    name = "events"

    def __init__(self, config: PopConfig, observers: Observers,
                 clock: Callable[[], float] = time.time,
                 rand: Callable[[], float] = random.random) -> None:
        settings = config.events
        self.observers = observers
        self.pop, self.tier, self.geo = config.name, config.tier, config.geo
        self.sample = settings.sample
        self.prompts = settings.prompts
        self.redact = Redactor(settings.redact) if settings.redact else None
        self.clock, self.rand = clock, rand

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        ts = self.clock()
        result = call_next(request, ctx)
        if isinstance(result, Response):
            return self._done(result, request, ctx, ts)
        return then(result, self._done, request, ctx, ts)

    def _done(self, response: Response, request: Request, ctx: Context, ts: float) -> Response:
        body = response.body
        if isinstance(body, bytes):
            self.emit(request, ctx, response, ts, len(body))
        else:
            response.body = self._counted(request, ctx, response, ts, body)
        return response

    async def _counted(self, request: Request, ctx: Context, response: Response, ts: float,
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
            self.emit(request, ctx, response, ts, sent)

    def emit(self, request: Request, ctx: Context, response: Response, ts: float,
             sent: int) -> None:
        """Build the event and hand it to every observer."""
        status = response.status
        decisions = ctx.decisions
        ai = decisions.pop("ai", None) if decisions else None
        if decisions and ai is None and "ai_cache" in decisions:
            ai = _cached(request, decisions["ai_cache"])
        if ai is not None and ai.prompt is not None:
            ai.prompt = scrub(ai.prompt) if self.prompts else None
        who, target = ctx.principal, ctx.target
        event = Event(
            ts=ts, rid=ctx.request_id.decode("latin-1"), pop=self.pop, tier=self.tier,
            geo=self.geo, client=ctx.ip, bot=ctx.bot, agent=ctx.agent,
            tenant=who.tenant if who is not None else None,
            key_id=who.key_id if who is not None else None,
            subject=who.subject if who is not None else None,
            method=request.method.decode("latin-1"), host=request.host.decode("latin-1"),
            path=request.path.decode("latin-1"), query=request.query.decode("latin-1"),
            status=status, target=target.label if target is not None else None,
            route=ctx.route or None, decisions=decisions or {},
            stages_ms=ctx.timings() if ctx.marks else {}, bytes_in=len(request.body),
            bytes_out=sent, duration_ms=round(ctx.elapsed_ms(), 3),
            error=_error(response) if status >= 400 else None, ai=ai,
            sampled=status >= 500 or self.sample >= 1.0 or self.rand() < self.sample)
        if self.redact is not None:
            event = self.redact(event)
        self.observers.observe(event)


def _error(response: Response) -> str | None:
    for name, value in response.headers:
        if name == b"x-edgefn-error":
            return value.decode("latin-1")
    return None


def _cached(request: Request, record: Any) -> AIUsage | None:
    """What an AI-cache hit (answered before the OpenAI API) saved: the prompt
    tokens it did not send to the model."""
    if not isinstance(record, dict) or not str(record.get("outcome", "")).startswith("hit"):
        return None
    try:
        asked = msgspec.json.decode(request.body, type=_Asked)
    except msgspec.MsgspecError:
        asked = _Asked()
    tokens = int(record.get("cached_tokens", 0))
    return AIUsage(operation=AI_OPERATIONS.get(request.path.decode("latin-1"), "chat"),
                   model=asked.model, prompt_tokens=tokens, cached_tokens=tokens,
                   stream=asked.stream)
