"""Forward requests to an OpenAI-compatible HTTP server (``engine = "openai"``).

This is how edgefn scales past one box: a worker entry names the ``url`` of vLLM,
a llama.cpp server or another edgefn PoP, and chat, completion and embedding
requests for its ``models`` are sent there; streamed answers come back as
server-sent events and are passed to the worker's sink chunk by chunk.

HTTP and server-sent events are httpx2's (the maintained httpx fork the openai
client depends on): one `httpx2.AsyncClient` per engine (``http://`` or
``https://`` with the system's trust store, keep-alive, no limit on connections,
no proxy or ``.netrc`` from the environment, no compression asked for) and
`httpx2.EventSource` for streamed answers. Its lines end at CR and LF only, as
the SSE spec says; ``aiter_lines()`` also splits at U+2028 and U+0085, which JSON
leaves unescaped inside strings, and would cut such a token's event in two.

- A call names itself to the next tier: its request id (``x-request-id``) and,
  where the PoP signed it, its caller's fair share of the model
  (``x-edgefn-client``, `Generate.signed_client`), generations and embeddings
  alike; a PoP there shares its model by that caller, not by this worker's PoP.
- Cancel closes the upstream response, and with it the connection (an
  unfinished response is never reused), which is how the upstream learns to stop.
- Flow control: a stream that has run ``window`` chunks ahead of its credit stops
  reading the upstream response until credit arrives; httpx2 reads the socket
  only when asked, so TCP backpressure reaches the upstream server.
- ``timeout`` bounds connecting, sending, and every wait for the upstream's next
  bytes (not a wait for the client's credit).
- Connections are kept: a streamed answer's body is read to its end after ``[DONE]``
  (for at most `DRAIN_S`, after the sink was told it is done), so the next
  request through a topology link skips the handshake's round trip. A connection
  that hangs up before the answer's head (a kept one the upstream or a link closed
  meanwhile, its FIN still on the way) is tried once more on a new connection.
- A 503 that closes its connection is tried once more, on a new connection, before
  anything was passed on: that is how a PoP whose model worker is down answers
  (`runtime.pipeline.contain`), and through a topology link or a load balancer the
  new connection reaches a server that is ready. A 503 on a kept connection (an
  overloaded vLLM) is passed on as it is; the client chooses when to retry.

Upstream errors keep the upstream's HTTP status and message; the code is the
upstream's own when it is one edgefn uses (`KEPT_CODES`: another PoP's), else
derived from the status (404 model_not_found, 408/504 timeout, 429/503 overloaded,
other 4xx invalid_request, anything else upstream_error). An upstream that cannot be
reached or hangs up mid-answer is ``upstream_unavailable`` (502), one that goes
silent is ``timeout`` (504), one that does not speak HTTP is ``upstream_error``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import ssl
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, cast

import httpx2
import msgspec

from edgefn_core.errors import EngineError

from ..protocol import DEFAULT_MAX_TOKENS
from . import Engine, ModelInfo
from . import upstream_counts as counts
from .upstream_shapes import CallText, forwarded, token_logprobs

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from ..config import ModelSpec
    from ..protocol import CountTokens, Embed, Generate, Rerank, TokenLogprob
    from . import Sink

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024 * 1024  # a whole (non-streamed) answer: model list, embeddings
MAX_ERROR_BODY = 1024 * 1024  # an error answer
MAX_EVENT = 16 * 1024 * 1024  # one server-sent event
MAX_IDLE = 20  # keep-alive connections kept open between requests
# a kept connection is dropped after this long idle: before the servers' own 5 s (a PoP's
# `keepalive_timeout`, uvicorn's for vLLM), so a request rarely meets their close
IDLE_S = 4.0
DRAIN_S = 1.0  # how long the end of a body may take after [DONE] for its connection to be kept
USER_AGENT = "edgefn-gpu-worker"


# -- HTTP -----------------------------------------------------------------------------------

def _check_url(url: str) -> httpx2.URL:
    """`url` parsed. Raises `EngineError` (invalid_config) for anything but an
    ``http://`` or ``https://`` URL with a host."""
    try:
        parsed = httpx2.URL(url)
    except httpx2.InvalidURL as e:
        raise EngineError("invalid_config", 500, f"upstream url {url!r} is not valid: {e}") \
            from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise EngineError("invalid_config", 500, f"upstream url {url!r} must start with http:// "
                          "or https:// and name a host")
    return parsed


