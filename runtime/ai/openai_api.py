"""The OpenAI-compatible API on the PoP's public listener, served by the model
worker:

    POST /v1/chat/completions   (``stream: true``: SSE ending in ``data: [DONE]``)
    POST /v1/completions
    POST /v1/embeddings         (``encoding_format``: float or base64)
    POST /v1/rerank             (Cohere/Jina shape: query, documents, top_n)
    POST /v1/tokenize           (vLLM's shape: the tokens the model reads for a prompt,
                                 messages, or texts to embed: ``input``)
    GET  /v1/models             (LoRA adapters list their ``parent``)
    GET  /v1/models/{id}        (``/`` in an id may be written as is or as %2F)

Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``,
with its status codes (`runtime.ai.openai_errors`), on every ``/v1/`` path; a
field this PoP does not implement is refused, never ignored
(`runtime.ai.openai_fields`). These paths are taken before function routes.

With `TokenBudgets`, a caller's generation, embedding or rerank reserves its tokens at
admission and is settled with its usage when it ends (`OpenAIApi._admit`).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
import struct
import time
import weakref
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import unquote

import msgspec
from msgspec import Meta

from edgefn_core.errors import ApiError, EdgefnError, WorkerError
from gpu_worker.client import Generation
from gpu_worker.protocol import Done
from runtime.ai import openai_choices as choices
from runtime.ai import structured
from runtime.ai.egress import Egress, named, with_embedding
from runtime.ai.openai_checks import check_messages, check_sampling
from runtime.ai.openai_errors import (
    MethodNotAllowed,
    error_response,
    unknown_url,
    validation_error,
    worker_param,
)
from runtime.ai.openai_fields import MAX_STOPS, check_fields
from runtime.ai.openai_models import Catalog
from runtime.ai.service import ORIGIN_DOWN, AIService
from runtime.ai.shaping import choice
from runtime.ai.usage import UsageRecord, prompt_of
from runtime.cache.settings import NO_CACHE_OVERRIDE, CacheOverride
from runtime.observe.traceparent import traceparent_of

if TYPE_CHECKING:
    from runtime.pipeline.stage import Context
    from runtime.security.principal import Principal
from runtime.net.message import Request, Response, json_response
from runtime.net.openai_sse import Chunks
from runtime.security.ratelimit.admission import Ticket, TokenBudgets, settled_embedding
from runtime.security.residency import forward_of, mark_of, tenant_of
from runtime.security.settings import NO_POLICY, TargetPolicy

log = logging.getLogger("edgefn.ai")

PATHS = frozenset({b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings", b"/v1/rerank",
                   b"/v1/tokenize", b"/v1/models"})
PREFIX = b"/v1/"  # every path under it answers in OpenAI's shape
ENCODINGS = ("float", "base64")  # an embedding's encoding_format
MODELS = b"/v1/models/"
__all__ = ["MAX_STOPS", "PATHS", "ChatBody", "CompletionBody", "OpenAIApi", "OpenAITarget",
           "count_text", "error_response"]
SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
# OpenAI reads an empty prompt as the model's start-of-text token alone; this PoP's engines
# generate from the prompt's own tokens (a llama.cpp model that adds no BOS, SmolLM2's,
# has none to start from), so an empty prompt is refused, saying why
EMPTY_PROMPT = ("the prompt is empty: this server generates from a prompt's tokens and an "
                "empty prompt has none (give it at least one character)")


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False
    # OpenAI's random padding of each chunk: false (or null) only, as these streams have
    # none; true is refused by `check_fields` (`openai_fields._NESTED_INERT`)
    include_obfuscation: bool | None = None


# integers the worker's wire (msgpack) carries: past them a value is a 400, not a 500
Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
Count = Annotated[int, Meta(ge=-(2**31), le=2**31 - 1)]


class _Sampling(msgspec.Struct, kw_only=True):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: Count | None = None  # an extension (vLLM and llama.cpp take it too)
    stop: str | list[str] | None = None
    seed: Int64 | None = None
    n: Count = 1
    user: str | None = None  # the end user, recorded in the request's event
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None


class ChatBody(_Sampling, kw_only=True):
    messages: list[dict[str, Any]]
    safety_identifier: str | None = None  # OpenAI's successor of `user`: recorded as it
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: Count | None = None


class CompletionBody(_Sampling, kw_only=True):
    prompt: str | list[str]
    logprobs: Count | None = None


class EmbeddingsBody(msgspec.Struct):
    model: str
    input: str | list[str]
    encoding_format: str = "float"
    user: str | None = None
    dimensions: int | None = None  # the model's own size only: none here can shorten


class RerankBody(msgspec.Struct):
    model: str
    query: str
    documents: list[str | dict[str, Any]]
    top_n: Count | None = None
    return_documents: bool = True


class TokenizeBody(msgspec.Struct):
    """vLLM's ``/tokenize`` (a completion's ``prompt`` or a chat's ``messages``), and
    texts to embed (``input``, as ``/v1/embeddings`` takes them): exactly one."""

    model: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    input: str | list[str] | None = None


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
        param = getattr(err, "param", None)
        if param is None and isinstance(err, WorkerError) and err.status < 500:
            param = worker_param(str(err))  # the field a worker's refusal names
        response = error_response(err.status, str(err), err.code, param)
        if isinstance(err, MethodNotAllowed):
            response.headers.append((b"allow", err.allow.encode()))
        return response

    def crashed(self, exc: Exception) -> EdgefnError:
        return EdgefnError(f"internal error in the OpenAI API ({type(exc).__name__}); see the "
                           "PoP's log")


def _allowed[B: (ChatBody, CompletionBody, EmbeddingsBody, RerankBody, TokenizeBody)](
        body: B, who: Principal | None) -> B:
    """`body`, if `who` may use its model. Raises `ApiError` (403)."""
    if who is not None and not who.allows("model", body.model):
        raise ApiError("model_not_allowed", 403, f"this API key's scopes do not include model "
                       f"{body.model!r}", param="model")
    return body


class OpenAIApi:
    """The endpoints; each raises `ApiError` or `WorkerError`, which the pipeline's
    containment renders with `OpenAITarget` (OpenAI's shape)."""

    paths = PATHS

    def __init__(self, ai: AIService, budgets: TokenBudgets | None = None,
                 egress: Egress | None = None) -> None:
        """`egress`: where a pinned tenant's calls may go (``[residency]``)."""
        self.ai = ai
        self.budgets = budgets
        self.egress = egress
        self.catalog = Catalog(ai.client, lambda: ai.models_version)

    def __call__(self, request: Request, ctx: Context | None = None) -> Awaitable[Response]:
        """`ctx.principal`, when set, limits the models a caller may use and pays
        for what it generates (token budgets)."""
        return self._route(request, ctx)

    async def _route(self, request: Request, ctx: Context | None) -> Response:
        who = ctx.principal if ctx is not None else None
        path, method = request.path, request.method
        if path == b"/v1/models" or path.startswith(MODELS):
            if method != b"GET" and method != b"HEAD":  # HEAD: the front drops the body
                raise MethodNotAllowed(path.decode(), "GET, HEAD")
            if path == b"/v1/models":
                return await self.models(who)
            return await self.model(unquote(path[len(MODELS):].decode()), who)
        if path not in PATHS:
            raise unknown_url(method.decode(), path.decode())
        if method != b"POST":
            raise MethodNotAllowed(path.decode(), "POST")
        if path == b"/v1/chat/completions":
            return await self.generate(_allowed(_decode(request.body, ChatBody), who), chat=True,
                                       ctx=ctx)
        if path == b"/v1/completions":
            return await self.generate(_allowed(_decode(request.body, CompletionBody), who),
                                       chat=False, ctx=ctx)
        if path == b"/v1/embeddings":
            return await self.embeddings(_allowed(_decode(request.body, EmbeddingsBody), who),
                                         ctx)
        if path == b"/v1/tokenize":
            return await self.tokenize(_allowed(_decode(request.body, TokenizeBody), who), ctx)
        return await self.rerank(_allowed(_decode(request.body, RerankBody), who), ctx)

    async def models(self, who: Principal | None = None) -> Response:
        """The models `who` may use (all of them for an anonymous caller)."""
        data = [_model(m) for m in await self.catalog.listing()
                if who is None or who.allows("model", m["id"])]
        return json_response({"object": "list", "data": data})

    async def model(self, name: str, who: Principal | None = None) -> Response:
        """One model, as `models` lists it. Raises `ApiError` (404 ``model_not_found``
        also for a model `who` may not use: OpenAI does not say it exists)."""
        found = next((m for m in await self.catalog.listing() if m["id"] == name), None)
        if found is None or (who is not None and not who.allows("model", name)):
            raise ApiError("model_not_found", 404, f"The model {name!r} does not exist or you "
                           "do not have access to it.", "model")
        return json_response(_model(found))

    # -- generation -----------------------------------------------------------------------
    def _hop(self, ctx: Context | None, model: str, request_id: str | None,
             params: dict[str, Any]) -> dict[str, Any]:
        """The residency overrides of this call and its caller's signed fair share
        (`Egress.hop`; a call that came de-sensitised goes on marked). Raises
        `Rejected` (451) for a pinned tenant's call that may not leave this PoP."""
        if ctx is None or self.egress is None:
            return {}
        if (mark := mark_of(ctx.decisions)) is not None:
            return {"desensitised": mark, **self.egress.client_hop(_client(ctx),
                                                                   request_id or "")}
        return self.egress.hop(_tenant(ctx), model, request_id or "", params, _client(ctx))

    def _inputs(self, ctx: Context | None, model: str, texts: list[str]) -> list[str]:
        """The texts of an embeddings call that may leave this PoP (`Egress.inputs`;
        a call that came de-sensitised is already masked). Raises `Rejected` (451)."""
        if ctx is None or self.egress is None or mark_of(ctx.decisions) is not None:
            return texts
        return self.egress.inputs(_tenant(ctx), model, texts)

    async def generate(self, body: ChatBody | CompletionBody, chat: bool,
                       ctx: Context | None = None) -> Response:
        """`body.n` choices of one completion (see `runtime.ai.openai_choices`); when
        the model's origin fails before any output and ``[ai] fallback`` names another
        model for it, that model's, marked ``x-edgefn-fallback: model=<it>;
        origin=<code>`` (not for a caller whose key may not use that model).
        Raises `ApiError`, `WorkerError`, `Rejected`."""
        try:
            return await self._generate(body, chat, ctx, body.model)
        except WorkerError as e:
            other = self.ai.fallback.get(body.model)
            who = ctx.principal if ctx is not None else None
            if other is None or e.code not in ORIGIN_DOWN or (
                    who is not None and not who.allows("model", other)):
                raise
            failed = e.code
        log.warning("model %s: its origin failed (%s); %s answers instead", body.model,
                    failed, other)
        response = await self._generate(body, chat, ctx, other)
        response.headers.append((b"x-edgefn-fallback",
                                 f"model={other}; origin={failed}".encode()))
        return response

    async def _generate(self, body: ChatBody | CompletionBody, chat: bool,
                        ctx: Context | None, model: str) -> Response:
        """`generate` with `model`."""
        params = _sampling(body)
        if isinstance(body, ChatBody):
            check_messages(body.messages)
            params["messages"] = body.messages
        else:
            params["prompt"] = _one_prompt(body.prompt)
        record = UsageRecord(ctx, "chat" if chat else "text_completion", model,
                             stream=body.stream, adapter=self._base_of(model),
                             prompt=prompt_of(params))
        record.usage.temperature = params.get("temperature")
        record.usage.max_tokens = params.get("max_tokens")
        record.usage.user = body.user or getattr(body, "safety_identifier", None)
        request_id = ctx.request_id.decode() if ctx is not None and ctx.request_id else None
        call = with_embedding({"request_id": request_id, **params,
                               **self._hop(ctx, model, request_id, params)},  # refused first
                              ctx.embedding if ctx is not None else None)
        ticket = await self._admit(ctx, model, body.stream,  # counted as it leaves
                                   self._reserved(params.get("max_tokens"), body.n),
                                   named(call), prompt=call.get("prompt"),
                                   messages=call.get("messages"))
        rid = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        gens: list[Generation] = []
        # the model build's fingerprint, asked beside the generation (never in front of
        # it: a worker that does not answer is the generation's own timeout)
        lookup = asyncio.ensure_future(self.catalog.get(model))
        try:
            trace = traceparent_of(ctx.decisions) if ctx is not None else None
            for i in range(body.n):
                gens.append(await self.ai.client.generate(
                    model, stream=body.stream, traceparent=trace, client=_client(ctx),
                    **_choice(call, i)))
            if body.stream:
                usage = body.stream_options is not None and body.stream_options.include_usage
                firsts = [await choices.first(g) for g in gens]  # errors get a real status
                record.first_token()
                fingerprint = await _fingerprint(lookup, record)
                sse = choices.sse(gens, firsts, Chunks(rid, model, chat, fingerprint, usage),
                                  usage, ticket, record, params)
                if ticket is not None:  # a body never read settles when it is dropped
                    weakref.finalize(sse, ticket.abandon)
                return Response(200, list(SSE_HEADERS), sse)
            results = await choices.collect_all(gens, record)
            fingerprint = await _fingerprint(lookup, record)
            if ticket is not None:
                await ticket.settle(choices.charged(ticket, gens, None))
        except BaseException as e:
            _drop(lookup)
            # a call the worker refused for its input (400) did not finish at all: no
            # finish reason (it counted as the model's error in its metrics)
            refused = isinstance(e, WorkerError) and e.status < 500
            record.finish(None, sum(g.tokens for g in gens),
                          "cancelled" if isinstance(e, asyncio.CancelledError)
                          else None if refused else "error")
            await choices.close_all(gens)
            if ticket is not None:
                await ticket.settle(choices.charged(ticket, gens, e))
            if not isinstance(e, WorkerError):
                raise
            if (param := structured.param_of(e)) is not None:
                raise ApiError(e.code, e.status, str(e), param) from None
            if e.code == "context_length_exceeded":  # OpenAI names the input
                raise ApiError(e.code, e.status, str(e), "messages" if chat else "prompt"
                               ) from None
            raise
        return json_response(_completion(rid, model, chat, fingerprint, results, params,
                                         gens))

    def _reserved(self, max_tokens: int | None, n: int) -> int | None:
        """What `n` choices of up to `max_tokens` each reserve of a token budget."""
        if n == 1 or self.budgets is None:
            return max_tokens
        return n * (max_tokens or self.budgets.settings.default_max_tokens)

    # -- embeddings and rerank ------------------------------------------------------------
    async def embeddings(self, body: EmbeddingsBody, ctx: Context | None = None) -> Response:
        if body.encoding_format not in ENCODINGS:
            raise ApiError("invalid_request", 400, "encoding_format must be 'float' or 'base64'",
                           param="encoding_format")
        if body.dimensions is not None and body.dimensions < 1:
            raise ApiError("invalid_request", 400, "dimensions must be at least 1",
                           param="dimensions")
        inputs = _texts("input", body.input)
        if body.dimensions is not None:  # before any work or charge
            await self._check_dimensions(body.model, body.dimensions)
        inputs = self._inputs(ctx, body.model, inputs)  # refused before any charge
        record = UsageRecord(ctx, "embeddings", body.model)
        record.usage.user = body.user
        hop = self._texts_hop(ctx, body.model)
        ticket = await self._admit(ctx, body.model, False, 0, hop, inputs=inputs)
        out = await settled_embedding(ticket, self.ai.client.embed(body.model, inputs,
                                                                   _client(ctx), **hop))
        record.counted(out["tokens"])
        size = len(out["embeddings"][0]) if out["embeddings"] else 0
        if body.dimensions is not None and body.dimensions != size:  # a size no listing said
            raise _cannot_shorten(body.model, size)
        data = [{"object": "embedding", "index": i,
                 "embedding": _b64_floats(v) if body.encoding_format == "base64" else v}
                for i, v in enumerate(out["embeddings"])]
        return json_response({"object": "list", "data": data, "model": body.model,
                              "usage": {"prompt_tokens": out["tokens"],
                                        "total_tokens": out["tokens"]}})

    async def _check_dimensions(self, model: str, dimensions: int) -> None:
        """Raises `ApiError` (400 naming ``dimensions``) unless `dimensions` is the size
        the worker's listing gives `model`'s embeddings (``details.dim``). A model
        whose size is not listed (another tier's, or a listing that failed) is
        checked on its answer."""
        try:
            found = await self.catalog.get(model)
        except WorkerError:
            return
        size = ((found or {}).get("details") or {}).get("dim")
        if isinstance(size, int) and size != dimensions:
            raise _cannot_shorten(model, size)

    async def _admit(self, ctx: Context | None, model: str, stream: bool,
                     max_tokens: int | None, hop: dict[str, Any] | None = None, **text: Any
                     ) -> Ticket | None:
        """The caller's token reservation (None where no budget or stream cap
        applies; see `TokenBudgets.admit_ai`; `hop`: the call's request id and signed
        client). Raises `Rejected` (429, 400) and `WorkerError` for an input the
        worker refuses."""
        if self.budgets is None or ctx is None or ctx.principal is None:
            return None
        return await self.budgets.admit_ai(self.budgets.payer(ctx.principal), self.ai.client,
                                           model, stream, max_tokens, _client(ctx), hop,
                                           **text)

    def _base_of(self, model: str) -> str | None:
        """The base model of LoRA adapter `model`, or None for a base model."""
        return next((lo.base for lo in self.ai.loras if lo.name == model), None)

    def _texts_hop(self, ctx: Context | None, model: str) -> dict[str, Any]:
        """The request id and signed fair share of a call whose texts leave as an
        embedding's do (`Egress.embed_hop`)."""
        if ctx is None or self.egress is None:
            return {}
        return self.egress.embed_hop(_tenant(ctx), _client(ctx), model, ctx.request_id.decode())

    async def rerank(self, body: RerankBody, ctx: Context | None = None) -> Response:
        """`body.documents` ranked by the model; its texts leave this PoP as an
        embedding's do (`_inputs`). Raises `ApiError`, `WorkerError`, `Rejected`."""
        if body.top_n is not None and body.top_n < 1:
            raise ApiError("invalid_request", 400, "top_n must be at least 1", param="top_n")
        if not body.query:
            raise ApiError("invalid_request", 400, "query is an empty string", param="query")
        texts = _document_texts(body.documents)
        query, *sent = self._inputs(ctx, body.model, [body.query, *texts])
        record = UsageRecord(ctx, "rerank", body.model)
        hop = self._texts_hop(ctx, body.model)
        # reserved as an embedding of its query and documents reads (the tokens it reports)
        ticket = await self._admit(ctx, body.model, False, 0, hop, inputs=[query, *sent])
        out = await settled_embedding(ticket, self.ai.client.rerank(
            body.model, query, sent, body.top_n, _client(ctx), **hop))
        record.counted(out["tokens"])
        results = [{"index": r["index"], "relevance_score": r["relevance_score"],
                    **({"document": {"text": texts[r["index"]]}} if body.return_documents
                       else {})} for r in out["results"]]
        return json_response({"id": "rerank-" + secrets.token_hex(8), "model": body.model,
                              "results": results, "usage": {"total_tokens": out["tokens"]}})

    async def tokenize(self, body: TokenizeBody, ctx: Context | None = None) -> Response:
        """``{"count"}``: the tokens the model reads for `body`'s one input, counted by
        the worker (an upstream's, for a forwarded model) in the caller's fair share;
        its texts leave this PoP as a generation's or an embedding's would. Raises
        `ApiError` (400: not exactly one input), `WorkerError` (400
        ``count_unsupported`` where the model's engine cannot count), `Rejected`."""
        given = {name: value for name, value in (("prompt", body.prompt), ("messages",
                 body.messages), ("inputs", body.input)) if value is not None}
        if len(given) != 1:
            raise ApiError("invalid_request", 400, "give exactly one of 'prompt', 'messages' "
                           "and 'input'")
        if body.messages is not None:
            check_messages(body.messages)
        if body.prompt is not None:
            _one_prompt(body.prompt)  # an empty one: the completion's own 400
        if body.input is not None:
            given["inputs"] = _texts("input", body.input)
        text = count_text(self.egress, ctx, body.model, given)
        count = await self.ai.client.count_tokens(body.model, client=_client(ctx), **text)
        return json_response({"count": count})


def count_text(egress: Egress | None, ctx: Context | None, model: str, text: dict[str, Any]
               ) -> dict[str, Any]:
    """`text` (the worker's ``count_tokens`` input) as it may leave this PoP, with
    the request id and signed fair share of `ctx`'s caller (`Egress.count_hop`).
    Raises `Rejected` (451) where the call it counts for would be refused."""
    request_id = ctx.request_id.decode() if ctx is not None and ctx.request_id else None
    if ctx is None or egress is None or request_id is None:
        return {**text, "request_id": request_id}
    if mark_of(ctx.decisions) is not None:  # came de-sensitised: its texts already are
        return {**text, "request_id": request_id,
                **egress.client_hop(_client(ctx), request_id)}
    return egress.count_hop(_tenant(ctx), _client(ctx), model, request_id, text)


def _client(ctx: Context | None) -> str | None:
    """The caller's fair share of the model worker (`Context.model_client`)."""
    return ctx.model_client() if ctx is not None else None


def _tenant(ctx: Context) -> str | None:
    """Whose call this is: the API key's tenant, or the one a lower tier forwarded."""
    who = ctx.principal.tenant if ctx.principal is not None else None
    return who or tenant_of(forward_of(ctx.decisions))


def _decode[T: msgspec.Struct](body: bytes, kind: type[T]) -> T:
    """Raises `ApiError` (400) naming the bad field, as OpenAI does, also for a
    field OpenAI defines that this PoP refuses (`check_fields`)."""
    if not body:
        raise ApiError("invalid_request", 400, "the request body must be a JSON object")
    check_fields(body, kind)
    try:
        return decode_body(body, kind)
    except msgspec.ValidationError as e:
        raise validation_error(str(e)) from None
    except msgspec.DecodeError as e:
        raise ApiError("invalid_json", 400, f"the request body is not valid JSON: {e}") from None


def _choice(call: dict[str, Any], i: int) -> dict[str, Any]:
    """Choice `i`'s generate arguments: with a `seed`, seed + i, so n choices differ
    and the whole answer still comes back the same for the same seed."""
    seed = call.get("seed")
    if not i or seed is None:
        return call
    return {**call, "seed": (seed + i + 2**63) % 2**64 - 2**63}


def decode_body[T: msgspec.Struct](body: bytes, kind: type[T]) -> T:
    """`body` as `kind`, a top-level ``null`` read as the field's default, as OpenAI
    reads it (the official client sends ``"temperature": null`` for
    ``temperature=None``). Raises `msgspec.ValidationError`, `msgspec.DecodeError`
    (also for JSON nested deeper than the interpreter's recursion limit)."""
    try:
        return msgspec.json.decode(body, type=kind)
    except msgspec.ValidationError as typed:
        try:
            data = msgspec.json.decode(body)
        except (msgspec.MsgspecError, RecursionError):  # 1e400: untyped, its path is
            raise typed from None  # lost (`$[...]`); deep nesting: the typed one's path
        if not isinstance(data, dict) or None not in data.values():
            raise
    except RecursionError:  # a 500 and a traceback in the log, for any client's body
        raise msgspec.DecodeError("JSON nested too deeply") from None
    return msgspec.convert({k: v for k, v in data.items() if v is not None}, kind)


def _sampling(body: _Sampling) -> dict[str, Any]:
    """The worker's sampling parameters of `body`. Raises `ApiError` (400) naming
    the first one out of range."""
    params: dict[str, Any] = {"temperature": body.temperature, "top_p": body.top_p,
                              "seed": body.seed}
    if body.top_k is not None:
        params["top_k"] = body.top_k
    name = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None \
        else body.max_tokens
    if max_tokens is not None:
        params["max_tokens"] = max_tokens
    params["stop"] = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if body.stream_options is not None and not body.stream:  # as OpenAI refuses it
        raise ApiError("invalid_value", 400, "stream_options is only allowed when stream is "
                       "true", "stream_options")
    check_sampling(body.n, body.temperature, body.top_p, max_tokens, name, len(params["stop"]))
    return params | structured.params_of(body)


def _one_prompt(prompt: str | list[str]) -> str:
    """Raises `ApiError` (400) for more than one prompt, and for an empty one."""
    if not isinstance(prompt, str):
        if len(prompt) != 1:
            raise ApiError("invalid_request", 400, "only one prompt per request is supported",
                           param="prompt")
        prompt = prompt[0]
    if not prompt:
        raise ApiError("invalid_request", 400, EMPTY_PROMPT, param="prompt")
    return prompt


def _cannot_shorten(model: str, size: int) -> ApiError:
    return ApiError("invalid_request", 400, f"model {model!r} makes embeddings of {size} "
                    f"dimensions and cannot shorten them: leave `dimensions` out or set it "
                    f"to {size}", param="dimensions")


def _texts(field: str, texts: str | list[str]) -> list[str]:
    """`texts` (one, or a list) as a list. Raises `ApiError` (400 naming the field)
    for no texts or an empty one (the worker's own refusal, said before any charge
    and with the field as OpenAI names it)."""
    if isinstance(texts, str):
        if not texts:
            raise ApiError("invalid_request", 400, f"{field} is an empty string", param=field)
        return [texts]
    if not texts:
        raise ApiError("invalid_request", 400, f"'{field}' must not be empty", param=field)
    for i, text in enumerate(texts):
        if not text:
            raise ApiError("invalid_request", 400, f"{field}[{i}] is an empty string",
                           param=f"{field}[{i}]")
    return texts


def _document_texts(documents: list[str | dict[str, Any]]) -> list[str]:
    """The texts of a rerank's documents: strings, or objects with a string ``text``
    (Cohere's and Jina's shape). Raises `ApiError` (400 naming the document)."""
    if not documents:
        raise ApiError("invalid_request", 400, "'documents' must not be empty",
                       param="documents")
    texts = []
    for i, d in enumerate(documents):
        text = d if isinstance(d, str) else d.get("text")
        where = f"documents[{i}]" if isinstance(d, str) else f"documents[{i}].text"
        if isinstance(d, dict) and "text" not in d:
            raise ApiError("invalid_request", 400, f"documents[{i}] has no 'text': a document "
                           "is a string or an object with a string 'text'", param=where)
        if not isinstance(text, str):
            raise ApiError("invalid_type", 400, f"{where} must be a string, got "
                           f"{type(text).__name__}", param=where)
        if not text:
            raise ApiError("invalid_request", 400, f"{where} is an empty string", param=where)
        texts.append(text)
    return texts


async def _fingerprint(lookup: asyncio.Future[dict[str, Any] | None],
                       record: UsageRecord | None = None) -> str | None:
    """The fingerprint `lookup` found, or None (an unknown model, a worker that could
    not say: the answer goes out without one). The base model the worker says an
    adapter has goes into `record`'s ``adapter`` (an adapter added without ``--base``
    was recorded with none)."""
    try:
        found = await lookup
    except WorkerError:
        return None
    if found is None:
        return None
    if record is not None and found.get("parent"):
        record.usage.adapter = found["parent"]
    return found["fingerprint"]


def _drop(lookup: asyncio.Future[Any]) -> None:
    """Stop a lookup nobody will read (its failure, if any, is not logged)."""
    if lookup.done():
        if not lookup.cancelled():
            lookup.exception()
    else:
        lookup.cancel()


def _completion(rid: str, model: str, chat: bool, fingerprint: str | None,
                results: list[tuple[str, Done]], params: dict[str, Any],
                gens: list[Generation]) -> dict[str, Any]:
    """The response body of a completion with `results` (of `gens`) as its choices,
    shaped as `params` ask (tool calls, logprobs)."""
    out = [choice(chat, params, text, done.finish_reason, gen.logprobs, index=i)
           for i, ((text, done), gen) in enumerate(zip(results, gens, strict=True))]
    return {"id": rid, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "system_fingerprint": fingerprint,
            "choices": out, "usage": choices.usage(choices.merged([d for _, d in results]))}


def _model(m: dict[str, Any]) -> dict[str, Any]:
    return {"id": m["id"], "object": "model", "created": m["created"], "owned_by": "edgefn",
            "kind": m["kind"], "engine": m["engine"], "parent": m.get("parent"),
            "root": m.get("parent") or m["id"]}


def _b64_floats(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
