"""Forward requests to an OpenAI-compatible HTTP server (``engine = "openai"``).

This is how edgefn scales past one box: a worker entry names the ``url`` of vLLM,
a llama.cpp server or another edgefn PoP, and chat, completion and embedding
requests for its ``models`` are sent there; streamed answers come back as
server-sent events and are passed to the worker's sink chunk by chunk.

The HTTP/1.1 client is a small one on asyncio streams (stdlib and msgspec only):
one request per connection (``Connection: close``), ``http://`` or ``https://``,
response bodies with ``Content-Length``, chunked, or up to EOF.

- Cancel closes the connection, which is how the upstream learns to stop.
- Flow control: a stream that has run ``window`` chunks ahead of its credit stops
  reading the upstream socket until credit arrives, so TCP backpressure reaches
  the upstream server.
- ``timeout`` bounds connecting and every wait for the upstream's next bytes (not
  a wait for the client's credit).

Upstream errors keep the upstream's HTTP status and message; the code is derived
from the status (404 model_not_found, 408/504 timeout, 429/503 overloaded, other
4xx invalid_request, anything else upstream_error). An upstream that cannot be
reached is ``upstream_unavailable`` (502), one that goes silent is ``timeout`` (504).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import ssl
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlsplit

import msgspec

from . import Engine, EngineError, ModelInfo

if TYPE_CHECKING:
    from ..config import ModelSpec
    from ..protocol import Generate
    from . import Sink

log = logging.getLogger(__name__)

READ_SIZE = 64 * 1024  # bytes asked of the socket at a time
MAX_BODY = 64 * 1024 * 1024  # a whole (non-streamed) answer: model list, embeddings
MAX_ERROR_BODY = 1024 * 1024  # an error answer
MAX_LINE = 16 * 1024 * 1024  # one server-sent-events line
USER_AGENT = "edgefn-gpu-worker"


# -- HTTP/1.1 client ------------------------------------------------------------------------

class _Target(NamedTuple):
    host: str
    port: int
    path: str  # the URL's path without a trailing slash, e.g. "/v1"
    host_header: str
    tls: ssl.SSLContext | None


def _parse_url(url: str) -> _Target:
    """Where `url` points. Raises `EngineError` (invalid_config) for anything but an
    ``http://`` or ``https://`` URL with a host."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise EngineError("invalid_config", f"upstream url {url!r} is not valid: {e}", 500) \
            from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EngineError("invalid_config", f"upstream url {url!r} must start with http:// "
                          "or https:// and name a host", 500)
    tls = parts.scheme == "https"
    default = 443 if tls else 80
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    return _Target(host, port or default, parts.path.rstrip("/"),
                   shown if port in (None, default) else f"{shown}:{port}",
                   ssl.create_default_context() if tls else None)


def _request_head(t: _Target, method: str, path: str, auth: str | None,
                  body: bytes | None, accept: str) -> bytes:
    lines = [f"{method} {t.path}{path} HTTP/1.1", f"Host: {t.host_header}",
             f"User-Agent: {USER_AGENT}", f"Accept: {accept}", "Connection: close"]
    if auth:
        lines.append(f"Authorization: Bearer {auth}")
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _parse_head(raw: bytes) -> tuple[int, dict[str, str]]:
    """Status and lower-cased headers of a response head. Raises `EngineError`
    (upstream_error) when it is not HTTP."""
    status_line, *lines = raw.decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise EngineError("upstream_error", f"upstream answered {status_line[:100]!r}, "
                          "not HTTP", 502)
    headers: dict[str, str] = {}
    for line in lines:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise EngineError("upstream_error", f"upstream sent a bad header {line[:100]!r}", 502)
        key = name.strip().lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    return int(parts[1]), headers


