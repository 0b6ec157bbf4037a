"""The fetch binding: a function's only way out, to the URLs its manifest allows,
from Python and WASM, against a real HTTP server on loopback."""

from __future__ import annotations

import base64
import http.client
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from runtime.admin.client import AdminError
from runtime.bindings import fetch as fetch_binding
from runtime.bindings.fetch import MAX_RESPONSE, FetchBinding, _pattern_host
from tests.support import Running, function_dir, python_function, reactor


class Upstream(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/slow":
            time.sleep(2)
        if self.path == "/big":
            body = b"x" * (MAX_RESPONSE + 1)
        elif self.path == "/cookies":  # Expires has a comma: never joined with ", "
            self.send_response(200)
            self.send_header("set-cookie", "a=1; Expires=Wed, 21 Oct 2026 07:28:00 GMT")
            self.send_header("set-cookie", "b=2")
            self.send_header("content-length", "0")
            self.end_headers()
            return
        elif self.path == "/redirect":
            self.send_response(302)
            self.send_header("location", "http://example.com/")
            self.send_header("content-length", "0")
            self.end_headers()
            return
        else:
            body = json.dumps({"path": self.path, "ua": self.headers.get("user-agent"),
                               "x": self.headers.get("x-test"),
                               "tp": self.headers.get("traceparent"),
                               "loop": self.headers.get("cdn-loop")}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        data = self.rfile.read(int(self.headers["content-length"]))
        self.send_response(201)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[::-1])

    def log_message(self, *args: object) -> None:
        pass


class Server(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client (the PoP) that hung up on /slow or /big: expected


@pytest.fixture
def upstream() -> Iterator[str]:
    server = Server(("127.0.0.1", 0), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


FETCHER = """
import json
from edgefn import BindingError, Response

def handle(request, env):
    try:
        r = env.fetch(request.query["url"], method=request.method,
                      headers={"x-test": "from-py"}, body=request.body or None,
                      timeout=float(request.query.get("t", "5")))
    except BindingError as e:
        return Response(str(e), status=403)
    return Response(r.body, status=r.status, headers={
        "x-upstream": r.headers.get("content-type", ""),
        "x-cookies": json.dumps(r.headers.get_all("set-cookie"))})
"""


def deploy_fetcher(pop: Running, tmp_path: Path, patterns: list[str]) -> None:
    d = python_function(tmp_path, "fetcher", FETCHER, limits="wall_ms = 1000")
    with open(d / "edgefn.toml", "a") as f:
        f.write(f"[bindings]\nfetch = {json.dumps(patterns)}\n")
    pop.deploy(d)


def test_a_python_function_fetches_an_allowed_url(pop: Running, tmp_path: Path,
                                                  upstream: str) -> None:
    deploy_fetcher(pop, tmp_path, [f"{upstream}/*"])
    status, headers, body = pop.get(f"/fetcher?url={upstream}/data?q=1")
    assert status == 200, body
    assert json.loads(body) == {"path": "/data?q=1", "ua": "edgefn-fetch", "x": "from-py",
                                "tp": None, "loop": "edgefn"}
    assert headers["x-upstream"] == "application/json"
    status, _, body = pop.request("POST", f"/fetcher?url={upstream}/echo", b"abc")
    assert (status, body) == (201, b"cba")
    _, headers, _ = pop.get(f"/fetcher?url={upstream}/cookies")
    assert json.loads(headers["x-cookies"]) == ["a=1; Expires=Wed, 21 Oct 2026 07:28:00 GMT",
                                                "b=2"]  # each, not one joined by ", "
    # a redirect comes back as it is, not followed
    assert pop.get(f"/fetcher?url={upstream}/redirect")[0] == 302


@pytest.mark.parametrize(("patterns", "path", "words"), [
    ([], "/x", "is not allowed for function 'fetcher' (allowed: none"),
    (["http://127.0.0.1:1/*"], "/x", "is not allowed for function 'fetcher' (allowed: "
                                     "http://127.0.0.1:1/*)"),
    # a wildcard host does not reach loopback: only a pattern naming it does
    (["http://*"], "/x", "resolves to 127.0.0.1, a loopback or private address"),
])
def test_fetch_is_denied_outside_the_allowlist_and_to_private_addresses(
        pop: Running, tmp_path: Path, upstream: str, patterns: list[str], path: str,
        words: str) -> None:
    deploy_fetcher(pop, tmp_path, patterns)
    status, _, body = pop.get(f"/fetcher?url={upstream}{path}")
    assert status == 403 and words in body.decode(), body


def test_localhost_under_a_wildcard_is_refused_too(pop: Running, tmp_path: Path,
                                                   upstream: str) -> None:
    deploy_fetcher(pop, tmp_path, ["http://*"])
    url = upstream.replace("127.0.0.1", "localhost")
    status, _, body = pop.get(f"/fetcher?url={url}/x")
    assert status == 403 and b"'localhost' resolves to" in body, body


def test_fetch_times_out_and_caps_the_response(pop: Running, tmp_path: Path,
                                               upstream: str) -> None:
    deploy_fetcher(pop, tmp_path, [f"{upstream}/*"])
    began = time.monotonic()
    status, _, body = pop.get(f"/fetcher?url={upstream}/slow&t=0.3")
    assert status == 403 and b"timed out after 300 ms" in body, body
    assert time.monotonic() - began < 1.5  # the upstream takes 2 s
    status, _, body = pop.get(f"/fetcher?url={upstream}/big")
    assert status == 403 and f"response larger than {MAX_RESPONSE} bytes".encode() in body


def test_a_wasm_function_fetches_through_the_call_host_function(
        pop: Running, tmp_path: Path, upstream: str) -> None:
    args = json.dumps({"url": f"{upstream}/from-wasm"}).replace('"', '\\"')
    n = len(json.dumps({"url": f"{upstream}/from-wasm"}))
    src = reactor(f"""
      (local $len i64)
      (local.set $len (call $call (i32.const 300) (i32.const 5) (i32.const 400) (i32.const {n})
                                  (i32.const 4108) (i32.const 4096)))
      (i32.store (i32.const 4096) (i32.const 200))
      (i32.store (i32.const 4100) (i32.const 0))
      (i32.store (i32.const 4104) (i32.wrap_i64 (local.get $len)))
      (return (i64.or (i64.shl (i64.const 4096) (i64.const 32))
                      (i64.add (i64.const 12) (local.get $len))))""",
                  imports='(import "edgefn" "call" (func $call (param i32 i32 i32 i32 i32 i32) '
                          '(result i64)))',
                  prelude=f'(data (i32.const 300) "fetch") (data (i32.const 400) "{args}")')
    pop.deploy(function_dir(tmp_path, "wasm-fetch", src,
                            extra=f'[bindings]\nfetch = ["{upstream}/*"]'))
    status, _, body = pop.get("/wasm-fetch")
    assert status == 200, body
    out = json.loads(body)
    assert out["status"] == 200
    assert json.loads(base64.b64decode(out["body"]))["path"] == "/from-wasm"
    # the request's trace context goes along (tracing off: the client's, as it came)
    status, _, body = pop.get("/wasm-fetch", headers={"traceparent": TRACEPARENT})
    assert json.loads(base64.b64decode(json.loads(body)["body"]))["tp"] == TRACEPARENT


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(("sent", "seen"), [
    (TRACEPARENT, TRACEPARENT),
    ("00-not-a-trace", None),  # not well-formed: not passed on
    (None, None)])
def test_a_fetch_carries_the_requests_traceparent(pop: Running, tmp_path: Path, upstream: str,
                                                   sent: str | None, seen: str | None) -> None:
    deploy_fetcher(pop, tmp_path, [f"{upstream}/*"])
    headers = {"traceparent": sent} if sent else {}
    status, _, body = pop.get(f"/fetcher?url={upstream}/t", headers=headers)
    assert status == 200, body
    assert json.loads(body)["tp"] == seen


def test_a_traceparent_the_function_sets_itself_is_kept(pop: Running, tmp_path: Path,
                                                         upstream: str) -> None:
    own = "00-11111111111111111111111111111111-2222222222222222-01"
    d = python_function(tmp_path, "own-trace", FETCHER.replace(
        '{"x-test": "from-py"}', f'{{"traceparent": "{own}"}}'), limits="wall_ms = 1000")
    with open(d / "edgefn.toml", "a") as f:
        f.write(f'[bindings]\nfetch = ["{upstream}/*"]\n')
    pop.deploy(d)
    status, _, body = pop.get(f"/own-trace?url={upstream}/t",
                              headers={"traceparent": TRACEPARENT})
    assert status == 200, body
    assert json.loads(body)["tp"] == own


def test_patterns_must_be_http_urls(pop: Running, tmp_path: Path) -> None:
    d = python_function(tmp_path, "bad-fetch", FETCHER)
    with open(d / "edgefn.toml", "a") as f:
        f.write('[bindings]\nfetch = ["ftp://files.example.com/*"]\n')
    with pytest.raises(AdminError, match=r"bindings\.fetch"):
        pop.deploy(d)


def test_allowed_matches_the_whole_url_and_knows_literal_hosts() -> None:
    f = FetchBinding("f", ["https://api.example.com/v1/*", "http://10.0.0.*/*"], 1000)
    assert f.allowed("https://api.example.com/v1/x")[1] is True
    assert f.allowed("http://10.0.0.7/x")[1] is False  # a wildcard host: no private addresses
    for url in ("https://api.example.com/v2/x", "http://api.example.com/v1/x",
                "https://api.example.com.evil.test/v1/x"):
        with pytest.raises(Exception, match="is not allowed"):
            f.allowed(url)
    # a host wildcard matches within the host: `*` once took `/`, `?` and `#` too
    w = FetchBinding("f", ["https://*.example.com/*"], 1000)
    assert w.allowed("https://a.example.com/x?q=1")[0].host == "a.example.com"
    assert w.allowed("https://A.Example.COM")[0].host == "a.example.com"  # path "/"
    for url in ("https://evil.net/x.example.com/", "https://evil.net?.example.com/",
                "https://evil.net#.example.com/", "https://evil.net:443/.example.com/",
                "http://a.example.com/x"):
        with pytest.raises(Exception, match="is not allowed"):
            w.allowed(url)
    assert FetchBinding("f", ["https://api.example.com"], 1).allowed(
        "https://api.example.com/a/b?c")[0].path == "/a/b?c"  # no path: every path
    assert _pattern_host("http://[::1]:8080/*") == "::1"
    assert _pattern_host("https://Example.com:443/a") == "example.com"


@pytest.mark.parametrize(("ip", "public"), [
    ("8.8.8.8", True), ("2606:4700::1", True), ("::ffff:8.8.8.8", True),
    ("64:ff9b::808:808", True),  # NAT64 of a public IPv4
    # a deny list of address kinds let these through: shared address space (a cloud's
    # metadata service at 100.100.100.200), NAT64 of loopback, site-local
    ("100.64.0.1", False), ("100.100.100.200", False), ("::ffff:100.64.0.1", False),
    ("64:ff9b::7f00:1", False), ("64:ff9b:1::a00:1", False), ("fec0::1", False),
    ("2002:7f00:1::", False), ("2001::1", False),  # 6to4 of loopback, Teredo
    # IPv4-compatible and IPv4-translated forms, NAT64's local-use prefix (helper 72)
    ("::7f00:1", False), ("::a9fe:a9fe", False), ("::ffff:0:a9fe:a9fe", False),
    ("64:ff9b:1:a9fe:0:a900:808:808", False), ("::", False),
    ("127.0.0.1", False), ("10.1.2.3", False), ("169.254.169.254", False), ("::1", False),
    ("fe80::1%eth0", False), ("224.0.0.1", False), ("0.0.0.0", False), ("198.18.0.1", False),
])
def test_only_global_unicast_addresses_count_as_public(ip: str, public: bool) -> None:
    assert fetch_binding._public(ip) is public


def test_a_fetch_adds_edgefn_to_the_requests_cdn_loop_and_the_functions_own_is_not_sent(
        pop: Running, tmp_path: Path, upstream: str) -> None:
    d = python_function(tmp_path, "looped", FETCHER.replace(
        '{"x-test": "from-py"}', '{"cdn-loop": "forged"}'), limits="wall_ms = 1000")
    with open(d / "edgefn.toml", "a") as f:
        f.write(f'[bindings]\nfetch = ["{upstream}/*"]\n')
    pop.deploy(d)
    status, _, body = pop.get(f"/looped?url={upstream}/t",
                              headers={"cdn-loop": "cdn.example; v=1, edgefn"})
    assert status == 200, body
    assert json.loads(body)["loop"] == "cdn.example; v=1, edgefn, edgefn"
    # a list field in several lines: each one counts and goes on (only the first did)
    conn = http.client.HTTPConnection(pop.host, pop.port, timeout=10)
    conn.putrequest("GET", f"/looped?url={upstream}/t")
    conn.putheader("cdn-loop", "a")
    conn.putheader("cdn-loop", ", ".join(["edgefn"] * 8))
    conn.endheaders()
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    assert resp.status == 403 and b"came through 8 edgefn subrequests" in body, body
    status, _, body = pop.get(f"/looped?url={upstream}/t",
                              headers={"cdn-loop": ", ".join(["edgefn"] * 8)})
    assert status == 403 and b"refused, a loop: the calling request already came through 8 " \
        b"edgefn subrequests" in body, body


def test_a_wasm_fetch_carries_the_cdn_loop_whatever_the_guest_puts_in_its_arguments(
        pop: Running, tmp_path: Path, upstream: str) -> None:
    call = {"url": f"{upstream}/w", fetch_binding.LOOP_ARG: ""}  # a guest resetting the count
    args = json.dumps(call).replace('"', '\\"')
    src = reactor(f"""
      (local $len i64)
      (local.set $len (call $call (i32.const 300) (i32.const 5) (i32.const 400)
                                  (i32.const {len(json.dumps(call))}) (i32.const 4108)
                                  (i32.const 4096)))
      (i32.store (i32.const 4096) (i32.const 200))
      (i32.store (i32.const 4100) (i32.const 0))
      (i32.store (i32.const 4104) (i32.wrap_i64 (local.get $len)))
      (return (i64.or (i64.shl (i64.const 4096) (i64.const 32))
                      (i64.add (i64.const 12) (local.get $len))))""",
                  imports='(import "edgefn" "call" (func $call (param i32 i32 i32 i32 i32 i32) '
                          '(result i64)))',
                  prelude=f'(data (i32.const 300) "fetch") (data (i32.const 400) "{args}")')
    pop.deploy(function_dir(tmp_path, "wasm-loop", src,
                            extra=f'[bindings]\nfetch = ["{upstream}/*"]'))
    status, _, body = pop.get("/wasm-loop", headers={"cdn-loop": "edgefn"})
    assert status == 200, body
    assert json.loads(base64.b64decode(json.loads(body)["body"]))["loop"] == "edgefn, edgefn"
    status, _, body = pop.get("/wasm-loop", headers={"cdn-loop": ", ".join(["edgefn"] * 8)})
    assert status == 500 and b"refused, a loop" in body, body


SELF = """
from edgefn import BindingError, Response

def handle(request, env):
    try:
        r = env.fetch(URL, timeout=20)
    except BindingError as e:
        return Response(str(e), status=508)
    return Response(r.body, status=r.status)
"""


def test_a_function_fetching_its_own_url_stops_after_max_hops(pop: Running,
                                                            tmp_path: Path) -> None:
    """It looped for minutes, each level waiting on the next, long after the first
    client had gone (every later request to it slowed to seconds)."""
    url = f"http://{pop.host}:{pop.port}/self"
    d = python_function(tmp_path, "self", SELF.replace("URL", repr(url)), limits="wall_ms = 30000",
                        pool="min = 1\nmax = 10\nstandby = false")
    with open(d / "edgefn.toml", "a") as f:
        f.write(f'[bindings]\nfetch = ["{url}*"]\n')
    pop.deploy(d)
    status, _, body = pop.get("/self", timeout=60)
    assert (status, body.split(b":")[0]) == (508, b"fetch"), body
    assert b"already came through 8 edgefn subrequests" in body
    pop.delivered()
    events = pop.admin.request("GET", "/v1/events?path=/self&limit=100")["events"]
    assert len(events) == fetch_binding.MAX_HOPS + 1  # the client's and 8 fetches
    time.sleep(0.5)
    pop.delivered()
    assert len(pop.admin.request("GET", "/v1/events?path=/self&limit=100")["events"]) == 9
