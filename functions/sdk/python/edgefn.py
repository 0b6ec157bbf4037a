"""The guest SDK for Python functions: a small fetch-style Request and Response.

    from edgefn import Response

    def handle(request, env):
        name = request.query.get("name", "world")
        return Response.json({"hello": name})

A handler may be ``async def``. A Response body may be bytes, str, or a
(sync or async) generator of bytes/str, which is streamed to the client.
Only the standard library is available inside isolates (see README).
"""

from __future__ import annotations

import json as _json
import struct
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any
from urllib.parse import parse_qsl

__all__ = ["Env", "Headers", "Request", "Response"]

_U32 = struct.Struct("<I")


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

    def __iter__(self) -> Iterator[str]:
        return iter(k for k, _ in self._items)

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"


class Request:
    """An incoming request: method, url, path, query (dict), headers, body."""

    def __init__(self, method: str, path: str, query_string: str, headers: Headers,
                 body: bytes) -> None:
        self.method = method
        self.path = path
        self.query_string = query_string
        self.query = dict(parse_qsl(query_string, keep_blank_values=True))
        self.headers = headers
        self.body = body
        host = headers.get("host", "localhost")
        self.url = f"http://{host}{path}" + (f"?{query_string}" if query_string else "")

    def text(self) -> str:
        return self.body.decode("utf-8")

    def json(self) -> Any:
        """Raises ValueError if the body is not JSON."""
        return _json.loads(self.body)

    @classmethod
    def _decode(cls, buf: bytes) -> tuple[Request, dict[str, str]]:
        """Parse the PoP's encoding (the reactor ABI's request format)."""
        pos = 4  # magic
        fields = []
        for _ in range(3):
            (n,) = _U32.unpack_from(buf, pos)
            fields.append(buf[pos + 4:pos + 4 + n].decode("latin-1"))
            pos += 4 + n
        pairs: list[list[tuple[str, str]]] = []
        for _ in range(2):
            (count,) = _U32.unpack_from(buf, pos)
            pos += 4
            items = []
            for _ in range(count):
                (n,) = _U32.unpack_from(buf, pos)
                k = buf[pos + 4:pos + 4 + n].decode("latin-1")
                pos += 4 + n
                (n,) = _U32.unpack_from(buf, pos)
                v = buf[pos + 4:pos + 4 + n].decode("utf-8", "replace")
                pos += 4 + n
                items.append((k, v))
            pairs.append(items)
        (n,) = _U32.unpack_from(buf, pos)
        body = buf[pos + 4:pos + 4 + n]
        method, path, query = fields
        return cls(method, path, query, Headers(pairs[0]), body), dict(pairs[1])


Body = bytes | str | Iterable[bytes | str] | AsyncIterator[bytes | str]


class Response:
    """An outgoing response. `body` may be bytes, str or a (async) generator."""

    def __init__(self, body: Body = b"", status: int = 200,
                 headers: dict[str, str] | Iterable[tuple[str, str]] | None = None) -> None:
        self.body = body
        self.status = status
        items = headers.items() if isinstance(headers, dict) else (headers or [])
        self.headers = Headers(items)
        if isinstance(body, str) and "content-type" not in self.headers:
            self.headers["content-type"] = "text/plain; charset=utf-8"

    @classmethod
    def json(cls, data: Any, status: int = 200,
             headers: dict[str, str] | None = None) -> Response:
        r = cls(_json.dumps(data).encode(), status, headers)
        r.headers["content-type"] = "application/json"
        return r

    @property
    def streaming(self) -> bool:
        return not isinstance(self.body, (bytes, bytearray, str))


class Env:
    """What a handler gets besides the request: the manifest's env vars as `vars`
    and `log()`. Bindings (KV, vectors, AI) attach here in later versions."""

    def __init__(self, vars: dict[str, str], call: Any) -> None:
        self.vars = vars
        self._call = call

    def log(self, *parts: object) -> None:
        """Write a line to the PoP's log, tagged with the function's name."""
        self._call("log", {"message": " ".join(str(p) for p in parts)})

    def deployment(self) -> dict[str, str]:
        """This function's name and the version serving this request (asks the PoP)."""
        result: dict[str, str] = self._call("deployment", {}, True)
        return result
