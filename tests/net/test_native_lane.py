"""The native lane (runtime/net/native_src/lane.c, runtime/pipeline/lane.py) against the
Python front: two real PoPs on loopback, one with ``[http] native_lane = "auto"`` and
one with ``"off"``, the same functions deployed on both (real wasmtime), the same
raw bytes sent to both. Answers (but the date and the request id's per-process
prefix), events, metrics and access-log lines must be the same."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.admin.client import AdminClient
from runtime.pipeline.lane import NativeLane
from runtime.pipeline.stages.access_log import AccessLog
from tests.net.lane_support import exchange, guests, normal, static_reactor, to_the_close
from tests.support import Running, function_dir, pop_thread

ROOT = Path(__file__).resolve().parents[2]
PORTS = {"auto": 28010, "off": 28011}


class Side:
    """One PoP of the pair and what the test has read of it so far."""

    def __init__(self, running: Running) -> None:
        self.r = running
        self.log = io.BytesIO()
        for o in running.pop.observers:
            if isinstance(o, AccessLog):
                o.stream = self.log
        self.seen = 0  # events of the ring already compared
        self.logged = 0

    @property
    def prefix(self) -> bytes:
        rid = next(s for s in self.r.pop.pipeline.stages if s.name == "request_id")
        return rid.prefix  # type: ignore[attr-defined, no-any-return]

    def send(self, raw: bytes, methods: list[bytes]) -> list[bytes]:
        return [normal(r, self.prefix) for r in exchange(self.r.port, raw, methods)]

    def new_events(self) -> list[dict[str, Any]]:
        self.r.delivered()
        events = list(self.r.pop.ring.events)[self.seen:]
        self.seen += len(events)
        pfx = self.prefix.decode()
        out = []
        for e in events:
            d = {f: getattr(e, f) for f in e.__struct_fields__ if f not in ("ts", "duration_ms")}
            d["rid"] = d["rid"].replace(pfx + "-", "RID-")
            cache = d["decisions"].get("http_cache")
            if isinstance(cache, dict) and "saved_ms" in cache:  # the origin's timing
                d["decisions"] = {**d["decisions"], "http_cache": {**cache, "saved_ms": 0}}
            out.append(d)
        return out

    def new_log(self) -> list[bytes]:
        self.r.delivered()
        for o in self.r.pop.observers:
            if isinstance(o, AccessLog):
                o.flush()
        lines = self.log.getvalue().splitlines()[self.logged:]
        self.logged += len(lines)
        return [re.sub(rb"^ts=\S+ (.*) dur_ms=\S+ (.*)$", rb"\1 \2", line)
                .replace(self.prefix + b"-", b"RID-") for line in lines]

    def metrics(self) -> list[str]:
        """The scrape's counts a request changes (not its timings)."""
        keep = ("edgefn_requests_total", "edgefn_response_bytes_total",
                "edgefn_request_duration_seconds_count", "edgefn_bot_actions_total",
                "edgefn_cache", "edgefn_front", "edgefn_ratelimit")
        text = AdminClient(self.r.data).metrics()
        return sorted(line for line in text.splitlines()
                      if line.startswith(keep) and not line.startswith("#"))

    def cache_stats(self) -> list[dict[str, Any]]:
        """The caches' counts (`CacheStats`, the admin API's view), but the origin
        time hits saved (a timing)."""
        rows = AdminClient(self.r.data).request("GET", "/v1/cache/stats")["stats"]
        return [{k: v for k, v in row.items() if k != "saved_ms"} for row in rows]

    @property
    def lane(self) -> NativeLane | None:
        lane = self.r.pop.lane
        return lane if isinstance(lane, NativeLane) else None


@contextmanager
def lane_pair(root: Path, ports: dict[str, int], folders: list[Path],
              **overrides: Any) -> Iterator[tuple[Side, Side]]:
    """Two PoPs on `ports`, the lane on (``"auto"``) and off, with the same config
    `overrides`, each with `folders` deployed: (lane's, Python's)."""
    with pop_thread(root / "on", port=ports["auto"], **{"http.native_lane": "auto"},
                    **overrides) as on, \
            pop_thread(root / "off", port=ports["off"], **{"http.native_lane": "off"},
                       **overrides) as off:
        for f in folders:
            on.deploy(f)
            off.deploy(f)
        a, b = Side(on), Side(off)
        assert a.lane is not None and b.lane is None
        yield a, b


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Side, Side]]:
    root = tmp_path_factory.mktemp("lane")
    folders = [ROOT / "functions" / "examples" / "hello-wat",
               ROOT / "functions" / "examples" / "echo", *guests(root / "fns")]
    with lane_pair(root, PORTS, folders) as sides:
        yield sides


