"""The OpenAI-compatible API on the PoP's public listener, served by the model
worker:

    POST /v1/chat/completions   (``stream: true``: SSE ending in ``data: [DONE]``)
    POST /v1/completions
    POST /v1/embeddings         (``encoding_format``: float or base64)
    POST /v1/rerank             (Cohere/Jina shape: query, documents, top_n)
    GET  /v1/models             (LoRA adapters list their ``parent``)

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``,
with its status codes. These paths are taken before function routes.

With `TokenBudgets`, a caller's generation or embedding reserves its tokens at
admission and is settled with its usage when it ends (`OpenAIApi._admit`).
"""

from __future__ import annotations

import base64
import re
import secrets
import struct
import time
import weakref
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Any

import msgspec

from edgefn_core.errors import ApiError, EdgefnError, WorkerError
from gpu_worker.client import Generation
from gpu_worker.protocol import Done
from runtime.ai.service import AIService
from runtime.ai.usage import UsageRecord, prompt_of
from runtime.cache.settings import NO_CACHE_OVERRIDE, CacheOverride
from runtime.observe.traceparent import traceparent_of

if TYPE_CHECKING:
    from runtime.pipeline.stage import Context
    from runtime.security.principal import Principal
from runtime.net.message import Request, Response, json_response
from runtime.net.openai_sse import DONE, Chunks, event
from runtime.security.ratelimit.admission import (
    Ticket,
    TokenBudgets,
    settled_embedding,
    used_by,
)
from runtime.security.residency import forward_of
from runtime.security.settings import NO_POLICY, TargetPolicy

PATHS = frozenset({b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings", b"/v1/rerank",
         b"/v1/models"})
MAX_STOPS = 4  # as OpenAI's API
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class _Sampling(msgspec.Struct, kw_only=True):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None  # an extension (vLLM and llama.cpp take it too)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = 1


class ChatBody(_Sampling, kw_only=True):
    messages: list[dict[str, Any]]


class CompletionBody(_Sampling, kw_only=True):
    prompt: str | list[str]


class EmbeddingsBody(msgspec.Struct):
    model: str
    input: str | list[str]
    encoding_format: str = "float"


class RerankBody(msgspec.Struct):
    model: str
    query: str
    documents: list[str | dict[str, Any]]
    top_n: int | None = None
    return_documents: bool = True


class OpenAITarget:
    """The OpenAI API as a pipeline target: its errors keep OpenAI's shape, and an
    unexpected failure is an OpenAI-shaped 500."""

    label = "openai"
    kind = "openai"
    name = "openai"
    tenant: str | None = None
    policy: TargetPolicy = NO_POLICY
    cache: CacheOverride = NO_CACHE_OVERRIDE

    def error_response(self, err: EdgefnError) -> Response:
        return error_response(err.status, str(err), err.code, getattr(err, "param", None))

    def crashed(self, exc: Exception) -> EdgefnError:
        return EdgefnError(f"internal error in the OpenAI API ({type(exc).__name__}); see the "
                           "PoP's log")


def _allowed[B: (ChatBody, CompletionBody, EmbeddingsBody, RerankBody)](
        body: B, who: Principal | None) -> B:
    """`body`, if `who` may use its model. Raises `ApiError` (403)."""
    if who is not None and not who.allows("model", body.model):
        raise ApiError("model_not_allowed", 403, f"this API key's scopes do not include model "
                       f"{body.model!r}", param="model")
    return body


def error_response(status: int, message: str, code: str | None = None,
                   param: str | None = None) -> Response:
    kind = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}.get(
        status, "invalid_request_error" if 400 <= status < 500 else "server_error")
    return json_response({"error": {"message": message, "type": kind, "param": param,
                                    "code": code}}, status)


