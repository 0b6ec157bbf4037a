"""What the bot manager's tests share: requests built by hand, a signing agent,
a stage over a real router, a key directory served over loopback HTTP."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgefn_core.errors import EdgefnError, FunctionError
from runtime.functions.manifest import Route
from runtime.functions.router import Router
from runtime.net.message import Request, Response
from runtime.pipeline.stage import Context
from runtime.pipeline.stages.bots import Bots
from runtime.pipeline.targets import Targets
from runtime.security.bots import agents, webbotauth
from runtime.security.bots.classify import Classifier
from runtime.security.bots.manager import BotManager
from runtime.security.settings import BotOverride, BotSettings, TargetPolicy

HOST = b"edge.test:8080"
CHROME = ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
          "Chrome/124.0.0.0 Safari/537.36")
# what Chrome 124 sends with a navigation
BROWSER_HEADERS = {
    "accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
    "accept-language": "en-US,en;q=0.9",
    "sec-fetch-mode": "navigate", "sec-fetch-site": "none", "sec-fetch-dest": "document",
}
WELL_KNOWN = "/.well-known/http-message-signatures-directory"


def request(path: str = "/fn", headers: dict[str, str] | None = None,
            client: str = "198.51.100.7:40000", host: bytes = HOST) -> Request:
    lines = [(k.lower().encode(), v.encode("latin-1")) for k, v in (headers or {}).items()]
    return Request(b"GET", path.encode(), b"", lines, host, "1.1", True, client)


def signed(key: Ed25519PrivateKey, path: str = "/fn", agent: str | None = None,
           extra: dict[str, str] | None = None, client: str = "198.51.100.7:40000",
           **kw: Any) -> Request:
    """A request to `path` on HOST signed by `key` (Web Bot Auth)."""
    url = f"http://{HOST.decode()}{path}"
    headers = {"user-agent": "ExampleAgent/1.0", **webbotauth.sign(key, "GET", url,
                                                                  signature_agent=agent, **kw)}
    return request(path, {**headers, **(extra or {})}, client)


def directory(*entries: tuple[Ed25519PrivateKey, str | None]) -> webbotauth.KeyDirectory:
    d = webbotauth.KeyDirectory()
    for key, identity in entries:
        d.add({"keys": [webbotauth.public_jwk(key)]}, identity, "<test>")
    return d


class FnTarget:
    """A function target as the registry makes one, with a `[bots]` table."""

    kind = "function"
    tenant = None

    def __init__(self, name: str, bots: BotOverride | None = None) -> None:
        self.name = self.label = name
        self.policy = TargetPolicy(bots=bots)

    def error_response(self, err: EdgefnError) -> Response:
        return Response(err.status, [], str(err).encode())

    def crashed(self, exc: Exception) -> EdgefnError:
        return FunctionError("crash", 502, repr(exc))


def stage(settings: BotSettings | None = None,
          keys: webbotauth.KeyDirectory | None = None, counters: Any = None,
          **routes: BotOverride | None) -> Bots:
    """A bots stage over a real router: one function per keyword (its route is
    /<name>), each with that `[bots]` override; /fn when none is given. `counters`:
    where it counts (default: its own)."""
    settings = settings or BotSettings()
    verifier = webbotauth.Verifier(keys, settings.signature_max_age) if keys else None
    manager = BotManager(settings, Classifier(agents.load()), verifier, counters=counters)
    routes = routes or {"fn": None}
    router = Router([(Route(f"/{n}"), n, FnTarget(n, o)) for n, o in routes.items()])
    return Bots(manager, Targets(SimpleNamespace(router=router, canaries={})))  # type: ignore[arg-type]


def ok(request: Request, ctx: Context) -> Response:
    return Response(200, [], b"passed")


def run(bots: Bots, req: Request) -> tuple[Response, Context]:
    ctx = Context(req.client)
    return bots(req, ctx, ok), ctx  # type: ignore[return-value]


@contextmanager
def served_directory(jwks: dict[str, Any]) -> Iterator[str]:
    """An HTTP server on loopback answering WELL_KNOWN with `jwks`; yields its origin."""
    body = json.dumps(jwks).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            found = self.path == WELL_KNOWN
            self.send_response(200 if found else 404)
            self.send_header("content-type", "application/http-message-signatures-directory+json")
            self.end_headers()
            self.wfile.write(body if found else b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