def both(pair: tuple[Side, Side], raw: bytes, methods: list[bytes]) -> list[bytes]:
    """`raw` sent to both PoPs: the same answers, events, log lines and counts."""
    on, off = pair
    got, want = on.send(raw, methods), off.send(raw, methods)
    assert got == want, raw
    assert on.new_events() == off.new_events(), raw
    assert on.new_log() == off.new_log(), raw
    return got


def request(method: str, path: str, headers: list[tuple[str, str]], body: bytes = b"",
            version: str = "HTTP/1.1") -> bytes:
    head = f"{method} {path} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
    if body:
        head += f"content-length: {len(body)}\r\n"
    return head.encode("latin-1") + b"\r\n" + body


# -- every kind of request the lane leaves to Python, and those it serves -------------------
UA_CHROME = ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
             "Chrome/120.0.0.0 Safari/537.36")
SERVED = {  # name: (request, the lane serves it)
    "plain": (request("GET", "/hello", [("Host", "x")]), True),
    "head": (request("HEAD", "/hello", [("Host", "x:8080")]), True),
    "query": (request("GET", "/mirror?a=1&b", [("Host", "x"), ("X-Odd", " v ")]), True),
    "long query": (request("GET", "/mirror?" + "q" * 2000, [("Host", "x")]), True),  # bounded
    "curl": (request("GET", "/hello", [("Host", "x"), ("User-Agent", "curl/8.5")]), True),
    "crawler": (request("GET", "/mirror", [("Host", "x"), ("User-Agent", "Googlebot/2.1 "
                                                          "(+http://www.google.com/bot.html)")]),
                True),
    "odd headers": (request("GET", "/odd", [("Host", "x")]), True),
    "empty values": (b"GET /mirror HTTP/1.1\r\nX-Empty:\r\nHost: x\r\nX-B: \r\n"
                     b"X-C:\r\n\r\n", True),
    "204": (request("GET", "/nobody", [("Host", "x")]), True),
    "205": (request("GET", "/reset", [("Host", "x")]), True),
    "418": (request("GET", "/teapot", [("Host", "x")]), True),
    "head of 418": (request("HEAD", "/teapot", [("Host", "x")]), True),
    "post": (request("POST", "/mirror", [("Host", "x"), ("Content-Type", "text/plain")],
                     b"abc"), True),
    "post, no body": (request("POST", "/mirror?a", [("Host", "x")]), True),
    "post, empty body": (b"POST /mirror HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
                         True),
    "post, binary body": (request("POST", "/echo", [("Host", "x")], bytes(range(256)) * 40),
                          True),
    "post, body past the lane's": (request("POST", "/mirror", [("Host", "x")],
                                           b"b" * ((1 << 20) + 1)), False),
    "post, two lengths": (b"POST /mirror HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                          b"Content-Length: 3\r\n\r\nabc", False),
    "post, head 418": (request("POST", "/teapot", [("Host", "x")], b"t"), True),
    "post, trap": (request("POST", "/trap", [("Host", "x")], b"t"), False),
    "get with a body": (request("GET", "/mirror", [("Host", "x")], b"abc"), False),
    "put": (request("PUT", "/mirror", [("Host", "x")], b"abc"), True),
    "patch": (request("PATCH", "/echo", [("Host", "x")], b"{}"), True),
    "delete": (request("DELETE", "/mirror?id=1", [("Host", "x")]), True),
    "delete with a body": (request("DELETE", "/echo", [("Host", "x")], b"why"), True),
    "chunked": (b"POST /mirror HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"3\r\nabc\r\n0\r\n\r\n", False),
    "expect": (request("GET", "/hello", [("Host", "x"), ("Expect", "100-continue")]), False),
    "upgrade": (request("GET", "/hello", [("Host", "x"), ("Upgrade", "websocket"),
                                          ("Connection", "upgrade")]), False),
    "unknown path": (request("GET", "/nope", [("Host", "x")]), False),
    # a literal route is a prefix: what lies under it is its (no other route does)
    "prefix path": (request("GET", "/hello/x", [("Host", "x")]), True),
    "prefix path, deep, query": (request("GET", "/mirror/a/b%s?q=1" % ("/c" * 60),
                                         [("Host", "x")]), True),
    "prefix path, post": (request("POST", "/echo/items/7", [("Host", "x")], b"{}"), True),
    "prefix path, trailing slash": (request("GET", "/hello/", [("Host", "x")]), True),
    "prefix path, encoded": (request("GET", "/mirror/caf%C3%A9", [("Host", "x")]), False),
    "prefix path, dot segment": (request("GET", "/mirror/../hello", [("Host", "x")]), False),
    "no segment boundary": (request("GET", "/hellox", [("Host", "x")]), False),
    "health": (request("GET", "/healthz", [("Host", "x")]), False),
    "ready": (request("GET", "/readyz", [("Host", "x")]), False),
    "request id": (request("GET", "/hello", [("Host", "x"), ("X-Request-Id", "abc")]), True),
    "request id, longest": (request("GET", "/mirror", [("Host", "x"),
                                                       ("X-Request-Id", "a.b_c:d-" * 16)]),
                            True),
    "request id, too long": (request("GET", "/mirror", [("Host", "x"),
                                                        ("X-Request-Id", "a" * 129)]), True),
    "request id, malformed": (request("GET", "/mirror", [("Host", "x"),
                                                         ("X-Request-Id", "a/b")]), True),
    "request id, empty": (b"GET /mirror HTTP/1.1\r\nHost: x\r\nX-Request-Id:\r\n\r\n", True),
    "request id, warm-up's": (request("GET", "/mirror", [("Host", "x"),
                                                         ("X-Request-Id", "warmup")]), True),
    "request ids, two": (request("POST", "/mirror", [("Host", "x"), ("X-Request-Id", "B"),
                                                     ("x-request-id", "a")], b"p"), True),
    "trap": (request("GET", "/trap", [("Host", "x")]), False),
    "bad frame": (request("GET", "/badframe", [("Host", "x")]), False),
    "cacheable": (request("GET", "/cached", [("Host", "x")]), False),
    # the connection's last request: answered with `connection: close`, then closed
    "close": (request("GET", "/hello", [("Host", "x"), ("Connection", "close")]), True),
    "keep-alive": (request("GET", "/mirror", [("Host", "x"), ("Connection", "keep-alive")]),
                   True),
    "keep-alive, any case": (request("POST", "/mirror", [("Host", "x"),
                                                         ("connection", "Keep-Alive")], b"k"),
                             True),
    "keep-alive, close": (request("GET", "/hello", [("Host", "x"),
                                                    ("Connection", "keep-alive, close")]), False),
    "keep-alive, then close": (request("GET", "/hello", [("Host", "x"),
                                                         ("Connection", "keep-alive"),
                                                         ("Connection", "close")]), True),
    "keep-alive, upgrade": (request("GET", "/hello", [("Host", "x"),
                                                      ("Connection", "keep-alive"),
                                                      ("Upgrade", "websocket")]), False),
    "keep-alive header": (request("GET", "/hello", [("Host", "x"), ("Keep-Alive", "timeout=5")]),
                          False),
    # ApacheBench's `ab` (without -k): HTTP/1.0, not kept alive
    "http/1.0": (request("GET", "/hello", [("Host", "x")], version="HTTP/1.0"), True),
    "http/1.0, post": (request("POST", "/echo", [("Host", "x")], b"posted",
                               version="HTTP/1.0"), True),
    "close, post": (request("POST", "/echo", [("Host", "x"), ("Connection", "close")], b"p"),
                    True),
    # ApacheBench's `ab -k`: HTTP/1.0 kept alive, answered with `connection: keep-alive`
    "http/1.0 kept alive": (request("GET", "/mirror?n=1", [("Host", "x"), ("Connection", "Keep-Alive"), ("User-Agent", "ApacheBench/2.3"), ("Accept", "*/*")],
                                    version="HTTP/1.0"), True),
    "http/1.0 kept alive, head": (request("HEAD", "/hello", [("Host", "x"),
                                                            ("Connection", "keep-alive")],
                                          version="HTTP/1.0"), True),
    "http/1.0 kept alive, post": (request("POST", "/echo", [("Host", "x"),
                                                           ("Connection", "keep-alive")],
                                          b"posted", version="HTTP/1.0"), True),
    "http/1.0 kept alive, 204": (request("GET", "/nobody", [("Host", "x"),
                                                           ("Connection", "keep-alive")],
                                         version="HTTP/1.0"), True),
    "http/1.0 kept alive, no host": (b"GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
                                     False),
    "no host": (b"GET /hello HTTP/1.1\r\n\r\n", False),
    "two hosts": (request("GET", "/hello", [("Host", "x"), ("Host", "y")]), False),
    "odd host": (request("GET", "/hello", [("Host", "a@b")]), False),
    # a browser's class by its other headers, decided in C (lane.c `browser_verdict`)
    "browser": (request("GET", "/hello", [("Host", "x"), ("User-Agent", UA_CHROME)]), True),
    "browser, whole": (request("GET", "/mirror", [("Host", "x"), ("User-Agent", UA_CHROME),
                                                  ("Accept", "text/html"),
                                                  ("Accept-Language", "en-GB,en;q=0.9"),
                                                  ("Sec-Fetch-Mode", "navigate"),
                                                  ("Sec-CH-UA", '"Chromium";v="120"')]), True),
    "browser, hints differ": (request("GET", "/mirror", [("Host", "x"),
                                                         ("User-Agent", UA_CHROME),
                                                         ("Accept", "*/*"),
                                                         ("Accept-Language", "en"),
                                                         ("Sec-Fetch-Mode", "cors"),
                                                         ("Sec-CH-UA", '"Chromium";v="99"')]),
                              True),
    "api key": (request("GET", "/mirror", [("Host", "x"), ("Authorization", "Bearer efn_k")]),
                False),
    "api key header": (request("GET", "/mirror", [("Host", "x"), ("x-api-key", "zefn_k")]),
                       False),
    # a function's own credential (no [auth.jwt] here): it proves no one, and the
    # function gets it as sent
    "foreign bearer": (request("GET", "/mirror", [("Host", "x"),
                                                  ("Authorization", "Bearer eyJhbGciOi.x.y")]),
                       True),
    "basic auth": (request("POST", "/mirror", [("Host", "x"),
                                               ("Authorization", "Basic dXNlcjpwdw==")], b"b"),
                   True),
    "foreign api key header": (request("GET", "/mirror", [("Host", "x"),
                                                          ("X-Api-Key", "sk-live-123")]), True),
    "bearer, no token": (request("GET", "/mirror", [("Host", "x"), ("Authorization", "Bearer")]),
                         True),
    # a key wrapped in a Basic credential (`efn_k:` and `u:efn_k`), or after another
    # scheme: `dispatch` takes it out, so the lane hands it over (it reached the function)
    "basic with a key": (request("GET", "/mirror", [("Host", "x"),
                                                    ("Authorization", "Basic ZWZuX2s6")]),
                         False),
    "basic with a key as password": (request("GET", "/mirror", [
        ("Host", "x"), ("Authorization", "basic\tdTplZm5faw==")]), False),
    "token scheme key": (request("GET", "/mirror", [("Host", "x"),
                                                    ("Authorization", "Token efn_k")]), False),
    "basic, not base64": (request("GET", "/mirror", [("Host", "x"),
                                                     ("Authorization", "Basic a%b")]), False),
    "foreign, then a key": (request("GET", "/mirror", [("Host", "x"),
                                                       ("Authorization", "Basic dTpw"),
                                                       ("x-api-key", "efn_x")]), False),
    # the dashboard's session cookie: `dispatch` takes it out, so the lane hands it over
    "dashboard cookie": (request("GET", "/mirror", [("Host", "x"),
                                                    ("Cookie", "a=1; edgefn_dash=s")]), False),
    "cookie": (request("GET", "/mirror", [("Host", "x"), ("Cookie", "a=1; b=2")]), True),
    "tenant": (request("GET", "/hello", [("Host", "x"), ("X-Edgefn-Tenant", "t")]), False),
    "warmup": (request("GET", "/hello", [("Host", "x"), ("X-Edgefn-Warmup", "1")]), False),
    "range": (request("GET", "/hello", [("Host", "x"), ("Range", "bytes=0-1")]), False),
    "no-cache": (request("GET", "/hello", [("Host", "x"), ("Cache-Control", "no-cache")]),
                 False),
    "validator": (request("GET", "/hello", [("Host", "x"), ("If-None-Match", '"a"')]), False),
    "dot segment": (request("GET", "/./hello", [("Host", "x")]), False),
    "encoded": (request("GET", "/%68ello", [("Host", "x")]), False),
    "fragment": (request("GET", "/hello#x", [("Host", "x")]), False),
    "absolute": (request("GET", "http://x/hello", [("Host", "x")]), False),
    "options": (request("OPTIONS", "/hello", [("Host", "x")]), False),
    "unknown method": (request("BREW", "/hello", [("Host", "x")]), False),
    "garbage": (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03\r\n\r\n", False),
    "long url": (request("GET", "/hello?" + "a" * 9000, [("Host", "x")]), False),
    "big head": (request("GET", "/hello", [("Host", "x"), ("X-Big", "b" * 40000)]), False),
}


@pytest.mark.parametrize("name", list(SERVED))
def test_each_kind_alone_and_pipelined(pair: tuple[Side, Side], name: str) -> None:
    """Each kind of request, alone and between two plain ones in one write: the same
    answers everywhere, and served by the lane exactly when it may be."""
    raw, native = SERVED[name]
    on, _ = pair
    assert on.lane is not None
    method = raw.split(b" ", 1)[0]
    before = on.lane.served
    both(pair, raw, [method])
    assert on.lane.served - before == (1 if native else 0), name
    plain = SERVED["plain"][0]
    before = on.lane.served
    both(pair, plain + raw + plain, [b"GET", method, b"GET"])
    assert on.lane.served - before >= 1  # the first one at least


def test_metrics_after_kinds(pair: tuple[Side, Side]) -> None:
    """The counts a scrape shows, and the caches' counts, are the same once every kind
    was sent to both."""
    on, off = pair
    for raw, _ in SERVED.values():
        both(pair, raw, [raw.split(b" ", 1)[0]])
    scraped = on.metrics()
    assert any(line.startswith("edgefn_requests_total{") for line in scraped)
    assert scraped == off.metrics()
    assert on.cache_stats() == off.cache_stats()


def test_a_real_http_client_keeps_the_lane(pair: tuple[Side, Side]) -> None:
    """httpx (the client under the official `openai` package), like Python's requests and
    Node's agents, sends `Connection: keep-alive` with every request, which took it off
    the lane. Its GETs and POST over one kept connection: served in C, the function
    given that header as sent, the answers, events and log lines Python's."""
    import httpx

    on, off = pair
    assert on.lane is not None
    answers: list[list[tuple[int, list[tuple[bytes, bytes]], bytes]]] = []
    on.r.delivered()
    before = on.lane.served
    for side in pair:
        with httpx.Client(base_url=f"http://127.0.0.1:{side.r.port}",
                          headers={"Host": "x"}) as client:  # the same on both
            got = [client.get("/mirror?q=1"), client.post("/mirror", content=b"body"),
                   client.get("/hello")]
        pfx = side.prefix
        answers.append([(r.status_code, [(k, v.replace(pfx + b"-", b"RID-"))
                                         for k, v in r.headers.raw if k != b"date"],
                         r.content) for r in got])
    on.r.delivered()
    # all three: the POST too when its body comes in a read of its own (httpx writes the
    # head and the body apart; 80 of 300 came so here): the front holds the head for it
    assert on.lane.served - before == 3
    assert answers[0] == answers[1]
    assert b"connection\n\x00\x00\x00keep-alive" in answers[0][0][2]  # as the guest got it
    assert on.new_events() == off.new_events()
    assert on.new_log() == off.new_log()


def test_a_post_body_reaches_the_reactor(pair: tuple[Side, Side]) -> None:
    """The echo example answers a POST's body as its body, by the lane as by Python."""
    on, _ = pair
    assert on.lane is not None
    body = bytes(range(256)) * 3
    before = on.lane.served
    got = both(pair, request("POST", "/echo?q=1", [("Host", "x")], body), [b"POST"])[0]
    assert on.lane.served - before == 1
    assert got.endswith(b"\r\n\r\n" + body) and b"x-echo-method: POST\r\n" in got


def test_a_post_bypasses_the_http_cache_as_python_does(pair: tuple[Side, Side],
                                                       tmp_path: Path) -> None:
    """A POST to a function the HTTP cache is on for: BYPASS (its header, its event's
    record with the URL's key, its count), served by the lane while nothing of the
    deployment is stored; once a GET stored an answer, the POST is Python's, which
    drops the URL's entries (the next GET is a MISS again, on both)."""
    on, off = pair
    assert on.lane is not None
    d = function_dir(tmp_path, "postcache", static_reactor(
        200, [(b"Cache-Control", b"max-age=60")], b"kept"))
    on.r.deploy(d)
    off.r.deploy(d)
    post = request("POST", "/postcache?x=1", [("Host", "h")], b"data")
    get = request("GET", "/postcache?x=1", [("Host", "h")])
    steps = [(post, b"POST", 1, b"BYPASS"), (get, b"GET", 0, b"MISS"),
             (get, b"GET", 0, b"HIT"), (post, b"POST", 0, b"BYPASS"),
             (get, b"GET", 0, b"MISS")]
    for raw, method, by_lane, outcome in steps:
        before = on.lane.served
        got = both(pair, raw, [method])
        assert b"x-edgefn-cache: " + outcome in got[0], (method, got)
        assert on.lane.served - before == by_lane, method
    bypassed = [e for e in on.r.pop.ring.events if e.path == "/postcache" and
                e.method == "POST"]
    assert [e.decisions["http_cache"] for e in bypassed] == \
        [{"outcome": "BYPASS", "key": f"{bypassed[0].target} h/postcache?x=1"}] * 2
    assert on.cache_stats() == off.cache_stats()
    assert on.metrics() == off.metrics()


# -- random requests --------------------------------------------------------------------------
PATHS = ["/hello", "/hello/", "/hello/x", "/hello?x=1", "/hello?", "/mirror", "/mirror?a=b&c=",
         "/odd", "/nobody", "/reset", "/teapot", "/cached", "/badframe", "/trap", "/echo",
         "/echo?q", "/nope", "/healthz", "/%68ello", "/./hello", "//hello", "/hello#f", "*",
         "http://x/mirror"]
HEADERS = [("User-Agent", "curl/8.0"), ("User-Agent", UA_CHROME), ("User-Agent", ""),
           ("User-Agent", "Googlebot/2.1 (+http://www.google.com/bot.html)"),
           ("User-Agent", "python-requests/2.31"), ("X-Request-Id", "abc"),
           ("X-Request-Id", "bad id!"), ("Connection", "close"), ("Connection", "keep-alive"),
           ("Expect", "100-continue"), ("Range", "bytes=0-1"), ("Cache-Control", "no-cache"),
           ("If-None-Match", '"x"'), ("Authorization", "Bearer efn_x"),
           ("X-Edgefn-Tenant", "t"), ("Accept", "*/*"), ("X-Odd", "  spaced  "),
           ("X-Empty", ""), ("Upgrade", "h2c"), ("Signature-Input", "sig1=()"),
           ("Accept-Language", "en"), ("Sec-Fetch-Mode", "navigate"), ("TE", "trailers"),
           ("x-edgefn-warmup", "1"), ("Cookie", "a=b; c=d"), ("X-A", "\t tab")]
TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCXYZ0123456789-_.!#$%&'*+^`|~",
                min_size=1, max_size=12)
VALUE = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=255,
                                       blacklist_characters="\x7f"), max_size=20)
