"""Request and Response as the HTTP front hands them to an application.

An application is ``app(request) -> Response | Awaitable[Response]``. Returning
a Response directly is the fast path (no task is created); a Response whose
``body`` is an async iterator of bytes is streamed with chunked encoding.
"""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator
from typing import Any

import msgspec

Headers = list[tuple[bytes, bytes]]
LOOP_ID = "edgefn"  # the cdn-id a PoP's fetch binding adds to a subrequest's CDN-Loop


class Request:
    __slots__ = ("body", "client", "headers", "host", "http_version", "keep_alive", "method",
                 "path", "query")

    def __init__(self, method: bytes, path: bytes, query: bytes, headers: Headers, host: bytes,
                 http_version: str, keep_alive: bool, client: str) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers  # names lower-cased, in arrival order
        self.host = host
        self.http_version = http_version
        self.keep_alive = keep_alive
        self.client = client
        self.body = b""

    def header(self, name: bytes) -> bytes | None:
        """The first value of header `name` (lower-case), or None."""
        for k, v in self.headers:
            if k == name:
                return v
        return None


class Response:
    """`close`: the PoP's own say (never a function's: hop-by-hop headers are
    dropped) that the connection ends after this response, so the client's next
    request opens a new one, which a load balancer or link may send elsewhere."""

    __slots__ = ("body", "close", "headers", "status")

    def __init__(self, status: int = 200, headers: Headers | None = None,
                 body: bytes | AsyncIterator[bytes] = b"", close: bool = False) -> None:
        self.status = status
        self.headers = headers if headers is not None else []
        self.body = body
        self.close = close


def cdn_loop(headers: Headers) -> str | None:
    """A request's CDN-Loop, every line of it joined (RFC 9110 5.3: a list field may
    come in several; only the first was read, and the others dropped on the way)."""
    values = [v for k, v in headers if k == b"cdn-loop"]
    return b", ".join(values).decode("latin-1") if values else None


def hops(cdn_loop: str | None) -> int:
    """How many edgefn subrequests a request whose CDN-Loop is `cdn_loop` came
    through (entries ``edgefn``, parameters aside)."""
    if not cdn_loop:
        return 0
    return sum(1 for entry in cdn_loop.split(",")
               if entry.partition(";")[0].strip().lower() == LOOP_ID)


def fetched(request: Request) -> bool:
    """Whether `request` came from a function's fetch: its ``CDN-Loop`` holds an
    ``edgefn`` entry, which the fetch binding adds and no function can leave out
    (`runtime.bindings.fetch`). The PoP's own loopback listeners (the admin API,
    the dashboard, a metrics listener) refuse such a request: they trust loopback,
    and a function whose fetch pattern named 127.0.0.1 read every tenant's metrics
    through the admin port."""
    return hops(cdn_loop(request.headers)) > 0


def loopback(client: str) -> bool:
    """Whether `client` (``address:port``, as `Request.client`) is on this machine."""
    host = client.rsplit(":", 1)[0].strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def json_response(data: Any, status: int = 200, headers: Headers | None = None) -> Response:
    body = msgspec.json.encode(data) + b"\n"
    return Response(status, [(b"content-type", b"application/json"), *(headers or [])], body)


def text_response(text: str, status: int = 200) -> Response:
    return Response(status, [(b"content-type", b"text/plain; charset=utf-8")], text.encode())