async def _read_head(reader: asyncio.StreamReader, timeout: float) -> tuple[int, dict[str, str]]:
    """The final (non-1xx) response head. Raises `TimeoutError`,
    `asyncio.IncompleteReadError` if the upstream closes, `EngineError` if it is not HTTP."""
    while True:
        try:
            async with asyncio.timeout(timeout):
                raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise EngineError("upstream_error", "upstream sent an oversized response head",
                              502) from None
        status, headers = _parse_head(raw[:-4])
        if status >= 200:
            return status, headers


class _Body:
    """A response body as it arrives: ``Content-Length``, chunked, or up to EOF."""

    def __init__(self, reader: asyncio.StreamReader, headers: dict[str, str],
                 timeout: float) -> None:
        """Raises `EngineError` (upstream_error) for a bad ``Content-Length``."""
        self._reader = reader
        self._timeout = timeout
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._left: int | None = 0 if self._chunked else None  # bytes left (None: to EOF)
        self._crlf = False  # a chunk's trailing CRLF is still unread
        self._end = False
        if not self._chunked and "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit():
                raise EngineError("upstream_error", f"upstream sent Content-Length {length!r}",
                                  502)
            self._left = int(length)

    async def read(self) -> bytes:
        """The next piece, or b"" at the end. Raises `TimeoutError` when the upstream
        is silent for ``timeout`` seconds, `asyncio.IncompleteReadError` when it closes
        mid-body, `EngineError` (upstream_error) for bad chunked framing."""
        if self._end:
            return b""
        async with asyncio.timeout(self._timeout):
            if self._chunked and self._left == 0:
                await self._next_chunk()
                if self._end:
                    return b""
            return await self._read_some()

    async def read_all(self, limit: int) -> bytes:
        """The rest of the body. Raises what `read` raises, and `EngineError`
        (upstream_error) past `limit` bytes."""
        parts: list[bytes] = []
        size = 0
        while piece := await self.read():
            size += len(piece)
            if size > limit:
                raise EngineError("upstream_error", f"upstream answer exceeds {limit} bytes", 502)
            parts.append(piece)
        return b"".join(parts)

    async def _read_some(self) -> bytes:
        if self._left is None:
            data = await self._reader.read(READ_SIZE)
            self._end = not data
            return data
        if self._left == 0:
            self._end = True
            return b""
        data = await self._reader.read(min(self._left, READ_SIZE))
        if not data:
            raise asyncio.IncompleteReadError(b"", self._left)
        self._left -= len(data)
        self._crlf = self._chunked and self._left == 0
        return data

    async def _next_chunk(self) -> None:
        if self._crlf:
            if await self._reader.readexactly(2) != b"\r\n":
                raise EngineError("upstream_error", "upstream sent bad chunked framing", 502)
            self._crlf = False
        size = _chunk_size(await self._line())
        if size == 0:
            while (await self._line()).strip():  # trailers
                pass
            self._end = True
        self._left = size

    async def _line(self) -> bytes:
        try:
            return await self._reader.readuntil(b"\n")
        except asyncio.LimitOverrunError:
            raise EngineError("upstream_error", "upstream sent an oversized chunk header",
                              502) from None


def _chunk_size(line: bytes) -> int:
    """The size in a chunk-size line. Raises `EngineError` (upstream_error)."""
    digits = line.split(b";", 1)[0].strip()
    if not digits or digits.strip(b"0123456789abcdefABCDEF"):
        raise EngineError("upstream_error", f"upstream sent a bad chunk size {line[:40]!r}",
                          502)
    return int(digits, 16)


