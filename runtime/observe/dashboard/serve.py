"""The dashboard's HTTP side on the admin listener: the page and its files
(``GET /dashboard``, ``/dashboard/app.js``, ``/dashboard/style.css``) and the live
stream (``GET /dashboard/stream``, and ``/v1/dashboard/stream`` as before: SSE,
``event: snapshot`` once a second and ``event: events`` with the requests since the
last one). All of them need a session cookie, which ``GET /dashboard?token=T`` sets
for a one-time login token; without one they answer 401. The cookie's path is
``/dashboard``: browsers send a host's cookies to all its ports, so with ``Path=/``
a function on the public listener of the same host got the operator's session."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from http.cookies import CookieError, SimpleCookie
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl

import msgspec

from edgefn_core.errors import EdgefnError
from runtime.net.message import Request, Response, json_response
from runtime.observe.dashboard.aggregator import Rolling
from runtime.observe.dashboard.login import Logins
from runtime.observe.ring import Query, Ring

COOKIE = "edgefn_dash"
PERIOD = 1.0  # seconds between snapshots
EVENTS = 50  # events sent per snapshot at most (the newest)
FILES = {"": ("index.html", b"text/html; charset=utf-8"),
         "/app.js": ("app.js", b"text/javascript; charset=utf-8"),
         "/style.css": ("style.css", b"text/css; charset=utf-8")}
HEADERS = [(b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff"),
           (b"content-security-policy", b"default-src 'self'; img-src 'self' data:")]
_encode = msgspec.json.Encoder().encode
Snapshot = Callable[[], Awaitable[dict[str, Any]]]


STREAMS = (b"/dashboard/stream", b"/v1/dashboard/stream")  # the second: before the cookie's path


def is_dashboard(path: bytes) -> bool:
    return path == b"/dashboard" or path.startswith(b"/dashboard/") or path == STREAMS[1]


def session(request: Request) -> str | None:
    raw = (request.header(b"cookie") or b"").decode("latin-1")
    try:
        morsel = SimpleCookie(raw).get(COOKIE)
    except CookieError:
        return None
    return morsel.value if morsel is not None else None


def page(request: Request, logins: Logins) -> Response:
    """A dashboard file, or 401. ``?token=`` logs in (sets the cookie) first."""
    name = request.path.removeprefix(b"/dashboard").decode("latin-1")
    if name not in FILES or request.method != b"GET":
        return _error(404, "not_found", f"no dashboard file {request.path.decode('latin-1')}")
    extra: list[tuple[bytes, bytes]] = []
    token = dict(parse_qsl(request.query.decode("latin-1"))).get("token")
    if token is not None:
        try:
            sid = logins.redeem(token)
        except EdgefnError as e:
            return _error(e.status, e.code, str(e))
        extra.append((b"set-cookie", f"{COOKIE}={sid}; Path=/dashboard; HttpOnly; SameSite=Strict; "
                      f"Max-Age={int(logins.session_ttl)}".encode()))
    elif not logins.valid(session(request)):
        return _unauthorized()
    file, kind = FILES[name]
    body = resources.files(__package__).joinpath("static", file).read_bytes()
    return Response(200, [(b"content-type", kind), *HEADERS, *extra], body)


def allowed(request: Request, logins: Logins) -> Response | None:
    """None if the request carries a live session, else the 401 to send."""
    return None if logins.valid(session(request)) else _unauthorized()


async def follow(ring: Ring, snapshot: Snapshot, period: float = PERIOD,
                 queue: int = 1000) -> AsyncIterator[bytes]:
    """SSE: a snapshot now and every `period` seconds, each after the events that
    arrived since the last (the newest `EVENTS`), until the reader goes away."""
    sub = ring.subscribe(Query(), queue)
    try:
        yield b": dashboard\n\n" + _event(b"events", ring.query(Query(limit=EVENTS)))
        while True:
            started = time.monotonic()
            if sub.buffer or sub.dropped:
                events, _ = await sub.get(0)
                if events:
                    yield _event(b"events", events[-EVENTS:])
            yield _event(b"snapshot", await snapshot())
            await asyncio.sleep(max(0.0, period - (time.monotonic() - started)))
    finally:
        ring.unsubscribe(sub)


class Figures:
    """A snapshot's figures: the aggregator's, the caches', the versions deployed,
    and the model worker's (asked every `worker_every` seconds: asking resets its
    tokens/s window). Call on the PoP's loop."""

    def __init__(self, rolling: Rolling, cache: Callable[[], list[dict[str, Any]]],
                 versions: Callable[[], list[dict[str, object]]],
                 worker: Callable[[], Awaitable[dict[str, Any]]] | None,
                 worker_every: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.rolling, self.cache, self.versions = rolling, cache, versions
        self.worker, self.worker_every, self.clock = worker, worker_every, clock
        self.worker_figures: dict[str, Any] | None = None
        self.asked = -float("inf")

    async def __call__(self) -> dict[str, Any]:
        if self.worker is not None and self.clock() - self.asked >= self.worker_every:
            self.asked = self.clock()
            try:
                self.worker_figures = await asyncio.wait_for(self.worker(), 1.0)
            except (EdgefnError, TimeoutError) as e:
                self.worker_figures = {"error": str(e) or "timed out"}
        return {**self.rolling.snapshot(), "cache_stats": self.cache(),
                "versions": self.versions(), "worker": self.worker_figures}


def _event(kind: bytes, data: object) -> bytes:
    return b"event: " + kind + b"\ndata: " + _encode(data) + b"\n\n"


def _unauthorized() -> Response:
    return _error(401, "unauthorized", "no dashboard session: open the URL that "
                  "`edgefn dashboard` prints (its login token works once, for 60 s)")


def _error(status: int, kind: str, message: str) -> Response:
    return json_response({"error": {"kind": kind, "message": message}}, status)
