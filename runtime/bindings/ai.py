"""The AI capability: ``ai.chat``, ``ai.chat_stream``/``ai.chat_next``,
``ai.complete``, ``ai.embed``, ``ai.rerank`` and ``ai.models`` on the PoP's model
worker.

A stream belongs to the deployment that opened it: each `AIBinding` keeps its
own streams, so a stream id means nothing to another function.

With `TokenBudgets`, a call is charged to the function's tenant (its owner):
reserved at admission, settled with the usage when it ends (see
`runtime.security.ratelimit.admission`), as the OpenAI API does for a key.

``ai.chat`` takes OpenAI's ``response_format``, ``tools``, ``tool_choice``,
``parallel_tool_calls``, ``presence_penalty``, ``frequency_penalty`` and
``logit_bias`` (checked as the OpenAI API checks them); its result then carries
the assistant ``message`` and its ``tool_calls`` (a list, empty when the model
answered in text). Such calls skip the AI cache, which keeps plain text only.
``chat_stream`` takes ``response_format`` and the sampling fields, not tools.
A call with ``response_format``, a penalty or ``logit_bias`` bypasses the cache.

With the PoP's `AICache`, ``chat``, ``chat_stream``, ``complete`` and ``embed``
go through the exact and semantic caches (scoped by the function's tenant) unless
the function's ``[cache.ai]`` turns them off or a call passes ``cache: false``
(neither looked up nor stored). A hit is not admitted against the token budget
(it spends no model tokens); its result says ``"cache": {"outcome", ...}``. A
streamed hit replays the chunks as they were stored; a streamed miss is stored
once it ends (not when it fails, is closed or abandoned before its end, or a
purge ran meanwhile). An identical call meanwhile does not wait for it (it goes
to the model): the stream's progress is its reader's, and a function that opened
the same stream twice before reading the first would wait on itself.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from edgefn_core.errors import ApiError, BindingError, Rejected, WorkerError
from gpu_worker import protocol as p
from gpu_worker.client import Generation
from runtime.ai import structured
from runtime.ai.egress import Egress, named
from runtime.ai.openai_checks import check_messages
from runtime.ai.service import ORIGIN_DOWN, AIService
from runtime.ai.shaping import choice
from runtime.cache.ai import replay
from runtime.cache.ai.cache import AICache, Lookup
from runtime.cache.ai.entry import Embedded, Generated, Result
from runtime.cache.ai.keys import Call, chat_call, completion_call, embedding_call
from runtime.cache.settings import AICacheOverride
from runtime.security.principal import model_client
from runtime.security.ratelimit.admission import (
    Ticket,
    TokenBudgets,
    settled_embedding,
    used_by,
)

STREAM_IDLE = 30.0  # a chat stream nobody reads for this long is closed
OPS = frozenset({"chat", "chat_stream", "chat_next", "chat_close", "complete", "embed",
                 "rerank", "models"})
_SAMPLING = frozenset({"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                       "cache", "presence_penalty", "frequency_penalty", "logit_bias",
                       "response_format"})
# the arguments each operation reads: any other is refused (a typo such as `max_token`
# ran uncapped until the wall-time limit)
ARGS = {"chat": _SAMPLING | {"messages", "tools", "tool_choice", "parallel_tool_calls"},
        "chat_stream": _SAMPLING | {"messages"}, "complete": _SAMPLING | {"prompt"},
        "chat_next": frozenset({"stream"}), "chat_close": frozenset({"stream"}),
        "embed": frozenset({"model", "input", "cache"}),
        "rerank": frozenset({"model", "query", "documents", "top_n"}), "models": frozenset()}


# the model an operation uses when its call names none (what `edgefn.Env.ai()` and
# `AI.embed`/`AI.rerank` default to; a WASM guest's `call` got "missing argument 'model'")
DEFAULT_MODELS = {"chat": "smollm2-135m", "chat_stream": "smollm2-135m",
                  "complete": "smollm2-135m", "embed": "all-minilm-l6-v2",
                  "rerank": "all-minilm-l6-v2"}

# what each argument must be (checked where the call comes in, `_args`): a value of
# another kind was made a string (``str(None)``: "None" embedded, completed and cached)
_TEXT = frozenset({"model", "prompt", "query"})
_WHOLE = frozenset({"max_tokens", "top_k", "seed", "top_n"})
_NUMBER = frozenset({"temperature", "top_p", "presence_penalty", "frequency_penalty"})
_TEXTS = frozenset({"documents"})  # a list of strings


def _args(op: str, a: dict[str, Any]) -> dict[str, Any]:
    """`a` without its null fields (each takes its default, as in the OpenAI API),
    every value of the kind its argument takes. Raises `BindingError` naming the
    first argument of another kind."""
    a = {k: v for k, v in a.items() if v is not None}
    for name, value in a.items():
        if name in _TEXT:
            ok, kind = isinstance(value, str), "a string"
        elif name in _WHOLE:
            ok, kind = type(value) is int, "an integer"
        elif name in _NUMBER:
            ok, kind = type(value) in (int, float), "a number"
        elif name in _TEXTS:
            ok = isinstance(value, list) and all(isinstance(t, str) for t in value)
            kind = "a list of strings"
        elif name == "input" or name == "stop":
            ok = isinstance(value, str) or (isinstance(value, list) and all(
                isinstance(t, str) for t in value) and (bool(value) or name == "stop"))
            kind = "a string or a list of strings" + (" (not empty)" if name == "input" else "")
        elif name == "messages":
            ok, kind = isinstance(value, list), "a list of messages"
        else:
            continue
        if not ok:
            raise BindingError(f"ai.{op}: {name} must be {kind}, got {_kind(value)}")
        if name == "top_n" and value < 1:  # (the worker took -2 as "all but the last 2")
            raise BindingError(f"ai.{op}: top_n must be at least 1, got {value}")
        if name == "seed" and not -(1 << 63) <= value < 1 << 63:  # as /v1's
            raise BindingError(f"ai.{op}: seed must be a 64-bit signed integer, got {value}")
    return a


def _kind(value: Any) -> str:
    """`value`'s kind as JSON names it (what a function sent)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        odd = [t for t in value if not isinstance(t, str)]
        return "a list holding " + _kind(odd[0]) if odd else "a list" if value else \
            "an empty list"
    return "an object" if isinstance(value, dict) else type(value).__name__