class _Sse:
    """Splits the data of server-sent events out of a byte stream."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._data: list[str] = []

    def feed(self, data: bytes) -> list[str]:
        """The events completed by `data`. Raises `EngineError` (upstream_error) for a
        line longer than `MAX_LINE`."""
        searched = len(self._buf)  # what is buffered holds no newline
        self._buf += data
        events: list[str] = []
        start = 0
        while (nl := self._buf.find(b"\n", searched)) >= 0:
            self._line(bytes(self._buf[start:nl]), events)
            start = searched = nl + 1
        del self._buf[:start]
        if len(self._buf) > MAX_LINE:
            raise EngineError("upstream_error", f"upstream sent an event line over {MAX_LINE} "
                              "bytes", 502)
        return events

    def end(self) -> list[str]:
        """Events left when the stream ends without a final blank line."""
        events: list[str] = []
        if self._buf:
            self._line(bytes(self._buf), events)
            self._buf.clear()
        self._line(b"", events)
        return events

    def _line(self, line: bytes, events: list[str]) -> None:
        line = line.removesuffix(b"\r")
        if not line:
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        name, _, value = line.partition(b":")
        if name == b"data":  # comments (":...") and other fields are ignored
            self._data.append(value.removeprefix(b" ").decode("utf-8", "replace"))


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


def _http_error(status: int, body: bytes) -> EngineError:
    """An upstream error answer as an `EngineError` keeping its status and message."""
    try:
        message = _error_message(msgspec.json.decode(body))
    except msgspec.DecodeError:
        message = None
    if message is None:
        text = body.decode("utf-8", "replace").strip()[:500]
        message = f"upstream answered HTTP {status}" + (f": {text}" if text else "")
    return EngineError(_code_for(status), message, status)


def _event_error(obj: dict[str, Any]) -> EngineError:
    """An error event inside a stream (vLLM sends ``{"error": {..., "code": 400}}``)."""
    err = obj.get("error")
    code = err.get("code") if isinstance(err, dict) else None
    status = code if isinstance(code, int) and 400 <= code < 600 else 502
    return EngineError(_code_for(status), _error_message(obj) or "upstream stream failed",
                       status)


def _decode_json(data: bytes | str, what: str) -> Any:
    """Raises `EngineError` (upstream_error) when `data` is not JSON."""
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError:
        shown = data[:200] if isinstance(data, str) else data[:200].decode("utf-8", "replace")
        raise EngineError("upstream_error", f"upstream sent {what} that is not JSON: "
                          f"{shown!r}", 502) from None


def _describe(e: BaseException) -> str:
    if isinstance(e, asyncio.IncompleteReadError):
        return "it closed the connection mid-answer"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


# -- generations ----------------------------------------------------------------------------

class _Progress:
    """What a stream has told so far about how it ended."""

    def __init__(self) -> None:
        self.finish_reason: str | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None

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
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]
        return text


class _Stream:
    """One forwarded generation: its sink, credit window, connection and task."""

    def __init__(self, req: Generate, sink: Sink) -> None:
        self.rid = req.id
        self.sink = sink
        self.window = req.window
        self.ahead = 0  # chunks sent minus chunks credited
        self.room = asyncio.Event()
        self.room.set()
        self.sent = 0
        self.over = False  # a terminal call was made, or the request was cancelled
        self.writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None] | None = None

    def credit(self, n: int) -> None:
        self.ahead -= n
        if self.ahead < self.window:
            self.room.set()

    async def chunk(self, text: str) -> None:
        """Send one chunk once the window has room (the upstream is not read meanwhile)."""
        while self.ahead >= self.window:
            self.room.clear()
            await self.room.wait()
        if not self.over:
            self.ahead += 1
            self.sent += 1
            self.sink.chunk(text, 1)

    def done(self, p: _Progress) -> None:
        if not self.over:
            self.over = True
            completion = p.completion_tokens if p.completion_tokens is not None else self.sent
            self.sink.done(p.finish_reason or "stop", p.prompt_tokens or 0, completion)

    def error(self, code: str, message: str, status: int) -> None:
        if not self.over:
            self.over = True
            self.sink.error(code, message, status)

    def close(self) -> None:
        """Close the upstream connection (idempotent)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None


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
        raise EngineError("invalid_request", "a generation needs a prompt or messages")
    body |= {"max_tokens": req.max_tokens, "temperature": req.temperature, "top_p": req.top_p}
    if req.stop:
        body["stop"] = req.stop
    if req.seed is not None:
        body["seed"] = req.seed
    body |= {"stream": True, "stream_options": {"include_usage": True}}
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
        self._streams: dict[int, _Stream] = {}
        self._target: _Target | None = None
        self._auth: str | None = None

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
            raise EngineError(e.code, f"GET {self.url}/models: {e}", e.status)
        try:
            listed = msgspec.json.decode(body, type=_ModelList)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise EngineError("upstream_error", f"GET {self.url}/models: unexpected answer: "
                              f"{e}", 502) from None
        self._served = list(dict.fromkeys(m.id for m in listed.data))
        if not self._served:
            raise EngineError("invalid_config", f"upstream {self.url} lists no models; name "
                              f"them in `models` for {self.spec.name!r}", 500)

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(m, "chat", self.kind, details={"upstream": self.url})
                for m in self._served]

    def close(self) -> None:
        """Cancel every stream and close its connection; no sink is called."""
        for st in list(self._streams.values()):
            self._stop(st)
        self._streams.clear()

    def _setup(self) -> None:
        """Parse the url and read the api key once. Raises `EngineError` (invalid_config)."""
        if self._target is not None:
            return
        target = _parse_url(self.spec.url)
        if self.spec.api_key_env:
            key = os.environ.get(self.spec.api_key_env, "")
            if not key or any(c in key for c in "\r\n"):
                raise EngineError("invalid_config", f"environment variable "
                                  f"{self.spec.api_key_env} (api_key_env of "
                                  f"{self.spec.name!r}) is unset or not a valid key", 500)
            self._auth = key
        self._target = target

    # -- generation ---------------------------------------------------------------------
    def generate(self, req: Generate, sink: Sink) -> None:
        """Start forwarding `req`; its output goes to `sink` (exactly one of done or
        error unless it is cancelled). Raises `EngineError`: model_not_found (404),
        invalid_request (no prompt, window < 1, id already streaming), invalid_config."""
        self._setup()
        if req.model not in self._served:
            raise EngineError("model_not_found", f"model {req.model!r} does not exist", 404)
        if req.window < 1:
            raise EngineError("invalid_request", "window must be at least 1")
        if req.id in self._streams:
            raise EngineError("invalid_request", f"request id {req.id} is already streaming")
        path, body = _generate_body(req)
        st = _Stream(req, sink)
        st.task = asyncio.get_running_loop().create_task(self._run(st, path, body),
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
        st.over = True
        st.close()
        if st.task is not None:
            st.task.cancel()

    def _ended(self, st: _Stream, task: asyncio.Task[None]) -> None:
        if self._streams.get(st.rid) is st:
            del self._streams[st.rid]
        if not task.cancelled() and task.exception() is not None:
            log.error("upstream stream %d failed", st.rid, exc_info=task.exception())

    async def _run(self, st: _Stream, path: str, body: bytes) -> None:
        """Forward one generation and make its terminal sink call; never raises but
        `asyncio.CancelledError`."""
        try:
            await self._forward(st, path, body)
        except EngineError as e:
            st.error(e.code, str(e), e.status)
        except TimeoutError:
            st.error("timeout", f"upstream {self.url} sent nothing for {self.timeout:g}s", 504)
        except (OSError, asyncio.IncompleteReadError) as e:
            st.error("upstream_unavailable", f"upstream {self.url} is unavailable: "
                     f"{_describe(e)}", 502)
        except Exception as e:
            log.exception("forwarding request %d to %s failed", st.rid, self.url)
            st.error("internal", f"forwarding to {self.url} failed: {e!r}", 500)
        finally:
            st.close()

    async def _forward(self, st: _Stream, path: str, body: bytes) -> None:
        """POST `body` and pass the answer to `st`. Raises `EngineError`, `TimeoutError`,
        `OSError`, `asyncio.IncompleteReadError`."""
        reader, st.writer = await self._connect()
        await self._send(st.writer, "POST", path, body, "text/event-stream")
        status, headers = await _read_head(reader, self.timeout)
        resp = _Body(reader, headers, self.timeout)
        if status != 200:
            raise _http_error(status, await resp.read_all(MAX_ERROR_BODY))
        progress = _Progress()
        if "text/event-stream" not in headers.get("content-type", ""):
            obj = _decode_json(await resp.read_all(MAX_BODY), "an answer")
            if not isinstance(obj, dict):
                raise EngineError("upstream_error", "upstream answer is not a JSON object", 502)
            if text := progress.read(obj):
                await st.chunk(text)
        else:
            await self._events(st, resp, progress)
        st.done(progress)

    async def _events(self, st: _Stream, resp: _Body, progress: _Progress) -> None:
        """Pass a stream of server-sent events to `st` until ``[DONE]`` or the end of
        the body. Raises what `_Body.read` raises, and `EngineError` for an error event
        or an event that is not a JSON object."""
        sse = _Sse()
        while True:
            data = await resp.read()
            for event in sse.feed(data) if data else sse.end():
                if event.strip() == "[DONE]":
                    return
                obj = _decode_json(event, "an event")
                if not isinstance(obj, dict):
                    raise EngineError("upstream_error", "upstream event is not a JSON object",
                                      502)
                if "error" in obj:
                    raise _event_error(obj)
                if text := progress.read(obj):
                    await st.chunk(text)
            if not data:
                return

    # -- embeddings ---------------------------------------------------------------------
    async def embed(self, model: str, inputs: list[str]) -> tuple[list[list[float]], int]:
        """POST ``/embeddings``; the vectors in input order and the prompt tokens the
        upstream counted. Raises `EngineError`: model_not_found, the upstream's error
        (its status kept), upstream_unavailable (502), timeout (504), upstream_error."""
        self._setup()
        if model not in self._served:
            raise EngineError("model_not_found", f"model {model!r} does not exist", 404)
        status, body = await self._call("POST", "/embeddings",
                                        msgspec.json.encode({"model": model, "input": inputs}))
        if status != 200:
            raise _http_error(status, body)
        try:
            answer = msgspec.json.decode(body, type=_Embeddings)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise EngineError("upstream_error", f"upstream embeddings answer: {e}", 502) \
                from None
        if len(answer.data) != len(inputs):
            raise EngineError("upstream_error", f"upstream returned {len(answer.data)} "
                              f"embeddings for {len(inputs)} inputs", 502)
        vectors = [e.embedding for e in sorted(answer.data, key=lambda e: e.index)]
        return vectors, answer.usage.prompt_tokens if answer.usage else 0

    # -- plumbing -----------------------------------------------------------------------
    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Raises `TimeoutError` or `OSError`."""
        self._setup()
        assert self._target is not None
        t = self._target
        async with asyncio.timeout(self.timeout):
            return await asyncio.open_connection(t.host, t.port, ssl=t.tls)

    async def _send(self, writer: asyncio.StreamWriter, method: str, path: str,
                    body: bytes | None, accept: str) -> None:
        """Raises `TimeoutError` or `OSError`."""
        assert self._target is not None
        writer.write(_request_head(self._target, method, path, self._auth, body, accept))
        if body:
            writer.write(body)
        async with asyncio.timeout(self.timeout):
            await writer.drain()

    async def _call(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        """One whole request and answer: status and body. Raises `EngineError`:
        upstream_unavailable (502), timeout (504), upstream_error (502)."""
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await self._connect()
            await self._send(writer, method, path, body, "application/json")
            status, headers = await _read_head(reader, self.timeout)
            resp = _Body(reader, headers, self.timeout)
            return status, await resp.read_all(MAX_BODY if status == 200 else MAX_ERROR_BODY)
        except TimeoutError:
            raise EngineError("timeout", f"upstream {self.url} did not answer {method} {path} "
                              f"within {self.timeout:g}s", 504) from None
        except (OSError, asyncio.IncompleteReadError) as e:
            raise EngineError("upstream_unavailable", f"upstream {self.url} is unavailable: "
                              f"{_describe(e)}", 502) from None
        finally:
            if writer is not None:
                writer.close()