def _client(url: httpx2.URL, timeout: float, auth: str | None, idle: int = MAX_IDLE
            ) -> httpx2.AsyncClient:
    """The client for one upstream: paths are relative to `url`, `timeout` bounds
    every connect, send and wait for bytes; the environment is not consulted;
    `idle`: keep-alive connections kept (0: a new connection per request)."""
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    if auth:
        headers["Authorization"] = f"Bearer {auth}"
    return httpx2.AsyncClient(
        base_url=url, headers=headers, timeout=httpx2.Timeout(timeout), trust_env=False,
        limits=httpx2.Limits(max_connections=None, max_keepalive_connections=idle,
                             keepalive_expiry=IDLE_S),
        verify=ssl.create_default_context())


def _headers(accept: str, body: bytes | None) -> dict[str, str]:
    if body is None:
        return {"Accept": accept}
    return {"Accept": accept, "Content-Type": "application/json"}


async def _read_body(resp: httpx2.Response, limit: int) -> bytes:
    """The rest of `resp`'s body. Raises `httpx2.RequestError`, and `EngineError`
    (upstream_error) past `limit` bytes."""
    parts: list[bytes] = []
    size = 0
    async with aclosing(resp.aiter_bytes()) as pieces:
        async for piece in pieces:
            size += len(piece)
            if size > limit:
                raise EngineError("upstream_error", 502, f"upstream answer exceeds {limit} bytes")
            parts.append(piece)
    return b"".join(parts)


def _hop_headers(headers: dict[str, str], request_id: str | None, signed_client: str | None
                 ) -> None:
    """Add what names a call on every tier it crosses: its request id and its
    caller's signed fair share (``x-edgefn-client``)."""
    if request_id is not None:
        headers["x-request-id"] = request_id
    if signed_client is not None:
        headers["x-edgefn-client"] = signed_client


def _tokenize_paths(url: str) -> list[str]:
    """Where token counts are asked, in turn: under `url`, then at its root (vLLM's
    ``/tokenize``) where `url` has a path (``/v1``)."""
    try:
        parsed = httpx2.URL(url)
    except httpx2.InvalidURL:
        return ["/tokenize"]  # the url's error is the first call's (`_check_url`)
    if not parsed.host or not parsed.path.strip("/"):
        return ["/tokenize"]
    return ["/tokenize", str(parsed.copy_with(path="/tokenize", query=None, fragment=None))]


def _asked_headers(asked: Embed | Rerank | CountTokens | None) -> dict[str, str]:
    """The hop headers of a whole-answer call (`_hop_headers`), none without `asked`."""
    headers: dict[str, str] = {}
    if asked is not None:
        _hop_headers(headers, asked.request_id, asked.signed_client)
    return headers


def _hung_up(e: httpx2.RequestError) -> bool:
    """Whether `e` says the upstream closed the connection before its answer ended
    (h11 and httpcore tell this only in the message)."""
    text = str(e).lower()
    return isinstance(e, httpx2.RemoteProtocolError) and (
        "peer closed" in text or "disconnected" in text)


# what a failure that carries no message of its own meant (httpx2 gives ReadError none
# when the peer reset the connection: a topology link with no route left does)
_SILENT = {httpx2.ReadError: "the connection was reset before the answer ended",
           httpx2.WriteError: "the connection was closed while the request was sent"}


def _describe(e: BaseException) -> str:
    if str(e):
        return str(e)
    meaning = next((text for kind, text in _SILENT.items() if isinstance(e, kind)), None)
    return f"{meaning} ({type(e).__name__})" if meaning else type(e).__name__