class OpenAIApi:
    """The endpoints; each raises `ApiError` or `WorkerError`, which the pipeline's
    containment renders with `OpenAITarget` (OpenAI's shape)."""

    paths = PATHS

    def __init__(self, ai: AIService, budgets: TokenBudgets | None = None) -> None:
        self.ai = ai
        self.budgets = budgets

    def __call__(self, request: Request, ctx: Context | None = None) -> Awaitable[Response]:
        """`ctx.principal`, when set, limits the models a caller may use and pays
        for what it generates (token budgets)."""
        return self._route(request, ctx)

    async def _route(self, request: Request, ctx: Context | None) -> Response:
        who = ctx.principal if ctx is not None else None
        path, method = request.path, request.method
        if path == b"/v1/models":
            if method != b"GET":
                raise ApiError("method_not_allowed", 405, "use GET /v1/models")
            return await self.models(who)
        if method != b"POST":
            raise ApiError("method_not_allowed", 405, f"use POST {path.decode()}")
        if path == b"/v1/chat/completions":
            return await self.generate(_allowed(_decode(request.body, ChatBody), who), chat=True,
                                       ctx=ctx)
        if path == b"/v1/completions":
            return await self.generate(_allowed(_decode(request.body, CompletionBody), who),
                                       chat=False, ctx=ctx)
        if path == b"/v1/embeddings":
            return await self.embeddings(_allowed(_decode(request.body, EmbeddingsBody), who),
                                         ctx)
        return await self.rerank(_allowed(_decode(request.body, RerankBody), who), ctx)

    async def models(self, who: Principal | None = None) -> Response:
        """The models `who` may use (all of them for an anonymous caller)."""
        created = int(time.time())
        data = [{"id": m["id"], "object": "model", "created": created, "owned_by": "edgefn",
                 "kind": m["kind"], "engine": m["engine"], "parent": m.get("parent"),
                 "root": m.get("parent") or m["id"]} for m in await self.ai.client.models()
                if who is None or who.allows("model", m["id"])]
        return json_response({"object": "list", "data": data})

    # -- generation -----------------------------------------------------------------------
    async def generate(self, body: ChatBody | CompletionBody, chat: bool,
                       ctx: Context | None = None) -> Response:
        params = _sampling(body)
        if isinstance(body, ChatBody):
            if not body.messages:
                raise ApiError("invalid_request", 400, "'messages' must not be empty",
                               param="messages")
            params["messages"] = body.messages
        else:
            prompt = body.prompt
            if isinstance(prompt, list):
                if len(prompt) != 1:
                    raise ApiError("invalid_request", 400,
                                   "only one prompt per request is supported", param="prompt")
                prompt = prompt[0]
            params["prompt"] = prompt
        record = UsageRecord(ctx, "chat" if chat else "text_completion", body.model,
                             stream=body.stream, adapter=self._base_of(body.model),
                             prompt=prompt_of(params))
        record.usage.temperature = params.get("temperature")
        record.usage.max_tokens = params.get("max_tokens")
        ticket = await self._admit(ctx, body.model, body.stream, params.get("max_tokens"),
                                   prompt=params.get("prompt"), messages=params.get("messages"))
        rid = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        gen: Generation | None = None
        try:
            trace = traceparent_of(ctx.decisions) if ctx is not None else None
            gen = await self.ai.client.generate(
                body.model, stream=body.stream, traceparent=trace,
                request_id=ctx.request_id.decode() if ctx is not None and ctx.request_id
                else None, tenant=forward_of(ctx.decisions) if ctx is not None else None,
                **params)
            if body.stream:
                usage = body.stream_options is not None and body.stream_options.include_usage
                first = await _first(gen)  # errors before any output get a real status
                record.first_token()
                sse = _sse(gen, first, rid, body.model, chat, usage, ticket, record)
                if ticket is not None:  # a body never read settles when it is dropped
                    weakref.finalize(sse, ticket.abandon)
                return Response(200, list(SSE_HEADERS), sse)
            text, done = await _collect(gen, record)
            if ticket is not None:
                await ticket.settle(done.prompt_tokens + done.completion_tokens)
        except BaseException as e:
            record.finish(None, gen.tokens if gen is not None else 0, "error")
            if ticket is not None:
                await ticket.settle(used_by(ticket, gen, e))
            if not isinstance(e, WorkerError):
                raise
            if e.code == "context_length_exceeded":  # OpenAI names the input
                raise ApiError(e.code, e.status, str(e), "messages" if chat else "prompt"
                               ) from None
            raise
        base = {"id": rid, "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()), "model": body.model,
                "usage": _usage(done.prompt_tokens, done.completion_tokens)}
        if chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant",
                                                               "content": text}}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = done.finish_reason
        return json_response({**base, "choices": [choice]})

    # -- embeddings and rerank ------------------------------------------------------------
    async def embeddings(self, body: EmbeddingsBody, ctx: Context | None = None) -> Response:
        if body.encoding_format not in ("float", "base64"):
            raise ApiError("invalid_request", 400, "encoding_format must be 'float' or 'base64'",
                           param="encoding_format")
        inputs = [body.input] if isinstance(body.input, str) else body.input
        record = UsageRecord(ctx, "embeddings", body.model)
        ticket = await self._admit(ctx, body.model, False, 0, inputs=inputs)
        out = await settled_embedding(ticket, self.ai.client.embed(body.model, inputs))
        record.counted(out["tokens"])
        data = [{"object": "embedding", "index": i,
                 "embedding": _b64_floats(v) if body.encoding_format == "base64" else v}
                for i, v in enumerate(out["embeddings"])]
        return json_response({"object": "list", "data": data, "model": body.model,
                              "usage": {"prompt_tokens": out["tokens"],
                                        "total_tokens": out["tokens"]}})

    async def _admit(self, ctx: Context | None, model: str, stream: bool,
                     max_tokens: int | None, **text: Any) -> Ticket | None:
        """The caller's token reservation (None where no budget or stream cap
        applies; see `TokenBudgets.admit_ai`). Raises `Rejected` (429, 400) and
        `WorkerError` for an input the worker refuses."""
        if self.budgets is None or ctx is None or ctx.principal is None:
            return None
        return await self.budgets.admit_ai(self.budgets.payer(ctx.principal), self.ai.client,
                                           model, stream, max_tokens, **text)

    def _base_of(self, model: str) -> str | None:
        """The base model of LoRA adapter `model`, or None for a base model."""
        return next((lo.base for lo in self.ai.loras if lo.name == model), None)

    async def rerank(self, body: RerankBody, ctx: Context | None = None) -> Response:
        texts = [d if isinstance(d, str) else str(d.get("text", "")) for d in body.documents]
        if body.top_n is not None and body.top_n < 1:
            raise ApiError("invalid_request", 400, "top_n must be at least 1", param="top_n")
        record = UsageRecord(ctx, "rerank", body.model)
        out = await self.ai.client.rerank(body.model, body.query, texts, body.top_n)
        record.counted(out["tokens"])
        results = [{"index": r["index"], "relevance_score": r["relevance_score"],
                    **({"document": {"text": texts[r["index"]]}} if body.return_documents
                       else {})} for r in out["results"]]
        return json_response({"id": "rerank-" + secrets.token_hex(8), "model": body.model,
                              "results": results, "usage": {"total_tokens": out["tokens"]}})


