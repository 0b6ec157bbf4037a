"""`cors`: Cross-Origin Resource Sharing for browsers calling the PoP (settings
in its `CorsStage`). On the configured path prefixes (``/v1/`` by default):

- a preflight (``OPTIONS`` with ``access-control-request-method``) from an
  allowed origin, for an allowed method, is answered here: 204 with the
  ``access-control-allow-*`` headers and ``access-control-max-age``; a refused
  one gets a 403 with no CORS headers (the browser then blocks the call);
- any other request from an allowed origin goes on, and its response (a stream
  too: headers go before the body) gets ``access-control-allow-origin``;
- a request from an origin not allowed gets no CORS headers at all.

``*`` in the allowed origins answers ``access-control-allow-origin: *`` (and
``vary: origin`` otherwise, for caches); ``*`` in methods or headers allows
whatever the preflight asks.
"""

from __future__ import annotations

from runtime.config import CorsStage
from runtime.net.message import Headers, Request, Response
from runtime.pipeline.stage import Context, Next, Result, then

REQUEST_METHOD = b"access-control-request-method"
REQUEST_HEADERS = b"access-control-request-headers"


class Cors:
    name = "cors"

    def __init__(self, config: CorsStage) -> None:
        self.any_origin = "*" in config.allowed_origins
        self.origins = frozenset(o.encode() for o in config.allowed_origins)
        self.any_method = "*" in config.allowed_methods
        self.methods = frozenset(m.upper().encode() for m in config.allowed_methods)
        self.any_header = "*" in config.allowed_headers
        self.headers = b", ".join(h.lower().encode() for h in config.allowed_headers)
        self.credentials = config.allow_credentials
        self.max_age = str(config.max_age).encode()
        self.paths = tuple(p.encode() for p in config.paths)

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        origin = request.header(b"origin")
        if origin is None or not request.path.startswith(self.paths):
            return call_next(request, ctx)
        allowed = self.any_origin or origin in self.origins
        asked = request.header(REQUEST_METHOD)
        if request.method == b"OPTIONS" and asked is not None:
            return self._preflight(request, origin, asked) if allowed else _refused()
        if not allowed:
            return call_next(request, ctx)
        return then(call_next(request, ctx), self._tag, origin)

    def _preflight(self, request: Request, origin: bytes, method: bytes) -> Response:
        if not (self.any_method or method.upper() in self.methods):
            return _refused()
        headers = self._origin(origin)
        headers.append((b"access-control-allow-methods",
                        method.upper() if self.any_method else b", ".join(sorted(self.methods))))
        wanted = request.header(REQUEST_HEADERS)
        allow = wanted if self.any_header else self.headers
        if allow:
            headers.append((b"access-control-allow-headers", allow))
        headers.append((b"access-control-max-age", self.max_age))
        return Response(204, headers)

    def _origin(self, origin: bytes) -> Headers:
        """The headers that allow `origin`."""
        if self.any_origin and not self.credentials:
            return [(b"access-control-allow-origin", b"*")]
        headers = [(b"access-control-allow-origin", origin), (b"vary", b"origin")]
        if self.credentials:
            headers.append((b"access-control-allow-credentials", b"true"))
        return headers

    def _tag(self, response: Response, origin: bytes) -> Response:
        response.headers.extend(self._origin(origin))
        return response


def _refused() -> Response:
    return Response(403, [(b"content-type", b"text/plain")],
                    b"CORS preflight refused: origin or method not allowed\n")