class FellBack(Exception):  # not an error: how an answer came (it skips the cache)
    """A fallback model answered (`AIBinding._answered`): its result, and what to
    tell the function (``{"model", "origin"}``)."""

    def __init__(self, result: Generated, said: dict[str, str]) -> None:
        super().__init__(said["model"])
        self.result = result
        self.said = said


class AIBinding:
    def __init__(self, service: AIService, owner: str, tenant: str | None = None,
                 budgets: TokenBudgets | None = None, cache: AICache | None = None,
                 cache_settings: AICacheOverride | None = None,
                 egress: Egress | None = None) -> None:
        """`owner`: the function; `tenant`: who its calls are charged to (and the
        scope of its cache entries); `cache_settings`: its ``[cache.ai]``;
        `egress`: where `tenant`'s model calls may go, if it is pinned."""
        self.service = service
        self.owner = owner
        self.tenant = tenant or owner
        self.budgets = budgets
        self.cache = cache
        self.cache_settings = cache_settings
        self.streams: dict[int, _Open] = {}
        self.ids = itertools.count(1)
        self.egress = egress
        self.resident = self.tenant  # whose data residency its model calls keep to
        self.fair_client = model_client(None, self.tenant)  # its share of the model worker

    def as_caller(self, caller: str | None) -> AIBinding:
        """This binding for a request of tenant `caller`: when `caller` is pinned
        (``[residency] tenants``), its model calls keep to the caller's region, not
        the owner's (a pinned tenant's prompt left its region through a function of
        an unpinned owner). The same streams, cache and budget: a shallow copy."""
        if caller is None or caller == self.resident or self.egress is None \
                or caller not in self.egress.settings.tenants:
            return self
        view = copy.copy(self)
        view.resident = caller
        return view

    def _hop(self, model: str, params: dict[str, Any]) -> dict[str, Any]:
        """`params` with the residency overrides of a pinned tenant's call (a
        request id of its own, `Egress.hop`) and the owner's fair share signed for
        the next tier. Raises `Rejected` (451) for one that
        may not leave this PoP."""
        if self.egress is None:
            return params
        return {**params, **self.egress.hop(self.resident, model, f"ai-{secrets.token_hex(12)}",
                                            params, self.fair_client)}

    async def call(self, op: str, a: dict[str, Any], traceparent: str | None = None) -> Any:
        """Run one AI operation; a model call carries `traceparent` (the calling
        request's span) to the worker. Raises `BindingError` (with the worker's
        reason for a refused request, or the tenant's exhausted budget; an argument
        of the wrong kind, named) and KeyError/TypeError/ValueError for other bad
        arguments (a missing one). A null argument takes its default."""
        if op not in OPS:
            raise BindingError(f"unknown AI operation {op!r}")
        unknown = sorted(set(a) - ARGS[op])
        if unknown:
            raise BindingError(f"ai.{op}: unrecognized argument {unknown[0]!r}; it takes "
                               f"{', '.join(sorted(ARGS[op])) or 'none'}")
        a = _args(op, a)
        if "model" in ARGS[op] and "model" not in a and op in DEFAULT_MODELS:
            a = {**a, "model": DEFAULT_MODELS[op]}  # the Python SDK's defaults, from WASM too
        if op in ("chat", "chat_stream") and isinstance(a.get("messages"), list):
            try:
                check_messages(a["messages"])
            except ApiError as e:
                raise BindingError(f"ai.{op}: {e}") from None
        try:
            return await self._run(op, a, traceparent)
        except (WorkerError, Rejected) as e:
            raise BindingError(f"ai.{op}: {e}") from None

    async def _run(self, op: str, a: dict[str, Any], traceparent: str | None) -> Any:
        client = self.service.client
        match op:
            case "chat" | "complete" | "chat_stream":
                return await self._generate(op, a, traceparent)
            case "chat_next":
                return await self._next(_stream_id(a))
            case "chat_close":
                return await self.end_stream(_stream_id(a))
            case "embed":
                return await self._embed(str(a["model"]), a["input"], a)
            case "rerank":
                return await self._rerank(str(a["model"]), a["query"], list(a["documents"]),
                                          a.get("top_n"))
        return await client.models()

    async def _generate(self, op: str, a: dict[str, Any], traceparent: str | None) -> Any:
        params: dict[str, Any] = {k: a[k] for k in ("max_tokens", "temperature", "top_p",
                                                     "top_k", "seed") if a.get(k) is not None}
        stop = a.get("stop")
        params["stop"] = [stop] if isinstance(stop, str) else list(stop or [])
        if op == "complete":
            params["prompt"] = str(a["prompt"])
        else:
            params["messages"] = list(a["messages"])
        model, stream = str(a["model"]), op == "chat_stream"
        shaping = _shaping(op, a)
        params |= shaping
        if shaping and op == "chat":
            return _message(await self._generated(model, params), params)
        if shaping:  # the cache's key has no response_format, penalty or logit_bias: a
            a = {**a, "cache": False}  # shaped answer stored would serve a plain call
        call = (completion_call(self.tenant, model, params["prompt"], params)
                if op == "complete" else chat_call(self.tenant, model, params["messages"],
                                                   params))
        if not stream:
            return await self._cached(call, a,
                                      lambda: self._answered(model, params, traceparent))
        found, said = None, {}
        if self.cache is not None:
            off = a.get("cache") is False
            found = await self.cache.lookup(call, self.cache.policy(
                self.cache_settings, lookup=not off, store=not off), client=self.fair_client)
            said = {"cache": self.cache.account(found, self.owner)}
            if found.entry is not None:
                assert isinstance(found.entry.result, Generated)
                return {"stream": self._open(Replayed(found.entry.result), None), **said}
        try:
            hop = self._hop(model, params)  # refused before any charge
            ticket = await self._admit(model, stream, params.get("max_tokens"), named(hop),
                                       prompt=hop.get("prompt"), messages=hop.get("messages"))
        except BaseException:
            self._abandon(found)
            raise
        gen: Generation | None = None
        try:
            gen = await self.service.client.generate(model, stream=True, traceparent=traceparent,
                                                     client=self.fair_client, **hop)
        except BaseException as e:
            self._abandon(found)
            if ticket is not None:
                await ticket.settle(used_by(ticket, gen, e))
            raise
        purges = -1
        if found is not None and self.cache is not None and found.flight is not None:
            purges = self.cache.purges
            self.cache.abandon(found)  # nobody waits on a stream (see the module docstring)
        return {"stream": self._open(gen, ticket, found, purges), **said}

    def _open(self, gen: Generation | Replayed, ticket: Ticket | None,
              found: Lookup | None = None, purges: int = -1) -> int:
        """A new stream of this deployment, its id. `found`: the cache's miss to
        store its answer for, unless the cache's `purges` is no longer `purges`."""
        self._sweep()
        sid = next(self.ids)
        self.streams[sid] = _Open(gen, time.monotonic(), ticket, found if purges >= 0 else None,
                                  purges)
        return sid

    def _abandon(self, found: Lookup | None) -> None:
        if found is not None and self.cache is not None:
            self.cache.abandon(found)

    async def _answered(self, model: str, params: dict[str, Any],
                        traceparent: str | None = None) -> Generated:
        """`_generated`, or when `model`'s origin fails and ``[ai] fallback`` names
        another model for it, that model's answer as `FellBack` (never cached as
        `model`'s). Raises the first failure when the fallback fails too."""
        try:
            return await self._generated(model, params, traceparent)
        except WorkerError as e:
            other = self.service.fallback.get(model)
            if other is None or e.code not in ORIGIN_DOWN:
                raise
            first = e
        try:
            result = await self._generated(other, params, traceparent)
        except WorkerError:
            raise first from None
        raise FellBack(result, {"model": other, "origin": first.code})

    async def _generated(self, model: str, params: dict[str, Any],
                         traceparent: str | None = None) -> Generated:
        """One model call, admitted and settled. Raises `Rejected`, `WorkerError`."""
        hop = self._hop(model, params)  # refused before any charge
        ticket = await self._admit(model, False, params.get("max_tokens"), named(hop),
                                   prompt=hop.get("prompt"), messages=hop.get("messages"))
        gen: Generation | None = None
        try:
            gen = await self.service.client.generate(model, stream=False, traceparent=traceparent,
                                                     client=self.fair_client, **hop)
            text, done = await gen.collect()
        except BaseException as e:
            if gen is not None:  # cancelled (the request's client left): the worker stops
                await gen.aclose()  # (it generated on to max_tokens for no one)
            if ticket is not None:
                await ticket.settle(used_by(ticket, gen, e))
            raise
        if ticket is not None:
            await ticket.settle(done.prompt_tokens + done.completion_tokens)
        return Generated((text,), done.finish_reason, done.prompt_tokens, done.completion_tokens)

    async def _cached(self, call: Call, a: dict[str, Any],
                      origin: Callable[[], Awaitable[Result]]) -> dict[str, Any]:
        """`origin()`'s result as the binding returns it, through the cache."""
        if self.cache is None:
            try:
                return _plain(await origin())
            except FellBack as fb:
                return {**_plain(fb.result), "fallback": fb.said}
        off = a.get("cache") is False
        found = await self.cache.lookup(call, self.cache.policy(
            self.cache_settings, lookup=not off, store=not off), client=self.fair_client)
        record = self.cache.account(found, self.owner)
        if found.entry is not None:
            return {**replay.binding(found.entry.result), "cache": record}
        started = time.perf_counter()
        try:
            result = await origin()
        except FellBack as fb:
            self.cache.abandon(found)
            return {**_plain(fb.result), "cache": record, "fallback": fb.said}
        except WorkerError as e:
            stale = self.cache.stale(found) if e.code in ORIGIN_DOWN else None
            self.cache.abandon(found)
            if stale is None:
                raise
            return {**replay.binding(stale.result),
                    "cache": self.cache.account_stale(found, self.owner)}
        except BaseException:
            self.cache.abandon(found)
            raise
        self.cache.complete(found, result, (time.perf_counter() - started) * 1000)
        return {**_plain(result), "cache": record}

    async def _next(self, sid: int) -> dict[str, Any]:
        """At least one chunk (or the end) of this deployment's stream `sid`, plus
        whatever else already arrived. Raises `BindingError` for a stream it does
        not own (or one that ended)."""
        entry = self.streams.get(sid)
        if entry is None:
            raise BindingError(f"no AI stream {sid} for function {self.owner!r} (finished, "
                               f"closed after {STREAM_IDLE:.0f} s unread, or not its own)")
        gen, ticket = entry.gen, entry.ticket
        entry.seen = time.monotonic()
        chunks: list[str] = []
        try:
            chunks.append(await anext(gen))
            while not gen.queue.empty() and not gen.finished:
                chunks.append(await anext(gen))
        except StopAsyncIteration:
            pass
        except WorkerError as e:
            del self.streams[sid]
            if ticket is not None:
                await ticket.settle(used_by(ticket, _generation(gen), e))
            raise
        entry.chunks += chunks
        if not gen.finished:
            return {"chunks": chunks, "done": None}
        del self.streams[sid]
        if ticket is not None:
            await ticket.settle(used_by(ticket, _generation(gen), None))
        d = gen.done
        assert d is not None
        if entry.found is not None and self.cache is not None \
                and d.finish_reason != "cancelled" and self.cache.purges == entry.purges:
            self.cache.complete(entry.found, Generated(
                tuple(entry.chunks), d.finish_reason, d.prompt_tokens, d.completion_tokens),
                (time.monotonic() - entry.opened) * 1000)
        usage = {"prompt_tokens": d.prompt_tokens, "completion_tokens": d.completion_tokens}
        if isinstance(gen, Replayed):
            usage["cached_tokens"] = d.prompt_tokens
        return {"chunks": chunks, "done": {"finish_reason": d.finish_reason, "usage": usage}}

    async def _embed(self, model: str, inputs: Any, a: dict[str, Any]) -> dict[str, Any]:
        texts = [inputs] if isinstance(inputs, str) else [str(t) for t in inputs]
        return await self._cached(embedding_call(self.tenant, model, texts), a,
                                  lambda: self._embedded(model, texts))

    async def _embedded(self, model: str, texts: list[str]) -> Embedded:
        hop: dict[str, Any] = {}
        if self.egress is not None:  # refused before any charge
            texts = self.egress.inputs(self.resident, model, texts)
            hop = self.egress.embed_hop(self.resident, self.fair_client, model,
                                        f"ai-{secrets.token_hex(12)}")
        ticket = await self._admit(model, False, 0, hop, inputs=texts)
        out = await settled_embedding(ticket, self.service.client.embed(model, texts,
                                                                        self.fair_client, **hop))
        return Embedded(out["embeddings"], out["tokens"])

    async def _rerank(self, model: str, query: Any, documents: list[Any],
                      top_n: int | None) -> Any:
        """`documents` ranked; the texts leave this PoP, and reserve the tenant's
        token budget (the query and documents, as an embedding of them would), as an
        embedding's do (`_embedded`). Raises `Rejected`, `WorkerError`."""
        for name, texts in (("query", [query]), ("documents", documents)):  # the worker's
            if not texts:  # own refusals, said before any charge (its count names 'input')
                raise WorkerError("invalid_request", 400, f"'{name}' must not be empty")
            for i, text in enumerate(texts):
                if not text:
                    where = f"'{name}'" if name == "query" else f"'{name}'[{i}]"
                    raise WorkerError("invalid_request", 400, f"{where} is an empty string")
        hop: dict[str, Any] = {}
        if self.egress is not None:  # refused before any charge
            query, *documents = self.egress.inputs(self.resident, model, [query, *documents])
            hop = self.egress.embed_hop(self.resident, self.fair_client, model,
                                        f"ai-{secrets.token_hex(12)}")
        ticket = await self._admit(model, False, 0, hop, inputs=[query, *documents])
        return await settled_embedding(ticket, self.service.client.rerank(
            model, query, documents, top_n, self.fair_client, **hop))

    async def _admit(self, model: str, stream: bool, max_tokens: int | None,
                     hop: dict[str, Any] | None = None, **text: Any) -> Ticket | None:
        """The tenant's reservation for one call (None without a budget; `hop`: the
        call's request id and signed client). Raises `Rejected` and `WorkerError` (see
        `TokenBudgets.admit_ai`)."""
        if self.budgets is None:
            return None
        return await self.budgets.admit_ai(self.budgets.payer(None, self.tenant),
                                           self.service.client, model, stream, max_tokens,
                                           self.fair_client, hop, **text)

    async def end_stream(self, sid: int) -> bool:
        """Stop this deployment's stream `sid` (its reader stopped: the request's client
        went away, or the function stopped reading) and settle what it used; False
        when it had already ended. The model stops generating for it at once (it
        generated to `max_tokens`, holding a batch slot and its reservation)."""
        entry = self.streams.pop(sid, None)
        if entry is None:
            return False
        await _end(entry.gen, entry.ticket)
        return True

    def _sweep(self) -> None:
        now = time.monotonic()
        for sid, entry in list(self.streams.items()):
            if now - entry.seen > STREAM_IDLE:
                del self.streams[sid]
                asyncio.get_running_loop().create_task(_end(entry.gen, entry.ticket))

    async def close(self) -> None:
        """Close the streams still open (the deployment is going away)."""
        streams, self.streams = self.streams, {}
        for entry in streams.values():
            await _end(entry.gen, entry.ticket)


