"""`ai_cache`: the exact and semantic caches (`runtime.cache.ai`) in front of
the OpenAI API's /v1/chat/completions, /v1/completions and /v1/embeddings.

A hit is answered here, so it never reaches the ``openai`` stage: it spends no
model tokens (no token-budget admission) and no worker time. A miss goes on;
its answer is stored once it is complete: a JSON body at once, a stream when
it ends with ``data: [DONE]`` and no error event (the stream is teed; the
stage asks the model for the usage chunk and drops it again if the client did
not ask for it). A request the OpenAI API would refuse (bad JSON, a model the
caller's key may not use, n != 1) goes on untouched and gets its error there.

Stale if error (``[ai_cache] stale_if_error_s``): a miss whose model call failed
with 502, 503 or 504 (the origin down, overloaded or silent) is answered from an
entry past its TTL by less than that, if the cache has one (`AICache.stale`),
with ``x-edgefn-cache: stale``, ``x-edgefn-fallback: stale; origin=<status>``
and ``x-edgefn-cache-expired: <seconds past its TTL>``. An answer another
fallback gave (``x-edgefn-fallback``: a smaller model) is passed on, never stored.

Every answer says ``x-edgefn-cache: hit-exact | hit-semantic | miss | bypass | stale``
(``bypass`` also for a call the caches never take: ``n`` > 1, logprobs, a shaped
answer, or one the API refuses);
a hit adds ``x-edgefn-cache-entry`` (the entry served) and a semantic one
``x-edgefn-cache-similarity``; a JSON answer stored says its new entry's id in
``x-edgefn-cache-entry`` too (a stream is stored after its headers went). What was decided goes to
``ctx.decide("ai_cache", ...)`` and `CacheStats`.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import struct
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from edgefn_core.errors import Rejected, WorkerError
from runtime.ai.openai_api import (
    ENCODINGS,
    MAX_STOPS,
    SSE_HEADERS,
    ChatBody,
    CompletionBody,
    EmbeddingsBody,
    OpenAITarget,
    decode_body,
)
from runtime.ai.openai_fields import refusal
from runtime.ai.structured import shaped
from runtime.cache.ai import control, forward, replay
from runtime.cache.ai.cache import AICache, Lookup
from runtime.cache.ai.entry import Embedded, Generated, Result
from runtime.cache.ai.keys import Call, chat_call, completion_call, embedding_call
from runtime.net.message import Request, Response, json_response
from runtime.pipeline.stage import Context, Next, Target
from runtime.pipeline.stage import Result as StageResult
from runtime.pipeline.targets import Targets
from runtime.security.principal import Principal
from runtime.security.residency import forward_of, tenant_of

KINDS = {b"/v1/chat/completions": "chat", b"/v1/completions": "completion",
         b"/v1/embeddings": "embedding"}
BODIES: dict[str, type[Any]] = {"chat": ChatBody, "completion": CompletionBody,
                                "embedding": EmbeddingsBody}
ORIGIN_FAILED = frozenset({502, 503, 504})  # what a stale entry may answer instead
COUNT_WAIT = 0.25  # seconds a semantic hit waits for its prompt's count (else: the stored one)
type CountTokens = Callable[[str, list[Any], Context], Awaitable[int]]
FALLBACK = b"x-edgefn-fallback"


@dataclass(frozen=True, slots=True)
class Asked:
    """What a cacheable request asks for, and how its answer must look."""

    call: Call
    stream: bool = False
    include_usage: bool = False
    encoding_format: str = "float"
    messages: list[Any] | None = None  # a chat's, as sent (a semantic hit counts them)


class AICacheStage:
    name = "ai_cache"

    def __init__(self, cache: AICache, targets: Targets, secret: str = "",
                 count: CountTokens | None = None) -> None:
        """`secret`: the topology's shared one (``[residency] secret``), which signs the
        query embeddings handed between tiers (`forward`); "" hands none on.
        `count(model, messages, ctx)`: a chat's prompt tokens (the model worker's, in
        the fair share of `ctx`'s caller; Raises `WorkerError`, and `Rejected` where
        the messages may not leave this PoP for a worker's upstream)."""
        self.cache = cache
        self.targets = targets
        self.secret = secret
        self.count = count

    def idle_for(self, target: Target | None) -> bool:
        """Whether requests for `target` go on untouched (`runtime.pipeline.plan`):
        not the OpenAI API's."""
        return not isinstance(target, OpenAITarget)

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> StageResult:
        kind = KINDS.get(request.path)
        if (kind is None or request.method != b"POST"
                or not isinstance(self.targets.resolve(request, ctx), OpenAITarget)):
            return call_next(request, ctx)
        wishes = control.wishes(request)  # ApiError (400) for a bad header: before anything
        asked = _asked(kind, request.body, ctx.principal, tenant_of(forward_of(ctx.decisions)))
        if asked is None:  # n > 1, logprobs, a shaped answer, or one the API refuses
            ctx.decide("ai_cache", {"outcome": "bypass", "reason": "uncacheable"})
            return _bypassed(call_next(request, ctx))
        return self._serve(asked, wishes, request, ctx, call_next)

    async def _serve(self, asked: Asked, wishes: control.Wishes, request: Request,
                     ctx: Context, call_next: Next) -> Response:
        policy = self.cache.policy(None, lookup=wishes.lookup, store=wishes.store,
                                   ttl=wishes.ttl)
        found = await self.cache.lookup(asked.call, policy, self._given(request, asked.call),
                                        ctx.model_client())
        record = self.cache.account(found)
        ctx.decide("ai_cache", record)
        if found.entry is not None:
            prompt = await self._prompt_tokens(asked, found, ctx)
            if prompt is not None:
                record["cached_tokens"] = prompt
            return _hit(asked, found, prompt)
        if found.vector is not None and found.flight is not None:  # the call goes on
            ctx.embedding = forward.sign(self.secret, self.cache.settings.embedding_model,
                                         asked.call.query, found.vector)
        injected = asked.stream and not asked.include_usage and _want_store(found)
        try:
            if injected:
                request.body = _with_usage(request.body)
            started = time.perf_counter()
            response = await _resolved(call_next(request, ctx))
        except BaseException:
            self.cache.abandon(found)
            raise
        if response.status in ORIGIN_FAILED and self.cache.stale(found) is not None:
            self.cache.abandon(found)
            record = self.cache.account_stale(found)
            ctx.decide("ai_cache", record)
            return _stale(asked, found, response.status, record["expired_s"])
        response.headers.append((b"x-edgefn-cache", found.outcome.encode()))
        if response.status != 200 or not _want_store(found) or _fell_back(response):
            self.cache.abandon(found)
        elif isinstance(response.body, bytes):
            result = _parsed(asked, response.body)
            if result is None:
                self.cache.abandon(found)
            else:
                entry = self.cache.complete(found, result, (time.perf_counter() - started) * 1000)
                if entry is not None:  # stored as this entry
                    response.headers.append((b"x-edgefn-cache-entry", entry.id.encode()))
        else:
            tee = self._tee(response.body, found, started, injected)
            weakref.finalize(tee, self.cache.abandon, found)  # a stream nobody reads
            response.body = tee
        return response

    async def _prompt_tokens(self, asked: Asked, found: Lookup, ctx: Context
                             ) -> int | None:
        """A semantic hit's prompt tokens: the caller's messages counted by the
        model's tokenizer in the caller's fair share (its usage showed the stored
        paraphrase's count); None, the stored count, for an exact hit or where the
        worker cannot count now (or its upstream may not see the messages)."""
        if found.outcome != "hit-semantic" or self.count is None or asked.messages is None:
            return None
        try:
            return await asyncio.wait_for(self.count(asked.call.model, asked.messages, ctx),
                                          COUNT_WAIT)
        except (WorkerError, Rejected, TimeoutError):
            return None

    def _given(self, request: Request, call: Call) -> np.ndarray | None:
        """The query embedding the tier below signed for this very query, if any."""
        value = request.header(forward.HEADER)
        if value is None or call.scope is None:
            return None
        return forward.verify(self.secret, value, self.cache.settings.embedding_model,
                              call.query)

    async def _tee(self, body: AsyncIterator[bytes], found: Lookup, started: float,
                   drop_usage: bool) -> AsyncIterator[bytes]:
        """`body`, relayed event by event, stored when it ends well."""
        seen = _Stream(found.call.kind == "chat")
        pending = b""
        try:
            async for data in body:
                pending += data
                while b"\n\n" in pending:
                    event, pending = pending.split(b"\n\n", 1)
                    if seen.add(event) or not drop_usage:
                        yield event + b"\n\n"
            if pending:
                yield pending
        finally:
            result = seen.result()
            if result is None:
                self.cache.abandon(found)
            else:
                self.cache.complete(found, result, (time.perf_counter() - started) * 1000)
            aclose = getattr(body, "aclose", None)
            if aclose is not None:
                await aclose()


