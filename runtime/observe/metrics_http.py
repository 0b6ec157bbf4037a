"""``GET /metrics``: the Prometheus exposition of one PoP's `CollectorRegistry`,
served on the admin listener and, with ``[metrics] listen``, on a listener of its
own. With a token (``[metrics] token`` / ``token_file``) a scrape must send
``Authorization: Bearer <token>`` (401 otherwise); the admin token works too.
The format follows the scraper's ``Accept`` (Prometheus text or OpenMetrics).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from runtime.net.message import Request, Response, fetched, json_response, loopback

PATH = b"/metrics"


class MetricsEndpoint:
    def __init__(self, registry: CollectorRegistry, tokens: list[str],
                 refresh: Callable[[], Awaitable[None]] | None = None,
                 source: Callable[[], Awaitable[CollectorRegistry]] | None = None) -> None:
        """`tokens`: the bearer tokens a scrape may send; empty: no token needed.
        `refresh()` runs before each scrape (the model worker's figures);
        `source()`, when given, is what a scrape encodes instead of `registry`
        (``workers = N``: every worker's, merged)."""
        self.registry = registry
        self.tokens = [f"Bearer {t}".encode() for t in tokens]
        self.refresh = refresh
        self.source = source

    def allowed(self, request: Request) -> bool:
        if not self.tokens:
            return True
        sent = request.header(b"authorization") or b""
        return any(hmac.compare_digest(sent, t) for t in self.tokens)

    def rebound(self, request: Request) -> bool:
        """Whether a tokenless scrape from this machine names the host by a name other
        than ``localhost``: a web page whose name was rebound to 127.0.0.1 (DNS
        rebinding) read the series from the browser (Host ``evil.example:PORT``).
        A scraper on this machine names it by address or as localhost; a token
        lifts the check (the page cannot send it)."""
        return not self.tokens and loopback(request.client) and \
            not _named_locally(request.host)

    def __call__(self, request: Request) -> Response | Awaitable[Response]:
        if request.path != PATH:
            return _error(404, "not_found", "this listener serves GET /metrics only")
        if request.method not in (b"GET", b"HEAD"):
            return _error(405, "method_not_allowed", "use GET /metrics")
        if fetched(request):  # a function's subrequest: every tenant's series are not its own
            return _error(403, "forbidden", "metrics are not served to a function's fetch")
        if self.rebound(request):
            return _error(403, "forbidden", "a scrape from this machine names the host by "
                          "address or as localhost (Host "
                          f"{request.host.decode('latin-1')[:100]!r}; a page rebound to "
                          "127.0.0.1 could read it), or sends the [metrics] token")
        if not self.allowed(request):
            return _error(401, "unauthorized", "missing or wrong metrics token: send "
                          "`Authorization: Bearer <[metrics] token>`",
                          [(b"www-authenticate", b'Bearer realm="metrics"')])
        return self._scrape(request)

    async def _scrape(self, request: Request) -> Response:
        if self.refresh is not None:
            await self.refresh()
        accept = (request.header(b"accept") or b"").decode("latin-1")
        encoder, content_type = choose_encoder(accept)
        registry = self.registry if self.source is None else await self.source()
        body = encoder(registry)  # on the admin (or metrics) thread, not the PoP's loop
        # a HEAD's body is dropped by the front, which still says its length
        return Response(200, [(b"content-type", content_type.encode())], body)


def _error(status: int, kind: str, message: str,
           headers: list[tuple[bytes, bytes]] | None = None) -> Response:
    return json_response({"error": {"kind": kind, "message": message}}, status, headers)


def _named_locally(host: bytes) -> bool:
    """Whether a Host header names this machine as an IP address or ``localhost``
    (any port; none sent, as HTTP/1.0 may, too)."""
    if host.startswith(b"["):
        name = host[1:host.find(b"]")]
    else:
        name = host.rsplit(b":", 1)[0] if host.count(b":") == 1 else host
    if not name or name.lower() == b"localhost":
        return True
    try:
        ipaddress.ip_address(name.decode("latin-1"))
    except ValueError:
        return False
    return True