def _decode[T](body: bytes, kind: type[T]) -> T:
    """Raises `ApiError` (400) naming the bad field, as OpenAI does."""
    if not body:
        raise ApiError("invalid_request", 400, "the request body must be a JSON object")
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as e:
        raise ApiError("invalid_value", 400, f"invalid request: {e}", _param(str(e))) from None
    except msgspec.DecodeError as e:
        raise ApiError("invalid_json", 400, f"the request body is not valid JSON: {e}") from None


def _param(error: str) -> str | None:
    """The field a msgspec validation error is about: ``... - at `$.messages` ``,
    or a missing top-level field, ``Object missing required field `messages` ``."""
    if "`$." in error:
        return error.rsplit("`$.", 1)[-1].rstrip("`")
    missing = re.fullmatch(r"Object missing required field `([^`]+)`", error)
    return missing[1] if missing else None


def _sampling(body: _Sampling) -> dict[str, Any]:
    if body.n != 1:
        raise ApiError("invalid_request", 400, "only n=1 is supported", param="n")
    params: dict[str, Any] = {"temperature": body.temperature, "top_p": body.top_p,
                              "seed": body.seed}
    if body.top_k is not None:
        params["top_k"] = body.top_k
    max_tokens = body.max_completion_tokens or body.max_tokens
    if max_tokens is not None:
        params["max_tokens"] = max_tokens
    params["stop"] = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(params["stop"]) > MAX_STOPS:
        raise ApiError("invalid_request", 400, f"'stop' takes at most {MAX_STOPS} sequences, "
                       f"got {len(params['stop'])}", param="stop")
    return params


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _b64_floats(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


async def _collect(gen: Generation, record: UsageRecord) -> tuple[str, Done]:
    """`Generation.collect`, noting when the first chunk came. Raises `WorkerError`."""
    parts = []
    async for chunk in gen:
        record.first_token()
        parts.append(chunk)
    done = gen.done
    assert done is not None
    record.finish(done)
    return "".join(parts) or done.text, done


async def _first(gen: Generation) -> str | None:
    """The first chunk, or None if the generation ended without output. Raises
    `WorkerError` (so the client gets a proper status before the stream starts)."""
    try:
        return await anext(gen)
    except StopAsyncIteration:
        return None
    except BaseException:
        await gen.aclose()
        raise


async def _sse(gen: Generation, first: str | None, rid: str, model: str, chat: bool,
               include_usage: bool, ticket: Ticket | None = None,
               record: UsageRecord | None = None) -> AsyncIterator[bytes]:
    """The SSE body. A failure mid-stream becomes an ``error`` event (the status
    line has gone already); a client that goes away cancels the generation. Its
    end settles `ticket`."""
    chunks = Chunks(rid, model, chat)
    try:
        for opening in chunks.opening():
            yield opening
        if first is not None:
            yield chunks.chunk(first)
            async for text in gen:
                yield chunks.chunk(text)
        done = gen.done
        assert done is not None
        yield chunks.closing(done.finish_reason)
        if include_usage:
            yield chunks.usage(_usage(done.prompt_tokens, done.completion_tokens))
        yield DONE
    except WorkerError as e:
        yield event({"error": {"message": str(e), "type": "server_error", "param": None,
                                "code": e.code}})
    finally:
        if record is not None:
            record.finish(gen.done, gen.tokens)
        if ticket is not None:
            await ticket.settle(used_by(ticket, gen, None))
        await gen.aclose()