async def _bypassed(result: StageResult) -> Response:
    response = await _resolved(result)
    response.headers.append((b"x-edgefn-cache", b"bypass"))
    return response


def _fell_back(response: Response) -> bool:
    """Whether a fallback answered (another model than the one asked): not stored."""
    return any(name == FALLBACK for name, _ in response.headers)


def _stale(asked: Asked, found: Lookup, status: int, expired_s: float) -> Response:
    """`found`'s stale entry as the answer, marked, instead of the origin's `status`."""
    response = _hit(asked, found)
    response.headers += [(FALLBACK, b"stale; origin=%d" % status),
                         (b"x-edgefn-cache-expired", b"%.3f" % expired_s)]
    return response


def _want_store(found: Lookup) -> bool:
    return found.flight is not None or found.reason == "no-cache"


async def _resolved(result: StageResult) -> Response:
    return result if isinstance(result, Response) else await result


def _asked(kind: str, body: bytes, who: Principal | None,
           forwarded: str | None = None) -> Asked | None:
    """What a cacheable request asks, or None for one the OpenAI API refuses or
    the caches do not take. Its tenant is the principal's, or the one a lower tier
    forwarded (`forwarded`: signed, checked by the residency stage)."""
    if refusal(body, BODIES[kind]) is not None:  # a field the API refuses: never a hit
        return None  # (first: it refuses, unread, a body too slow to decode)
    try:
        b = decode_body(body, BODIES[kind])
    except msgspec.MsgspecError:
        return None
    if who is not None and not who.allows("model", b.model):
        return None  # the caller gets its 403 from the API, never a cached answer
    tenant = who.tenant if who is not None else (forwarded or "")
    try:
        if isinstance(b, EmbeddingsBody):
            if b.encoding_format not in ENCODINGS or b.dimensions is not None:
                return None  # the API's 400 (or a size it checks), never a hit
            inputs = [b.input] if isinstance(b.input, str) else b.input
            return Asked(embedding_call(tenant, b.model, inputs), encoding_format=b.encoding_format)
        stop = [b.stop] if isinstance(b.stop, str) else list(b.stop or [])
        if b.n != 1 or len(stop) > MAX_STOPS or shaped(b):  # replays keep plain text only
            return None
        params = {"temperature": b.temperature, "top_p": b.top_p, "top_k": b.top_k,
                  "seed": b.seed, "stop": stop,
                  "max_tokens": b.max_tokens if b.max_completion_tokens is None
                  else b.max_completion_tokens}  # as the API reads them (0 is its 400)
        usage = b.stream_options is not None and b.stream_options.include_usage
        if isinstance(b, ChatBody):
            if not b.messages:
                return None
            call = chat_call(tenant, b.model, b.messages, params)
            return Asked(call, b.stream, usage, messages=b.messages)
        else:
            prompt = b.prompt
            if isinstance(prompt, list):
                if len(prompt) != 1:
                    return None
                prompt = prompt[0]
            call = completion_call(tenant, b.model, prompt, params)
    except (TypeError, ValueError, AttributeError):
        return None
    return Asked(call, b.stream, usage)


