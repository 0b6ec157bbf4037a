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

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from functools import partial
from time import perf_counter
from typing import Any

import msgspec

from edgefn_core.errors import EdgefnError
from runtime.config import PopConfig
from runtime.executors.output import said
from runtime.net.message import Request, Response
from runtime.observe.event import AIUsage, Event
from runtime.observe.observers import Observers
from runtime.observe.redact import Redactor, scrub
from runtime.pipeline.stage import Context, Next, Result, counted

CLIENT_GONE = 499  # the status of a request whose client left before its answer

AI_OPERATIONS = {"/v1/chat/completions": "chat", "/v1/completions": "text_completion",
                 "/v1/embeddings": "embeddings", "/v1/rerank": "rerank"}

log = logging.getLogger("edgefn.pop")


class _Asked(msgspec.Struct):
    """What an AI-cache hit's event says of the request (as a miss's does)."""

    model: str = ""
    stream: bool | None = False
    user: str | None = None
    safety_identifier: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None


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
            body = result.body
            if isinstance(body, bytes):  # the common case, inline: no further call
                # a HEAD's body is not sent (the front sends its length alone)
                self.emit(request, ctx, result, ts,
                          len(body) if request.method != b"HEAD" else 0)
                return result
            return self.answered(result, request, ctx, ts)
        return self._awaited(result, request, ctx, ts)

    async def _awaited(self, pending: Awaitable[Response], request: Request, ctx: Context,
                       ts: float) -> Response:
        """`pending`'s response, observed; a request whose client went away before it
        (the task cancelled) or whose handling raised still becomes an event: status
        499 (nginx's "client closed request") or 500, nothing sent."""
        try:
            response = await pending
        except asyncio.CancelledError:
            self.emit(request, ctx, Response(CLIENT_GONE), ts, 0)
            raise
        except Exception:
            self.emit(request, ctx, Response(500), ts, 0)
            raise
        return self.answered(response, request, ctx, ts)

    def answered(self, response: Response, request: Request, ctx: Context, ts: float
                 ) -> Response:
        """`response`, observed: its event made now (a whole body), or once its
        stream ends (its bytes counted). This stage's, and the native lane's for
        the calls it finishes in Python (`ts`: when the request began)."""
        body = response.body
        if isinstance(body, bytes):
            self.emit(request, ctx, response, ts, len(body) if request.method != b"HEAD" else 0)
        elif request.method == b"HEAD":  # the front takes one chunk, to start the stream's
            # wrappers, and sends none: nothing sent, whatever that chunk held
            response.body = counted(body, lambda _: self.emit(request, ctx, response, ts, 0))
        else:  # one cut after its head (a limit, a bad chunk) is said 200 to the client,
            # and was an event of 200 with no error, logged nowhere: its error and a warning
            failed: list[Exception] = []
            response.body = counted(body, partial(self._streamed, request, ctx, response, ts,
                                                  failed), failed)
        return response

    def _streamed(self, request: Request, ctx: Context, response: Response, ts: float,
                  failed: list[Exception], sent: int) -> None:
        """A stream's event, once it ended: what cut it (`failed`), if anything, is its
        error (an `EdgefnError`'s code, else ``exception``), logged as a warning."""
        error = None
        if failed and not ctx.quiet:
            e = failed[0]
            error = e.code if isinstance(e, EdgefnError) else "exception"
            target = ctx.target
            log.warning("%s: %s: %s (its streamed response was cut after its head)",
                        target.label if target is not None else "pipeline", error,
                        said(str(e)) or type(e).__name__)
        self.emit(request, ctx, response, ts, sent, error)

    def emit(self, request: Request, ctx: Context, response: Response, ts: float,
             sent: int, error: str | None = None) -> None:
        """Build the event and hand it to every observer. Only the fields that
        usually hold something are passed to the constructor; the rest are set
        when present (the constructor's cost grows with its arguments). This runs
        for every request: calls are inlined where it measurably helps."""
        status = response.status
        target = ctx.target
        client = ctx.client
        method, host = _texts.get(request.method), _texts.get(request.host)
        event = Event(ts=ts, rid=ctx.request_id.decode("latin-1"), pop=self.pop, tier=self.tier,
                      client=client.rpartition(":")[0] or client,
                      method=method if method is not None else _text(request.method),
                      host=host if host is not None else _text(request.host),
                      path=request.path.decode("latin-1"), status=status,
                      target=target.label if target is not None else None,
                      bytes_out=sent, duration_ms=_ms(perf_counter() - ctx.started))
        if self.geo:
            event.geo = self.geo
        if request.query:
            event.query = request.query.decode("latin-1")
        if request.body:
            event.bytes_in = len(request.body)
        if ctx.route:
            event.route = ctx.route
        if target is not None and target.tenant is not None:
            event.owner = target.tenant
        if ctx.marks:
            event.stages_ms = ctx.timings()
        if ctx.bot is not None or ctx.agent is not None:
            event.bot, event.agent = ctx.bot, ctx.agent
        who = ctx.principal
        if who is not None:
            event.tenant, event.key_id, event.subject = who.tenant, who.key_id, who.subject
        elif ctx.decisions and isinstance(pinned := ctx.decisions.get("residency"), dict):
            event.tenant = pinned.get("forwarded")  # signed by the tier below
        if ctx.decisions:
            self._decisions(event, request, ctx.decisions)
        if status >= 400:
            event.error = _error(response)
        elif error is not None:  # a stream cut after its head (`_streamed`)
            event.error = error
        if status < 500 and self.sample < 1.0 and self.rand() >= self.sample:
            event.sampled = False
        if self.redact is not None:
            event = self.redact(event)
        if ctx.quiet:  # a warm-up: built (that code is warm now), seen by no observer
            return
        self.observers.observe(event)

    def _decisions(self, event: Event, request: Request, decisions: dict[str, Any]) -> None:
        """The stages' records, the AI call's moved to `Event.ai`."""
        ai = decisions.pop("ai", None)
        if ai is None and "ai_cache" in decisions:
            ai = _cached(request, decisions["ai_cache"])
        if ai is not None:
            if ai.prompt is not None:
                ai.prompt = scrub(ai.prompt) if self.prompts else None
            event.ai = ai
        pinned = decisions.get("residency")
        if isinstance(pinned, dict) and "forward" in pinned:  # a credential at the tier
            # above (it admits the call there): never in an event anyone may read
            pinned = {k: v for k, v in pinned.items() if k != "forward"}
            decisions = {**decisions, "residency": pinned}
        event.decisions = decisions


# methods and hosts: few distinct values, decoded once. Only short ones, and emptied
# when full: a client sending 1,024 distinct 30 KB Hosts held ~80 MB here for good, and
# kept every real host out
_texts: dict[bytes, str] = {}
MAX_TEXTS, MAX_TEXT_BYTES = 1024, 256


def _text(raw: bytes) -> str:
    text = _texts.get(raw)
    if text is None:
        text = raw.decode("latin-1")
        if len(raw) <= MAX_TEXT_BYTES:
            if len(_texts) >= MAX_TEXTS:
                _texts.clear()
            _texts[raw] = text
    return text


def _ms(seconds: float) -> float:
    """`seconds` in milliseconds, to the microsecond: as ``round(ms, 3)``, which
    costs ~0.7 us a call (it rounds through a decimal string), for the nearest
    microsecond's float, which prints the same. Not always the same float: within
    an ulp of a half microsecond the two round to neighbours (5e-7 s: 0.0, was 0.001)."""
    return round(seconds * 1e6) / 1000


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
                   stream=bool(asked.stream), user=asked.user or asked.safety_identifier,
                   temperature=asked.temperature,
                   max_tokens=asked.max_completion_tokens or asked.max_tokens)