class Replayed:
    """A cached answer as a stream: its stored chunks, all at once (what `_next`
    reads of a `Generation`)."""

    def __init__(self, result: Generated) -> None:
        self.chunks = list(result.chunks) or [""]
        self.done = p.Done(id=0, finish_reason=result.finish_reason,
                           prompt_tokens=result.prompt_tokens,
                           completion_tokens=result.completion_tokens)
        self.finished = False
        self.queue = self  # `_next` asks `queue.empty()` whether more is there at once

    def empty(self) -> bool:
        return not self.chunks

    def __aiter__(self) -> Replayed:
        return self

    async def __anext__(self) -> str:
        if not self.chunks:
            raise StopAsyncIteration
        chunk = self.chunks.pop(0)
        self.finished = not self.chunks
        return chunk

    async def aclose(self) -> None:
        self.chunks.clear()


@dataclass
class _Open:
    """A stream of this deployment: what it reads, when it was last read, its budget
    ticket, the cache's miss to store when it ends (and the cache's purge count
    then) and what it streamed."""

    gen: Generation | Replayed
    seen: float
    ticket: Ticket | None
    found: Lookup | None = None
    purges: int = -1
    chunks: list[str] = field(default_factory=list)
    opened: float = field(default_factory=time.monotonic)


def _stream_id(a: dict[str, Any]) -> int:
    """The stream a call names. Raises KeyError without one, ValueError for one that
    is no stream id (`int()` read "7" and said "invalid literal" of "x")."""
    sid = a["stream"]
    if type(sid) is not int:
        raise ValueError(f"stream must be a stream id (an integer), got {sid!r:.40}")
    return sid