def _hit(asked: Asked, found: Lookup, prompt: int | None = None) -> Response:
    """`found`'s entry replayed for `asked`; `prompt`: the caller's prompt tokens
    where they differ from the stored call's (a semantic hit)."""
    entry = found.entry
    assert entry is not None
    headers = [(b"x-edgefn-cache", found.outcome.encode()),
               (b"x-edgefn-cache-entry", entry.id.encode())]
    if found.outcome == "hit-semantic" and found.similarity is not None:
        headers.append((b"x-edgefn-cache-similarity", f"{found.similarity:.4f}".encode()))
    r, model, chat = entry.result, asked.call.model, asked.call.kind == "chat"
    if prompt is not None and isinstance(r, Generated):
        r = dataclasses.replace(r, prompt_tokens=prompt)
    if isinstance(r, Embedded):
        return json_response(replay.embeddings(r, model, asked.encoding_format),
                             headers=headers)
    if asked.stream:
        return Response(200, [*SSE_HEADERS, *headers],
                        replay.sse(r, model, chat, asked.include_usage))
    return json_response(replay.completion(r, model, chat), headers=headers)


def _with_usage(body: bytes) -> bytes:
    data = msgspec.json.decode(body)
    data["stream_options"] = {**(data.get("stream_options") or {}), "include_usage": True}
    return msgspec.json.encode(data)


