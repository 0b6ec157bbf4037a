"""The guest SDK for Python functions: a small fetch-style Request and Response.

    from edgefn import Response

    def handle(request, env):
        name = request.query.get("name", "world")
        return Response.json({"hello": name})

A handler may be ``async def``. A Response body may be bytes, str, or a
(sync or async) generator of bytes/str, which is streamed to the client.
Only the standard library is available inside isolates (see README). The
request's encoding is the function ABI's (`edgefn_core.abi`, on the isolate's
path), shared with the PoP.
"""

from __future__ import annotations

import base64
import json as _json
from collections.abc import AsyncIterator, Iterable, Iterator
from functools import cached_property
from typing import Any
from urllib.parse import parse_qsl

from edgefn_core import abi as _abi

__all__ = ["KV", "BindingError", "Env", "FetchResponse", "Headers", "Principal", "Request",
           "Response", "Vectors"]



class BindingError(RuntimeError):
    """A binding call the PoP denied (a namespace, index or model the function did
    not declare) or that failed (bad arguments, a value too large); the message
    says which. Uncaught, the request fails with ``x-edgefn-error: binding``.
    A RuntimeError, so ``except RuntimeError`` catches it too."""


class Headers:
    """Case-insensitive multi-map of header names to values (str)."""

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        self._items = [(k.lower(), v) for k, v in items]

    def get(self, name: str, default: str | None = None) -> str | None:
        name = name.lower()
        for k, v in self._items:
            if k == name:
                return v
        return default

    def get_all(self, name: str) -> list[str]:
        name = name.lower()
        return [v for k, v in self._items if k == name]

    def __getitem__(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __setitem__(self, name: str, value: str) -> None:
        name = name.lower()
        self._items = [(k, v) for k, v in self._items if k != name] + [(name, value)]

    def items(self) -> list[tuple[str, str]]:
        return list(self._items)

    def keys(self) -> list[str]:
        """Each field's name, once per field (a repeated one repeats)."""
        return [k for k, _ in self._items]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(k for k, _ in self._items)

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"


class Principal:
    """Who is calling, as the PoP's auth stage proved it: `kind` ("key" or "jwt"),
    `tenant`, `scopes`, `key_id` (an API key's public id, never the key), `subject`
    (a JWT's ``sub``)."""

    def __init__(self, fields: dict[str, str]) -> None:
        self.kind = fields.get("kind", "")
        self.tenant = fields.get("tenant", "")
        self.scopes = tuple(fields.get("scopes", "").split())
        self.key_id = fields.get("key_id")
        self.subject = fields.get("subject")

    def __repr__(self) -> str:
        return f"Principal(kind={self.kind!r}, tenant={self.tenant!r}, key_id={self.key_id!r})"


class Request:
    """An incoming request: method, url, path, query (dict), headers, body,
    `params`: what the route's pattern captured (``/users/:id`` on ``/users/42``
    gives ``{"id": "42"}``; a final ``/*`` puts the rest of the path under
    ``"*"``), as raw as `path` (still percent-encoded); `principal`: who is
    calling (a `Principal`, None when anonymous); `bot`: the client's class
    (browser, verified_agent, declared_agent, automation, abusive; None when the
    PoP does not classify) and `agent`: a verified AI agent's identity."""

    principal: Principal | None = None
    bot: str | None = None
    agent: str | None = None

    def __init__(self, method: str, path: str, query_string: str, headers: Headers,
                 body: bytes, params: dict[str, str] | None = None) -> None:
        self.method = method
        self.path = path
        self.query_string = query_string
        self.headers = headers
        self.body = body
        self.params = params if params is not None else {}

    # A request from the PoP (`_decode`) decodes its headers and params when first
    # read: most handlers read few of them, and decoding all of them cost a hello
    # request a third of its time in the isolate.
    _raw: Any = None

    @cached_property
    def headers(self) -> Headers:
        return Headers([(k.decode("latin-1"), v.decode("utf-8", "replace"))
                        for k, v in self._raw.headers])

    @cached_property
    def params(self) -> dict[str, str]:
        return {k.decode("latin-1"): v.decode("latin-1") for k, v in self._raw.params}

    @cached_property
    def query(self) -> dict[str, str]:
        qs = self.query_string
        if not qs:  # most requests: no generator made for nothing (~0.4 us of a hello's)
            return {}
        if "%" not in qs and "+" not in qs:  # nothing to unquote: parse_qsl's answer, 5x faster
            return dict(field.partition("=")[::2] for field in qs.split("&") if field)
        return dict(parse_qsl(qs, keep_blank_values=True))

    @cached_property
    def url(self) -> str:
        host = self.headers.get("host", "localhost")
        return f"http://{host}{self.path}" + (f"?{self.query_string}" if self.query_string else "")

    def text(self) -> str:
        return self.body.decode("utf-8")

    def json(self) -> Any:
        """Raises ValueError if the body is not JSON."""
        return _json.loads(self.body)

    @classmethod
    def _decode(cls, buf: bytes) -> tuple[Request, dict[str, str]]:
        """The request and the manifest's env from the PoP's encoding (the function
        ABI, `edgefn_core.abi`). Raises `ProtocolError` if `buf` is malformed."""
        r = _abi.decode_request(buf)
        request = cls.__new__(cls)  # `headers` and `params` come from `_raw` when read
        request._raw = r
        request.method, request.path = r.method.decode("latin-1"), r.path.decode("latin-1")
        request.query_string, request.body = r.query.decode("latin-1"), r.body
        if r.principal:
            who = {k.decode(): v.decode("utf-8", "replace") for k, v in r.principal}
            if "tenant" in who:
                request.principal = Principal(who)
            request.bot, request.agent = who.get("bot"), who.get("agent")
        # (most functions declare no env: no comprehension made for none)
        env = {k.decode("latin-1"): v.decode("utf-8", "replace")
               for k, v in r.env} if r.env else {}
        return request, env


Body = bytes | str | Iterable[bytes | str] | AsyncIterator[bytes | str]


class Response:
    """An outgoing response. `body` may be bytes, str or a (async) generator."""

    def __init__(self, body: Body = b"", status: int = 200,
                 headers: dict[str, str] | Headers | Iterable[tuple[str, str]] | None = None
                 ) -> None:
        """`headers`: a dict (names differing only in case are one field: the last
        wins), `Headers` (a fetch response's, passed on), or (name, value) pairs
        (a name may repeat: Set-Cookie)."""
        self.body = body
        self.status = status
        if headers is None:  # the common case, without the checks below (~1 us a response)
            # (not `Headers()`: its __init__ runs a comprehension over nothing)
            self.headers = h = Headers.__new__(Headers)
            typed = isinstance(body, str) and status not in (204, 304)
            h._items = [("content-type", "text/plain; charset=utf-8")] if typed else []
            return
        if isinstance(headers, dict):
            self.headers = Headers()
            for name, value in headers.items():
                self.headers[name] = value
        else:
            self.headers = Headers(headers.items() if isinstance(headers, Headers)
                                   else (headers or []))
        # a 204 or 304 has no content to type (RFC 9110 15.4.5): a 304's Content-Type
        # replaced the stored response's in the PoP's HTTP cache (JSON became text)
        if isinstance(body, str) and "content-type" not in self.headers \
                and status not in (204, 304):
            self.headers["content-type"] = "text/plain; charset=utf-8"

    @classmethod
    def json(cls, data: Any, status: int = 200,
             headers: dict[str, str] | None = None) -> Response:
        r = cls(_json.dumps(data).encode(), status, headers)
        # application/problem+json and the like stay; a 204 or 304 carries no content
        if "content-type" not in r.headers and status not in (204, 304):
            r.headers["content-type"] = "application/json"
        return r

    @property
    def streaming(self) -> bool:
        return not isinstance(self.body, (bytes, bytearray, memoryview, str))


class Env:
    """What a handler gets besides the request: the manifest's env vars as `vars`
    and `log()`, and the bindings: `kv()`, `vectors()`, `ai()`, `fetch()`."""

    def __init__(self, vars: dict[str, str], call: Any, kv_reader: Any = None) -> None:
        self.vars = vars
        self._call = call
        self._kv_reader = kv_reader  # reads served in the isolate's host, if it may

    def log(self, *parts: object) -> None:
        """Write a line to the PoP's log, tagged with the function's name."""
        self._call("log", {"message": " ".join(str(p) for p in parts)})

    def kv(self, namespace: str) -> KV:
        """The KV namespace `namespace` (declared under [bindings] kv)."""
        return KV(namespace, self._call, self._kv_reader)

    def vectors(self, index: str) -> Vectors:
        """The vector index `index` (declared under [bindings] vectors)."""
        return Vectors(index, self._call)

    def ai(self, model: str = "smollm2-135m") -> AI:
        """Models of the PoP's model worker (declare `ai = true` under [bindings])."""
        return AI(model, self._call)

    def fetch(self, url: str, *, method: str = "GET", headers: dict[str, str] | None = None,
              body: bytes | str | None = None, timeout: float | None = None) -> FetchResponse:
        """An HTTP(S) request made by the PoP to a URL the manifest allows (``fetch =
        ["https://api.example.com/*"]`` under [bindings]); redirects are not followed.
        It counts against the function's wall-time limit. Raises `BindingError` (a URL
        not allowed, a private address, a timeout, a response over 8 MiB)."""
        data = body.encode() if isinstance(body, str) else body
        args: dict[str, Any] = {"url": url, "method": method, "headers": headers or {}}
        if data:
            args["body"] = base64.b64encode(data).decode()
        if timeout is not None:
            args["timeout_ms"] = max(1, int(timeout * 1000))
        out = self._call("fetch", args, True)
        return FetchResponse(out["status"], out.get("header_list") or out["headers"],
                             base64.b64decode(out["body"]))

    def deployment(self) -> dict[str, str]:
        """This function's name and the version serving this request (asks the PoP)."""
        result: dict[str, str] = self._call("deployment", {}, True)
        return result


class FetchResponse:
    """What `Env.fetch` got back: `status`, `headers` (names lower-cased; a repeated
    field once per line: ``headers.get_all("set-cookie")``) and `body`."""

    def __init__(self, status: int, headers: dict[str, str] | list[list[str]],
                 body: bytes) -> None:
        self.status = status
        pairs = headers.items() if isinstance(headers, dict) else headers
        self.headers = Headers((k, v) for k, v in pairs)
        self.body = body

    def text(self) -> str:
        return self.body.decode()

    def json(self) -> Any:
        return _json.loads(self.body)


class KV:
    """A KV namespace. Values are bytes (str is stored as UTF-8), sent and received
    as they are (not base64). Each call is one round trip to the PoP, except a `get`
    the host may serve in place (README: KV reads in the isolate host); errors (an
    undeclared namespace, a value too large) raise `BindingError` with the PoP's
    message."""

    def __init__(self, namespace: str, call: Any, reader: Any = None) -> None:
        self.namespace = namespace
        self._call = call
        self._reader = reader

    def _do(self, op: str, key: str | bytes, **args: Any) -> Any:
        return self._call(f"kv.{op}", {"namespace": self.namespace, **_key(key), **args}, True)

    def get(self, key: str | bytes) -> bytes | None:
        """A key is text (sent as UTF-8) or bytes (any: a WASM function's raw key,
        which `list` gives as ``key_b64``)."""
        if self._reader is not None:
            got = self._reader.get(self.namespace, key)  # None: only the PoP can answer
            if got is not None:
                return got[0]
        entry = self.get_with_metadata(key)
        return None if entry is None else entry["value"]

    def get_with_metadata(self, key: str | bytes) -> dict[str, Any] | None:
        """{"value", "metadata", "version", "expires_at"} or None."""
        entry = self._do("get", key)
        if entry is not None and isinstance(entry["value"], str):  # in a JSON reply: base64
            entry["value"] = base64.b64decode(entry["value"])
        return entry

    def put(self, key: str | bytes, value: bytes | str, *, ttl: float | None = None,
            metadata: dict[str, Any] | None = None) -> int:
        return self._do("put", key, value=_bytes(value), ttl=ttl, metadata=metadata)

    def delete(self, key: str | bytes) -> bool:
        return self._do("delete", key)

    def increment(self, key: str | bytes, delta: int = 1) -> int:
        return self._do("increment", key, delta=delta)

    def cas(self, key: str | bytes, expected_version: int | None, value: bytes | str, *,
            ttl: float | None = None, metadata: dict[str, Any] | None = None) -> int | None:
        """Write only if the key is at `expected_version` (None: absent), as `put`
        writes (its ttl and metadata replace the key's: none given, none kept)."""
        return self._do("cas", key, expected_version=expected_version,
                        value=_bytes(value), ttl=ttl, metadata=metadata)

    def list(self, prefix: str = "", cursor: str | None = None, limit: int = 100) -> dict:
        """{"keys": [{"key", "metadata", "expires_at"}], "cursor"}: pass "cursor" back
        until it is None (a page past many expired keys may be short, even empty). A
        key that is not UTF-8 comes with "key_b64" too: pass
        ``base64.b64decode(item["key_b64"])`` to get or delete it."""
        return self._call("kv.list", {"namespace": self.namespace, "prefix": prefix,
                                      "cursor": cursor, "limit": limit}, True)


def _key(key: str | bytes) -> dict[str, Any]:
    """A KV call's key argument: bytes as ``key_b64``, anything else as ``key`` (text;
    the PoP names what else it is, as the local reader's fallback does)."""
    if isinstance(key, (bytes, bytearray, memoryview)):
        return {"key_b64": base64.b64encode(bytes(key)).decode()}
    return {"key": key}


class Vectors:
    """A vector index: query by vector, with optional metadata equality filters."""

    def __init__(self, index: str, call: Any) -> None:
        self.index = index
        self._call = call

    def query(self, vector: list[float], k: int = 10,
              filter: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return self._call("vectors.query", {"index": self.index, "vector": list(vector),
                                            "k": k, "filter": filter}, True)

    def upsert(self, items: list[dict[str, Any]]) -> int:
        """items: [{"id", "vector", "metadata"?}]"""
        return self._call("vectors.upsert", {"index": self.index, "items": items}, True)

    def delete(self, ids: list[str]) -> int:
        return self._call("vectors.delete", {"index": self.index, "ids": ids}, True)


class AI:
    """Chat, completion, embeddings and rerank on the PoP's model worker. Each call
    is a round trip to the PoP; errors (an unknown model, bad parameters, the
    binding not declared) raise `BindingError` with the PoP's message."""

    def __init__(self, model: str, call: Any) -> None:
        self.model = model
        self._call = call

    def chat(self, messages: list[dict[str, Any]], *, model: str | None = None,
             stream: bool = False, **params: Any) -> Any:
        """{"text", "finish_reason", "usage"}; with `stream`, an iterator of text
        chunks (its `.result` holds finish_reason and usage at the end, its `.cache`
        the AI cache's outcome).
        params: max_tokens, temperature, top_p, stop, seed, presence_penalty,
        frequency_penalty, logit_bias, response_format (the text is then JSON that
        follows it) and, without `stream`, tools, tool_choice, parallel_tool_calls:
        the result then also has "message" (OpenAI's assistant message, to append
        to `messages`) and "tool_calls" (empty when the model answered in text)."""
        args = {"model": model or self.model, "messages": messages, **params}
        if stream:
            opened = self._call("ai.chat_stream", args, True)
            return ChatStream(opened["stream"], self._call, opened.get("cache"))
        return self._call("ai.chat", args, True)

    def complete(self, prompt: str, *, model: str | None = None, **params: Any) -> dict:
        return self._call("ai.complete", {"model": model or self.model, "prompt": prompt,
                                          **params}, True)

    def embed(self, texts: str | list[str], *, model: str = "all-minilm-l6-v2"
              ) -> list[list[float]]:
        return self._call("ai.embed", {"model": model, "input": texts}, True)["embeddings"]

    def rerank(self, query: str, documents: list[str], *, model: str = "all-minilm-l6-v2",
               top_n: int | None = None) -> list[dict[str, Any]]:
        """[{"index", "relevance_score"}], most relevant first."""
        return self._call("ai.rerank", {"model": model, "query": query,
                                        "documents": documents, "top_n": top_n},
                          True)["results"]


class ChatStream:
    """Text chunks of a streamed chat, as the model produces them (a cache hit: as
    they were stored; `cache` says which, as a plain chat's ``"cache"`` does)."""

    def __init__(self, stream: int, call: Any, cache: dict[str, Any] | None = None) -> None:
        self.stream = stream
        self._call = call
        self.cache = cache
        self.result: dict[str, Any] | None = None

    def __iter__(self) -> Any:
        while self.result is None:
            out = self._call("ai.chat_next", {"stream": self.stream}, True)
            yield from out["chunks"]
            self.result = out["done"]


def _bytes(value: bytes | str) -> bytes:
    """A value as the call sends it (raw, after the call's JSON). Raises TypeError
    naming what was passed (bytes, bytearray, memoryview or str are stored)."""
    if isinstance(value, str):
        return value.encode()
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected bytes or str, got {type(value).__name__}")
    return bytes(value)