# -- upstream answers -----------------------------------------------------------------------

class _ModelEntry(msgspec.Struct):
    id: str


class _ModelList(msgspec.Struct):
    data: list[_ModelEntry]


class _Embedding(msgspec.Struct):
    embedding: list[float]
    index: int = 0


class _PromptUsage(msgspec.Struct):
    prompt_tokens: int = 0


class _Embeddings(msgspec.Struct):
    data: list[_Embedding]
    usage: _PromptUsage | None = None


def _code_for(status: int) -> str:
    if status == 404:
        return "model_not_found"
    if status in (408, 504):
        return "timeout"
    if status in (429, 503):
        return "overloaded"
    if status == 451:  # a tier of an edgefn topology serves no tenant pinned elsewhere
        return "residency_violation"
    if 400 <= status < 500:
        return "invalid_request"
    return "upstream_error"


def _error_message(obj: Any) -> str | None:
    """The message of an OpenAI-shaped error ({"error": {"message": ...}}), or of
    ``{"error": "..."}`` / ``{"detail": "..."}`` / ``{"message": "..."}``."""
    if not isinstance(obj, dict):
        return None
    err = obj.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    for key in ("error", "detail", "message"):
        if isinstance(obj.get(key), str):
            return str(obj[key])
    return None


# codes an upstream's error keeps when it names one (another edgefn PoP does: its 502
# upstream_unavailable stays that, tier after tier, and is not read as upstream_error)
KEPT_CODES = frozenset({"model_not_found", "timeout", "overloaded", "worker_unavailable",
                        "residency_violation", "invalid_request", "upstream_unavailable",
                        "upstream_error"})


def _http_error(status: int, body: bytes) -> EngineError:
    """An upstream error answer as an `EngineError` keeping its status and message,
    and its code when it is one of `KEPT_CODES` (else the code follows the status)."""
    try:
        obj = msgspec.json.decode(body)
    except msgspec.DecodeError:
        obj = None
    message = _error_message(obj)
    if message is None:
        text = body.decode("utf-8", "replace").strip()[:500]
        message = f"upstream answered HTTP {status}" + (f": {text}" if text else "")
    err = obj.get("error") if isinstance(obj, dict) else None
    named = err.get("code") if isinstance(err, dict) else None
    code = named if isinstance(named, str) and named in KEPT_CODES else _code_for(status)
    return EngineError(code, status, message)


def _event_error(obj: dict[str, Any]) -> EngineError:
    """An error event inside a stream (vLLM sends ``{"error": {..., "code": 400}}``)."""
    err = obj.get("error")
    code = err.get("code") if isinstance(err, dict) else None
    status = code if isinstance(code, int) and 400 <= code < 600 else 502
    return EngineError(_code_for(status), status, _error_message(obj) or "upstream stream failed")


def _decode_json(data: bytes | str, what: str) -> Any:
    """Raises `EngineError` (upstream_error) when `data` is not JSON."""
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        shown = data[:200] if isinstance(data, str) else data[:200].decode("utf-8", "replace")
        raise EngineError("upstream_error", 502, f"upstream sent {what} that is not JSON: "
                          f"{shown!r}") from None


# -- generations ----------------------------------------------------------------------------

class _Progress:
    """What a stream has told so far about how it ended."""

    def __init__(self) -> None:
        self.finish_reason: str | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.calls = CallText()
        self.logprobs: list[TokenLogprob] = []  # read since the last `take`

    def take(self) -> list[TokenLogprob] | None:
        """The logprobs read since the last call (None when there are none)."""
        out, self.logprobs = self.logprobs or None, []
        return out

    def read(self, obj: dict[str, Any]) -> str:
        """Take usage and finish reason from one chunk object; its text delta."""
        usage = obj.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("prompt_tokens"), int):
                self.prompt_tokens = usage["prompt_tokens"]
            if isinstance(usage.get("completion_tokens"), int):
                self.completion_tokens = usage["completion_tokens"]
        text = ""
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta", choice.get("message"))
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(piece, str):
                text += piece
            if isinstance(delta, dict):
                text += self.calls.feed(delta.get("tool_calls"))
            self.logprobs += token_logprobs(choice)
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]
                text += self.calls.close()
        return text