def _parsed(asked: Asked, body: bytes) -> Result | None:
    """The result in a 200 JSON answer, or None if it has not the expected shape."""
    try:
        data = msgspec.json.decode(body)
        if asked.call.kind == "embedding":
            vectors = [_floats(d["embedding"]) for d in data["data"]]
            return Embedded(vectors, int(data["usage"]["prompt_tokens"]))
        choice, usage = data["choices"][0], data["usage"]
        text = choice["message"]["content"] if asked.call.kind == "chat" else choice["text"]
        return Generated((str(text),), str(choice["finish_reason"]),
                         int(usage["prompt_tokens"]), int(usage["completion_tokens"]),
                         data.get("system_fingerprint"))
    except (msgspec.MsgspecError, KeyError, IndexError, TypeError, ValueError):
        return None


def _floats(v: list[float] | str) -> list[float]:
    if isinstance(v, str):
        raw = base64.b64decode(v)
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    return [float(x) for x in v]


class _Stream:
    """What a streamed answer said so far, event by event."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.chunks: list[str] = []
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.fingerprint: str | None = None
        self.done = False
        self.failed = False

    def add(self, event: bytes) -> bool:
        """Take one event; False for the usage chunk (which may be dropped)."""
        if not event.startswith(b"data: "):
            return True
        payload = event[6:]
        if payload == b"[DONE]":
            self.done = True
            return True
        try:
            data = msgspec.json.decode(payload)
            return self._data(data)
        except (msgspec.MsgspecError, KeyError, IndexError, TypeError, AttributeError):
            self.failed = True
            return True

    def _data(self, data: dict[str, Any]) -> bool:
        if "error" in data:
            self.failed = True
            return True
        self.fingerprint = data.get("system_fingerprint")
        choices = data["choices"]
        if not choices:
            self.usage = data.get("usage")
            return False
        c = choices[0]
        if c.get("finish_reason") is not None:
            self.finish = c["finish_reason"]
        elif self.chat:
            delta = c["delta"]
            if "role" not in delta and delta.get("content") is not None:
                self.chunks.append(delta["content"])
        else:
            self.chunks.append(c["text"])
        return True

    def result(self) -> Generated | None:
        if not self.done or self.failed or self.finish is None or self.usage is None:
            return None
        return Generated(tuple(self.chunks), self.finish, int(self.usage["prompt_tokens"]),
                         int(self.usage["completion_tokens"]), self.fingerprint)