one_request = st.tuples(
    st.sampled_from(["GET"] * 6 + ["HEAD"] * 2 + ["POST", "PUT", "OPTIONS", "DELETE"]),
    st.sampled_from(PATHS),
    st.sampled_from(["HTTP/1.1"] * 5 + ["HTTP/1.0"]),
    st.sampled_from(["x", "x:80", "X.Example", "a b", "", None, "x.y:123456"]),
    st.lists(st.one_of(st.sampled_from(HEADERS), st.tuples(TOKEN, VALUE)), max_size=4),
    st.one_of(st.just(b""), st.binary(min_size=1, max_size=64)),
)


def build(req: tuple[str, str, str, str | None, list[tuple[str, str]], bytes]) -> bytes:
    method, path, version, host, headers, body = req
    hs = ([("Host", host)] if host is not None else []) + headers
    return request(method, path, hs, body, version)


@settings(max_examples=60, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batch=st.lists(one_request, min_size=1, max_size=4))
def test_random_batches_answered_alike(pair: tuple[Side, Side],
                                       batch: list[tuple[str, str, str, str | None,
                                                         list[tuple[str, str]], bytes]]) -> None:
    """Random pipelined batches (odd headers, bodies, hosts, versions, paths): the
    same bytes back, the same events and log lines."""
    raw = b"".join(build(r) for r in batch)
    both(pair, raw, [r[0].encode() for r in batch])


@pytest.mark.parametrize("name", ["close", "http/1.0", "close, post"])
def test_a_last_request_closes_its_connection(pair: tuple[Side, Side], name: str) -> None:
    """A request not kept alive, with another behind it in the same write: its answer
    alone (the lane's), then the close, on both PoPs."""
    raw = SERVED[name][0]
    on, _ = pair
    assert on.lane is not None
    for side in pair:
        data = to_the_close(side.r.port, raw + SERVED["plain"][0])
        assert data.count(b"HTTP/1.1 ") == 1 and b"\r\nconnection: close\r\n" in data, data