class _Stream:
    """One forwarded generation: its sink, credit window and task."""

    def __init__(self, req: Generate, sink: Sink) -> None:
        self.rid = req.id
        self.sink = sink
        self.traceparent = req.traceparent
        self.request_id = req.request_id
        self.tenant = req.tenant
        self.signed_client = req.signed_client
        self.desensitised = req.desensitised
        self.embedding = req.embedding
        self.window = req.window
        self.ahead = 0  # chunks sent minus chunks credited
        self.room = asyncio.Event()
        self.room.set()
        self.sent = 0
        self.over = False  # a terminal call was made, or the request was cancelled
        self.task: asyncio.Task[None] | None = None

    def credit(self, n: int) -> None:
        self.ahead -= n
        if self.ahead < self.window:
            self.room.set()

    async def chunk(self, text: str, logprobs: list[TokenLogprob] | None = None) -> None:
        """Send one chunk once the window has room (the upstream is not read meanwhile)."""
        while self.ahead >= self.window:
            self.room.clear()
            await self.room.wait()
        if not self.over:
            self.ahead += 1
            self.sent += 1
            if logprobs is None:
                self.sink.chunk(text, 1)
            else:
                self.sink.chunk(text, 1, logprobs)

    def done(self, p: _Progress) -> None:
        if not self.over:
            self.over = True
            completion = p.completion_tokens if p.completion_tokens is not None else self.sent
            self.sink.done(p.finish_reason or "stop", p.prompt_tokens or 0, completion)

    def error(self, code: str, message: str, status: int) -> None:
        if not self.over:
            self.over = True
            self.sink.error(code, message, status)


def _generate_body(req: Generate) -> tuple[str, bytes]:
    """The path and JSON body forwarded for `req`. Raises `EngineError`
    (invalid_request) when it has neither prompt nor messages."""
    body: dict[str, Any] = {"model": req.model}
    if req.messages is not None:
        path = "/chat/completions"
        body["messages"] = req.messages
    elif req.prompt is not None:
        path = "/completions"
        body["prompt"] = req.prompt
    else:
        raise EngineError("invalid_request", 400, "a generation needs a prompt or messages")
    body |= {"max_tokens": req.max_tokens or DEFAULT_MAX_TOKENS, "temperature": req.temperature,
             "top_p": req.top_p}
    if req.stop:
        body["stop"] = req.stop
    if req.seed is not None:
        body["seed"] = req.seed
    body |= forwarded(req) | {"stream": True, "stream_options": {"include_usage": True}}
    return path, msgspec.json.encode(body)


# -- the engine -----------------------------------------------------------------------------