def _shaping(op: str, a: dict[str, Any]) -> dict[str, Any]:
    """The Generate fields for a call's structured-output, tool and penalty
    arguments. Raises `BindingError` naming a bad one, or tools outside ``chat``."""
    if op != "chat" and (a.get("tools") or a.get("tool_choice")):
        raise BindingError(f"ai.{op} takes no tools (use ai.chat)")
    if op == "complete" and a.get("response_format") is not None:
        raise BindingError("ai.complete takes no response_format (use ai.chat)")
    try:
        out = structured.penalties(float(a.get("presence_penalty") or 0),
                                   float(a.get("frequency_penalty") or 0), a.get("logit_bias"))
        out |= structured.response_format(a.get("response_format"))
        out |= structured.tools(a.get("tools"), a.get("tool_choice"),
                                a.get("parallel_tool_calls"))
    except ApiError as e:
        raise BindingError(f"ai.{op}: {a.get('model')!r}: {e} (param {e.param})") from None
    return out


def _message(r: Generated, params: dict[str, Any]) -> dict[str, Any]:
    """A shaped chat's result: the text, and the message with its tool calls."""
    shaped = choice(True, params, "".join(r.text), r.finish_reason, [])
    msg = shaped["message"]
    return {**_plain(r), "text": msg["content"] or "", "message": msg,
            "tool_calls": msg.get("tool_calls", []), "finish_reason": shaped["finish_reason"]}


def _plain(r: Result) -> dict[str, Any]:
    if isinstance(r, Embedded):
        return {"embeddings": r.embeddings, "tokens": r.tokens}
    return {"text": r.text, "finish_reason": r.finish_reason,
            "usage": {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens}}


async def _end(gen: Generation | Replayed, ticket: Ticket | None) -> None:
    """Stop a stream nobody reads any more and settle what it may have used."""
    if ticket is not None:
        await ticket.settle(used_by(ticket, _generation(gen), None))
    await gen.aclose()


def _generation(gen: Generation | Replayed) -> Generation | None:
    """The model's generation a stream reads (a replayed one has none: no ticket)."""
    return gen if isinstance(gen, Generation) else None