class UpstreamEngine(Engine):
    """Serves the models of one OpenAI-compatible server at ``spec.url``."""

    kind = "openai"

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.url = spec.url.rstrip("/")
        self.timeout = spec.timeout
        self._served: list[str] = list(spec.models)
        self._tokenize = _tokenize_paths(spec.url)  # one that has no such path is dropped
        self._streams: dict[int, _Stream] = {}
        self._client: httpx2.AsyncClient | None = None
        self._closing: asyncio.Task[None] | None = None

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Check the config and, when ``models`` is empty, ask the upstream which it
        serves. Raises `EngineError`: invalid_config (bad url, api key variable unset,
        no models listed), upstream_unavailable (502, cannot connect), timeout (504),
        or the upstream's own error for a failed ``GET /models``."""
        self._setup()
        if self._served:
            return
        status, body = await self._call("GET", "/models", None)
        if status != 200:
            e = _http_error(status, body)
            raise EngineError(e.code, e.status, f"GET {self.url}/models: {e}")
        try:
            listed = msgspec.json.decode(body, type=_ModelList)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise EngineError("upstream_error", 502, f"GET {self.url}/models: unexpected answer: "
                              f"{e}") from None
        self._served = list(dict.fromkeys(m.id for m in listed.data))
        if not self._served:
            raise EngineError("invalid_config", 500, f"upstream {self.url} lists no models; name "
                              f"them in `models` for {self.spec.name!r}")

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(m, "chat", self.kind, details={"upstream": self.url})
                for m in self._served]

    def close(self) -> None:
        """Cancel every stream (no sink is called) and close the HTTP client once they
        have let go of their connections. Without a running event loop the client is
        left to the process's end."""
        tasks = [st.task for st in self._streams.values() if st.task is not None]
        for st in list(self._streams.values()):
            self._stop(st)
        self._streams.clear()
        client, self._client = self._client, None
        if client is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._closing = loop.create_task(_close_after(client, tasks))

    def _setup(self) -> httpx2.AsyncClient:
        """The HTTP client, made on first use from the url and api key. Raises
        `EngineError` (invalid_config)."""
        if self._client is None:
            url = _check_url(self.spec.url)
            self._client = _client(url, self.timeout, self._api_key())
        return self._client

    def _one_off(self) -> httpx2.AsyncClient:
        """A client whose request takes a new connection, closed after it: for the
        second try of a 503 that closed its connection (`_elsewhere`). The pool's
        other idle connections may lead where that one did."""
        return _client(_check_url(self.spec.url), self.timeout, self._api_key(), idle=0)

    def _api_key(self) -> str | None:
        """Raises `EngineError` (invalid_config) if ``api_key_env`` names an unset
        variable or one that is not a valid key."""
        if not self.spec.api_key_env:
            return None
        key = os.environ.get(self.spec.api_key_env, "")
        if not key or any(c in key for c in "\r\n"):
            raise EngineError("invalid_config", 500, f"environment variable "
                              f"{self.spec.api_key_env} (api_key_env of "
                              f"{self.spec.name!r}) is unset or not a valid key")
        return key

    # -- generation ---------------------------------------------------------------------
    def generate(self, req: Generate, sink: Sink) -> None:
        """Start forwarding `req`; its output goes to `sink` (exactly one of done or
        error unless it is cancelled). Raises `EngineError`: model_not_found (404),
        invalid_request (no prompt, window < 1, id already streaming), invalid_config."""
        client = self._setup()
        if req.model not in self._served:
            raise EngineError("model_not_found", 404, f"model {req.model!r} does not exist")
        if req.window < 1:
            raise EngineError("invalid_request", 400, "window must be at least 1")
        if req.id in self._streams:
            raise EngineError("invalid_request", 400, f"request id {req.id} is already streaming")
        path, body = _generate_body(req)
        st = _Stream(req, sink)
        st.task = asyncio.get_running_loop().create_task(self._run(client, st, path, body),
                                                         name=f"upstream-{req.id}")
        st.task.add_done_callback(functools.partial(self._ended, st))
        self._streams[req.id] = st

    def cancel(self, rid: int) -> None:
        st = self._streams.pop(rid, None)
        if st is not None:
            self._stop(st)

    def credit(self, rid: int, n: int) -> None:
        st = self._streams.get(rid)
        if st is not None:
            st.credit(n)

    def _stop(self, st: _Stream) -> None:
        """Silence `st` and cancel its task, which closes the upstream response."""
        st.over = True
        if st.task is not None:
            st.task.cancel()

    def _ended(self, st: _Stream, task: asyncio.Task[None]) -> None:
        if self._streams.get(st.rid) is st:
            del self._streams[st.rid]
        if not task.cancelled() and task.exception() is not None:
            log.error("upstream stream %d failed", st.rid, exc_info=task.exception())

    async def _run(self, client: httpx2.AsyncClient, st: _Stream, path: str, body: bytes
                   ) -> None:
        """Forward one generation and make its terminal sink call; never raises but
        `asyncio.CancelledError`."""
        try:
            await self._forward(client, st, path, body)
        except EngineError as e:
            st.error(e.code, str(e), e.status)
        except httpx2.RequestError as e:
            err = self._request_error(e, "sent nothing for")
            st.error(err.code, str(err), err.status)
        except Exception as e:
            log.exception("forwarding request %d to %s failed", st.rid, self.url)
            st.error("internal", f"forwarding to upstream {self.who} failed: "
                               f"{type(e).__name__}", 500)

    async def _forward(self, client: httpx2.AsyncClient, st: _Stream, path: str, body: bytes
                       ) -> None:
        """POST `body` and pass the answer to `st`. Raises `EngineError` and
        `httpx2.RequestError`."""
        headers = _headers("text/event-stream", body)
        if st.traceparent is not None:
            headers["traceparent"] = st.traceparent  # the trace goes on upstream
        _hop_headers(headers, st.request_id, st.signed_client)
        if st.tenant is not None:
            headers["x-edgefn-tenant"] = st.tenant
        if st.desensitised is not None:
            headers["x-edgefn-desensitised"] = st.desensitised
        if st.embedding is not None:
            headers["x-edgefn-embedding"] = st.embedding
        if not await _post(client, st, path, body, headers):
            async with self._one_off() as fresh:
                await _post(fresh, st, path, body, headers, last=True)

    # -- embeddings ---------------------------------------------------------------------
    async def embed(self, model: str, inputs: list[str], client: str | None = None,
                    asked: Embed | None = None) -> tuple[list[list[float]], int]:
        """POST ``/embeddings``; the vectors in input order and the prompt tokens the
        upstream counted. `client` goes on only as `asked` signed it (its
        ``signed_client``, with its request id): a PoP there trusts no other. Raises
        `EngineError`: model_not_found, the upstream's error (its status kept),
        upstream_unavailable (502), timeout (504), upstream_error."""
        self._served_or_404(model)
        status, body = await self._call("POST", "/embeddings",
                                        msgspec.json.encode({"model": model, "input": inputs}),
                                        _asked_headers(asked))
        if status != 200:
            raise _http_error(status, body)
        try:
            answer = msgspec.json.decode(body, type=_Embeddings)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise EngineError("upstream_error", 502, f"upstream embeddings answer: {e}") \
                from None
        if len(answer.data) != len(inputs):
            raise EngineError("upstream_error", 502, f"upstream returned {len(answer.data)} "
                              f"embeddings for {len(inputs)} inputs")
        vectors = [e.embedding for e in sorted(answer.data, key=lambda e: e.index)]
        return vectors, answer.usage.prompt_tokens if answer.usage else 0

    # -- rerank and token counts --------------------------------------------------------
    async def rerank(self, model: str, query: str, documents: list[str],
                     client: str | None = None, asked: Rerank | None = None
                     ) -> tuple[list[float], int]:
        """POST ``/rerank``; one score per document, in their order, and the tokens the
        upstream read. `asked` as `embed`'s. Raises `EngineError` as `embed` does."""
        self._served_or_404(model)
        status, body = await self._call("POST", "/rerank",
                                        counts.rerank_body(model, query, documents),
                                        _asked_headers(asked))
        if status != 200:
            raise _http_error(status, body)
        return counts.scores(body, len(documents))

    async def count_tokens(self, req: CountTokens) -> int:
        """POST ``/tokenize`` under the url (an edgefn PoP's ``/v1/tokenize``), else, for
        a prompt or messages, at the url's root (vLLM's); the first that serves it is
        kept. Its request id and signed client go on as `embed`'s. Raises
        `EngineError`: count_unsupported (400) where neither serves it, and what
        `embed` raises."""
        self._served_or_404(req.model)
        body, headers = counts.tokenize_body(req), _asked_headers(req)
        for path in [p for p in self._tokenize if req.inputs is None or p == "/tokenize"]:
            status, answer = await self._call("POST", path, body, headers)
            if status == 200:
                return counts.count(answer)
            if not counts.unserved(status, answer):
                raise _http_error(status, answer)
            self._tokenize.remove(path)
        raise EngineError("count_unsupported", 400, f"model {req.model!r} cannot count tokens: "
                          f"upstream {self.who} serves no /tokenize for it")

    def _served_or_404(self, model: str) -> None:
        if model not in self._served:
            raise EngineError("model_not_found", 404, f"model {model!r} does not exist")

    # -- plumbing -----------------------------------------------------------------------
    async def _call(self, method: str, path: str, body: bytes | None,
                    headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """One whole request and answer: status and body; `headers` besides the
        usual. Raises `EngineError`: invalid_config, upstream_unavailable (502),
        timeout (504), upstream_error (502)."""
        try:
            answered = await _call_once(self._setup(), method, path, body, headers=headers)
            if answered is None:
                async with self._one_off() as fresh:
                    answered = await _call_once(fresh, method, path, body, last=True,
                                                headers=headers)
            assert answered is not None  # `last`: never None
            return answered
        except httpx2.RequestError as e:
            raise self._request_error(e, f"did not answer {method} {path} within") from None

    def _request_error(self, e: httpx2.RequestError, silent: str) -> EngineError:
        """An httpx2 failure as an `EngineError`: timeout (504, "upstream <url> `silent`
        <timeout>s"), upstream_unavailable (502) when the upstream cannot be reached or
        hangs up, upstream_error (502) when it breaks HTTP."""
        who = self.who
        if isinstance(e, httpx2.TimeoutException):
            return EngineError("timeout", 504, f"upstream {who} {silent} {self.timeout:g}s")
        log.warning("upstream %s (%s): %s", self.spec.name, self.url, _describe(e))
        if isinstance(e, httpx2.NetworkError) or _hung_up(e):
            return EngineError("upstream_unavailable", 502, f"upstream {who} is unavailable: "
                               f"{_describe(e)}")
        return EngineError("upstream_error", 502, f"upstream {who} broke HTTP: {_describe(e)}")

    @property
    def who(self) -> str:
        """How errors a client reads name the upstream: its entry's name in the worker
        config, never its URL (an internal address; the worker's log has it)."""
        return repr(self.spec.name)


async def _open(client: httpx2.AsyncClient, method: str, path: str, body: bytes | None,
                headers: dict[str, str], last: bool) -> httpx2.Response | None:
    """Send a request and read its answer's head (the body is left to read, then
    `aclose`); None, unless `last`, when the connection hung up before the head: a
    kept connection the upstream closed meanwhile, to try once more on a new one.
    Raises `httpx2.RequestError`."""
    request = client.build_request(method, path, content=body, headers=headers)
    try:
        return await client.send(request, stream=True)
    except (httpx2.ReadError, httpx2.WriteError, httpx2.RemoteProtocolError) as e:
        if last or (isinstance(e, httpx2.RemoteProtocolError) and not _hung_up(e)):
            raise  # the second try, or an upstream that breaks HTTP
        return None


async def _post(client: httpx2.AsyncClient, st: _Stream, path: str, body: bytes,
                headers: dict[str, str], last: bool = False) -> bool:
    """POST `body` and pass the answer to `st`; False (nothing passed) to try once
    more on a new connection (a 503 that closed its connection, `_elsewhere`, or a
    connection that hung up before the head) unless `last`. Raises `EngineError`
    and `httpx2.RequestError`."""
    resp = await _open(client, "POST", path, body, headers, last)
    if resp is None:
        return False
    try:
        if resp.status_code != 200:
            error = await _read_body(resp, MAX_ERROR_BODY)
            if not last and _elsewhere(resp):
                return False
            raise _http_error(resp.status_code, error)
        await _answer(st, resp)
        return True
    finally:
        await resp.aclose()


async def _call_once(client: httpx2.AsyncClient, method: str, path: str, body: bytes | None,
                     last: bool = False, headers: dict[str, str] | None = None
                     ) -> tuple[int, bytes] | None:
    """Status and body; None (unless `last`) to try once more on a new connection
    (as `_post`). Raises `EngineError` (the body too long), `httpx2.RequestError`."""
    sent = _headers("application/json", body) | (headers or {})
    resp = await _open(client, method, path, body, sent, last)
    if resp is None:
        return None
    try:
        limit = MAX_BODY if resp.status_code == 200 else MAX_ERROR_BODY
        answer = await _read_body(resp, limit)
        if not last and _elsewhere(resp):
            return None
        return resp.status_code, answer
    finally:
        await resp.aclose()


def _elsewhere(resp: httpx2.Response) -> bool:
    """Whether `resp` is a 503 that closed its connection: another try, on a new
    connection, may reach a server that is ready."""
    return resp.status_code == 503 and resp.headers.get("connection", "").lower() == "close"


async def _answer(st: _Stream, resp: httpx2.Response) -> None:
    """Pass a 200 answer (streamed or whole) to `st`, then its end."""
    progress = _Progress()
    if "text/event-stream" in resp.headers.get("content-type", ""):
        await _events(st, resp, progress)
    else:
        await _whole(st, resp, progress)
    st.done(progress)


async def _events(st: _Stream, resp: httpx2.Response, progress: _Progress) -> None:
    """Pass a stream of server-sent events to `st` until ``[DONE]`` or the end of
    the body; after ``[DONE]``, tell `st` it is done and read what is left of the
    body (`_rest`). Raises `httpx2.RequestError` (`httpx2.SSEError` for an event
    over `MAX_EVENT` bytes), and `EngineError` for an error event or an event that
    is not a JSON object."""
    source = httpx2.EventSource(resp, max_event_size=MAX_EVENT)
    # an async generator (typed as an iterator): closed on the way out
    events = cast("AsyncGenerator[httpx2.ServerSentEvent]", aiter(source))
    async with aclosing(events):
        async for sse in events:
            if sse.data and await _event(st, sse.data, progress):
                st.done(progress)
                return await _rest(events)


async def _rest(events: AsyncGenerator[httpx2.ServerSentEvent]) -> None:
    """Read the body past ``[DONE]`` to its end (nothing more is passed on), so that
    its connection is kept; given up after `DRAIN_S` or a failure (the connection
    is then closed, and the answer stands)."""
    try:
        async with asyncio.timeout(DRAIN_S):
            async for _ in events:
                pass
    except (TimeoutError, httpx2.RequestError):
        pass


async def _event(st: _Stream, event: str, progress: _Progress) -> bool:
    """Pass one event's text to `st`; True for ``[DONE]``. Raises `EngineError` for
    an error event or one that is not a JSON object."""
    if event.strip() == "[DONE]":
        return True
    obj = _decode_json(event, "an event")
    if not isinstance(obj, dict):
        raise EngineError("upstream_error", 502, "upstream event is not a JSON object")
    if "error" in obj:
        raise _event_error(obj)
    if text := progress.read(obj):
        await st.chunk(text, progress.take())
    return False


async def _whole(st: _Stream, resp: httpx2.Response, progress: _Progress) -> None:
    """Pass a whole (non-streamed) JSON answer to `st` as one chunk. Raises
    `httpx2.RequestError`, and `EngineError` for an answer that is not a JSON object."""
    obj = _decode_json(await _read_body(resp, MAX_BODY), "an answer")
    if not isinstance(obj, dict):
        raise EngineError("upstream_error", 502, "upstream answer is not a JSON object")
    if text := progress.read(obj):
        await st.chunk(text, progress.take())


async def _close_after(client: httpx2.AsyncClient, tasks: list[asyncio.Task[None]]) -> None:
    """Close `client` once the cancelled stream `tasks` have closed their responses."""
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.aclose()
