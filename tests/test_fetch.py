"""The fetch binding: a function's only way out, to the URLs its manifest allows,
from Python and WASM, against a real HTTP server on loopback."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from edgefn_core.errors import BindingError
from runtime.admin.client import AdminError
from runtime.bindings import fetch as fetch_binding
from runtime.bindings.fetch import (
    MAX_REQUEST,
    MAX_RESPONSE,
    MAX_RESPONSE_FIELDS,
    MAX_RESPONSE_HEAD,
    FetchBinding,
    Target,
    _pattern_host,
)
from runtime.config import FetchConfig, InvalidConfig, private_host
from runtime.config import load as load_config
from tests.support import Running, function_dir, pop_thread, python_function, reactor

TREE = re.compile(r"; tree=[0-9a-f]{16}")
EXPLICITLY = "list that host in the pattern explicitly to allow it"  # (not a private one)


def treeless(value: str) -> str:
    """`value` with each edgefn entry's tree id written ``T`` (one is drawn per request)."""
    return TREE.sub("; tree=T", value)


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
    got = json.loads(body)
    assert {**got, "loop": treeless(got["loop"])} == {
        "path": "/data?q=1", "ua": "edgefn-fetch", "x": "from-py", "tp": None,
        "loop": "edgefn; tree=T"}
    assert headers["x-upstream"] == "application/json"
    status, _, body = pop.request("POST", f"/fetcher?url={upstream}/echo", b"abc")
    assert (status, body) == (201, b"cba")
    _, headers, _ = pop.get(f"/fetcher?url={upstream}/cookies")
    assert json.loads(headers["x-cookies"]) == ["a=1; Expires=Wed, 21 Oct 2026 07:28:00 GMT",
                                                "b=2"]  # each, not one joined by ", "
    # a redirect comes back as it is, not followed
    assert pop.get(f"/fetcher?url={upstream}/redirect")[0] == 302


def test_a_fetch_resolves_its_host_on_its_tenants_own_threads(pop: Running, tmp_path: Path,
                                                            upstream: str) -> None:
    """A resolver one tenant points its hosts at, however slow, holds only that
    tenant's binding threads, not the loop's resolver every tenant shares."""
    deploy_fetcher(pop, tmp_path, [f"{upstream}/*".replace("127.0.0.1", "localhost")])
    tenant = "fetcher"  # no `owner` in its manifest: its own name
    assert tenant not in pop.pop.stores.threads.owners()
    url = f"{upstream}/data".replace("127.0.0.1", "localhost")
    status, _, body = pop.get(f"/fetcher?url={url}")
    assert status == 200, body
    assert tenant in pop.pop.stores.threads.owners()


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


def test_the_pops_own_admin_listener_does_not_answer_a_functions_fetch(
        pop: Running, tmp_path: Path) -> None:
    """It trusts loopback: a tenant whose fetch pattern named 127.0.0.1 read every
    tenant's metrics through it (the dashboard and the API are refused alike)."""
    deploy_fetcher(pop, tmp_path, ["http://127.0.0.1:*/*"])
    admin = f"http://{pop.admin.info.admin}"
    for path in ("/metrics", "/v1/functions", "/dashboard"):
        status, _, body = pop.get(f"/fetcher?url={admin}{path}")
        assert (status, b"does not answer a function's fetch" in body) == (403, True), body
    direct = http.client.HTTPConnection(*pop.admin.info.admin.split(":"), timeout=10)
    direct.request("GET", "/metrics")  # a scraper on loopback still is answered
    assert direct.getresponse().status == 200
    direct.close()


def test_localhost_under_a_wildcard_is_refused_too(pop: Running, tmp_path: Path,
                                                   upstream: str) -> None:
    deploy_fetcher(pop, tmp_path, ["http://*"])
    url = upstream.replace("127.0.0.1", "localhost")
    status, _, body = pop.get(f"/fetcher?url={url}/x")
    assert status == 403 and b"'localhost' resolves to" in body, body


@pytest.mark.parametrize(("private_hosts", "reached"), [
    ([], set()),
    (["localhost"], {"localhost"}),
    (["127.0.0.*:{port}"], {"127.0.0.1"}),
    (["127.0.0.1:1", "LOCAL*:1"], set()),  # another port
    (["*"], {"localhost", "127.0.0.1"}),  # the default
])
def test_the_pops_private_hosts_bound_what_a_literal_pattern_reaches(
        tmp_path: Path, upstream: str, private_hosts: list[str], reached: set[str]) -> None:
    """A pattern naming 127.0.0.1 reached every loopback service of the box (Redis,
    another PoP, a tool's port): ``[fetch] private_hosts`` is the operator's say."""
    port = upstream.rsplit(":", 1)[1]
    hosts = [h.replace("{port}", port) for h in private_hosts]
    with pop_thread(tmp_path / "data", **{"fetch.private_hosts": hosts}) as pop:
        deploy_fetcher(pop, tmp_path, [f"http://127.0.0.1:{port}/*",
                                       f"http://localhost:{port}/*"])
        for host in ("127.0.0.1", "localhost"):
            status, _, body = pop.get(f"/fetcher?url=http://{host}:{port}/data")
            if host in reached:
                assert status == 200, body
            else:
                assert status == 403, body
                assert b"a loopback or private address: this PoP's [fetch] private_hosts " \
                    b"does not let functions reach it" in body, body


def test_private_hosts_entries_are_read_and_bad_ones_refused() -> None:
    assert private_host("LocalHost") == ("localhost", None)
    assert private_host("db.internal:5432") == ("db.internal", 5432)
    assert private_host("[::1]:8080") == ("::1", 8080)
    assert private_host("[fd00::*]") == ("fd00::*", None)
    assert private_host("fd00::1") == ("fd00::1", None)  # bare IPv6: no port
    assert FetchConfig().hosts() == (("*", None),)
    for bad in ("a:", "a:0", "a:65536", "a:http", "[::1", "[::1]8080", "[::1]:", "a b",
                "user@host", "host/path", ":80"):
        with pytest.raises(ValueError, match="private_hosts"):
            private_host(bad)
    with pytest.raises(InvalidConfig, match="private_hosts"):
        load_config(None, **{"fetch.private_hosts": ["a:0"]})
    assert fetch_binding.private_ok((("127.0.0.*", 80),), "127.0.0.9", 80)
    assert not fetch_binding.private_ok((("127.0.0.*", 80),), "127.0.0.9", 81)
    assert not fetch_binding.private_ok((), "127.0.0.1", 80)


def test_fetch_times_out_and_caps_the_response(pop: Running, tmp_path: Path,
                                               upstream: str) -> None:
    deploy_fetcher(pop, tmp_path, [f"{upstream}/*"])
    began = time.monotonic()
    status, _, body = pop.get(f"/fetcher?url={upstream}/slow&t=0.3")
    assert status == 403 and b"timed out after 300 ms" in body, body
    assert time.monotonic() - began < 1.5  # the upstream takes 2 s
    status, _, body = pop.get(f"/fetcher?url={upstream}/big")
    assert status == 403 and f"response larger than {MAX_RESPONSE} bytes".encode() in body


def wasm_fetcher(call: dict[str, object]) -> str:
    """A reactor that calls ``fetch`` with `call` as its arguments and answers 200 with
    the call's JSON result as its body."""
    args = json.dumps(call).replace('"', '\\"')
    return reactor(f"""
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


def test_a_wasm_function_fetches_through_the_call_host_function(
        pop: Running, tmp_path: Path, upstream: str) -> None:
    src = wasm_fetcher({"url": f"{upstream}/from-wasm"})
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
    assert f.allowed("https://api.example.com/v1/x")[1] == ""
    # a wildcard host: no private addresses
    assert f.allowed("http://10.0.0.7/x")[1] == EXPLICITLY
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
    # an IPv6 literal is no character class: `[::1]` matched no URL, its own included
    six = FetchBinding("f", ["http://[::1]:8080/*"], 1000)
    assert six.allowed("http://[::1]:8080/x") == (Target("http", "::1", 8080, "/x"), "")
    for url in ("http://[::2]:8080/x", "http://:8080/x", "http://1:8080/x"):
        with pytest.raises(Exception, match=r"is not allowed|host"):
            six.allowed(url)


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
    ("2606:4700::1%eth0", True), ("2606:4700::1%e%x", True),  # a zone is not the address
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
    assert treeless(json.loads(body)["loop"]) == "cdn.example; v=1, edgefn, edgefn; tree=T"
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
    # a guest resetting the count in its arguments
    src = wasm_fetcher({"url": f"{upstream}/w", fetch_binding.LOOP_ARG: ""})
    pop.deploy(function_dir(tmp_path, "wasm-loop", src,
                            extra=f'[bindings]\nfetch = ["{upstream}/*"]'))
    status, _, body = pop.get("/wasm-loop", headers={"cdn-loop": "edgefn"})
    assert status == 200, body
    assert treeless(json.loads(base64.b64decode(json.loads(body)["body"]))["loop"]) == \
        "edgefn, edgefn; tree=T"
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


FAN_OUT = """
from edgefn import BindingError, Response

def handle(request, env):
    said = []
    for _ in range(3):
        try:
            said.append(env.fetch(URL, timeout=20).status)
        except BindingError as e:
            said.append(str(e))
    return Response(repr(said))
"""


def test_a_tree_of_subrequests_ends_at_max_subrequests(pop: Running, tmp_path: Path) -> None:
    """A function fetching itself 3 times a level: depth alone (8) allowed 3 + 9 + ..
    + 6561 subrequests for one client request (~7,300 in 8 s were seen)."""
    url = f"http://{pop.host}:{pop.port}/fan"
    d = python_function(tmp_path, "fan", FAN_OUT.replace("URL", repr(url)),
                        limits="wall_ms = 60000", pool="min = 1\nmax = 12\nstandby = false")
    with open(d / "edgefn.toml", "a") as f:
        f.write(f'[bindings]\nfetch = ["{url}*"]\n')
    pop.deploy(d)
    trees = pop.pop.stores.subrequests.trees
    for n in (1, 2):  # each client request a tree of its own
        status, _, body = pop.get("/fan", timeout=120)
        # its first fetch's subtree spent the budget, depth first
        assert status == 200 and body.startswith(b"[200, 'fetch: refused: this request and the "
                                                 b"subrequests it caused made 200 fetches"), body
        pop.delivered()
        events = pop.admin.request("GET", "/v1/events?path=/fan&limit=10000")["events"]
        assert len(events) == n * (fetch_binding.MAX_SUBREQUESTS + 1)  # the client's, its tree's
        assert [v[1] for v in trees.values()] == [fetch_binding.MAX_SUBREQUESTS] * n


def test_a_requests_fetches_share_its_tree_and_its_subrequests_keep_it() -> None:
    top = fetch_binding.Lineage(None)
    assert top.tree == top.tree and TREE.fullmatch(f"; tree={top.tree}")
    assert top.onward() == f"edgefn; tree={top.tree}"
    assert fetch_binding.Lineage(None).tree != top.tree  # another client request
    below = fetch_binding.Lineage(f"cdn.example, {top.onward()}")
    assert below.tree == top.tree
    assert below.onward() == f"cdn.example, edgefn; tree={top.tree}, edgefn; tree={top.tree}"
    # the last edgefn entry names it; a malformed id (a client's) names none
    assert fetch_binding.Lineage("edgefn; tree=0123456789abcdef, Edgefn ;v=1; Tree=fedcba9876543210"
                                 ).tree == "fedcba9876543210"
    for forged in ("edgefn; tree=xyz", "edgefn; tree=0123456789ABCDEF", "cdn; tree=0123456789abcdef",
                   "edgefn; tree=0123456789abcdef, edgefn"):
        assert fetch_binding.Lineage(forged).tree != "0123456789abcdef", forged


def test_subrequests_count_each_tree_and_forget_old_ones() -> None:
    now = [0.0]
    counted = fetch_binding.Subrequests(limit=3, seconds=10, most=2, clock=lambda: now[0])
    for _ in range(3):
        counted.take("a")
    with pytest.raises(BindingError, match=r"^fetch: refused: this request and the subrequests "
                                           r"it caused made 3 fetches already"):
        counted.take("a")
    counted.take("b")  # another tree, its own count
    now[0] = 9.9
    with pytest.raises(BindingError):
        counted.take("a")
    counted.take("c")  # past `most` trees: the oldest ("a") is forgotten
    assert list(counted.trees) == ["b", "c"]
    now[0] = 20.0  # past `seconds`: "b" and "c" forgotten, "b" counts from 1 again
    counted.take("b")
    assert counted.trees == {"b": [20.0, 1]}


def test_the_tree_is_the_last_edgefn_entrys_whatever_follows_or_how_params_are_spaced() -> None:
    tree = "0123456789abcdef"
    named = fetch_binding._named_tree
    assert named(f"edgefn; tree={tree}, fastly") == tree  # another CDN's entry after it
    assert named(f"edgefn;a=1;tree={tree}") == tree  # parameters without spaces
    assert named(f"fastly, edgefn; tree={tree}, edgefn; tree=zz") is None  # the last names none
    assert named(None) is None and named("") is None
    assert named(f"edgefn; a={tree}") is None  # a tree's digits under another name


def test_timeout_ms_is_checked_at_its_bounds() -> None:
    binding = FetchBinding("f", [], 1000)

    async def asked(timeout_ms: float) -> str:
        try:
            await binding.call({"url": "http://127.0.0.1:1/", "timeout_ms": timeout_ms})
        except (BindingError, ValueError) as e:
            return f"{type(e).__name__}: {e}"
        return "fetched"

    for ok in (1, 1.0, 1e12 - 1):  # checked, then refused for the URL (no pattern)
        assert asyncio.run(asked(ok)).startswith("BindingError: fetch: 'http://127.0.0.1:1/' "
                                                 "is not allowed"), ok
    for bad in (0.99, 1e12, 1e12 + 0.5):
        assert asyncio.run(asked(bad)).startswith("ValueError: timeout_ms must be"), bad


def test_a_tree_is_forgotten_exactly_seconds_after_its_first_fetch_oldest_first() -> None:
    now = [0.0]
    counted = fetch_binding.Subrequests(limit=3, seconds=10, most=4, clock=lambda: now[0])
    counted.take("old")
    now[0] = 5.0
    counted.take("new")
    now[0] = 10.0  # "old" is 10 s old: forgotten; "new" (5 s) kept
    counted.take("third")
    assert list(counted.trees) == ["new", "third"]
    now[0] = 15.0
    counted.take("third")
    assert counted.trees == {"third": [10.0, 2]}


async def _spend(binding: FetchBinding, lineage: fetch_binding.Lineage) -> str:
    try:
        await binding.call({"url": "http://127.0.0.1:1/"}, None, lineage)
    except BindingError as e:
        return str(e)
    return "fetched"


def test_a_tree_s_fetches_are_counted_across_functions_and_refused_before_connecting() -> None:
    shared = fetch_binding.Subrequests(limit=2)
    one = FetchBinding("one", ["http://127.0.0.1:1/*"], 1000, shared)
    two = FetchBinding("two", ["http://127.0.0.1:1/*"], 1000, shared)
    lineage = fetch_binding.Lineage(None)
    said = [asyncio.run(_spend(b, lineage)) for b in (one, two, one)]
    assert [s.split(":")[1].strip().split(" ")[0] for s in said] == ["'http", "'http", "refused"]
    assert "failed" in said[0] and "made 2 fetches already" in said[2], said
    # a denied URL is not counted
    assert "not allowed" in asyncio.run(_spend(FetchBinding("x", [], 1000, shared),
                                                fetch_binding.Lineage(None)))
    assert len(shared.trees) == 1


# -- the subrequest on the wire, against a fake connection (no network) -----------------------
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi"


class Wire:
    """Stands in for `asyncio.open_connection`: records where fetch connected and what
    it sent, and answers `answer` (then closes, unless `close` is false)."""

    def __init__(self, answer: bytes = OK, close: bool = True) -> None:
        self.answer, self.close = answer, close
        self.sent = bytearray()
        self.to: tuple[Any, ...] = ()

    async def __call__(self, host: str, port: int, *, ssl: Any = None,
                       server_hostname: str | None = None) -> tuple[Any, Any]:
        self.to = (host, port, ssl is not None, server_hostname)
        reader = asyncio.StreamReader()
        reader.feed_data(self.answer)
        if self.close:
            reader.feed_eof()
        return reader, SimpleNamespace(write=self.sent.extend, close=lambda: None)


def fetched(monkeypatch: pytest.MonkeyPatch, wire: Wire, url: str, patterns: list[str],
            traceparent: str | None = None, **args: Any) -> dict[str, Any]:
    monkeypatch.setattr(fetch_binding.asyncio, "open_connection", wire)
    binding = FetchBinding("f", patterns, 1000)
    return asyncio.run(binding.call({"url": url, **args}, traceparent))


@pytest.mark.parametrize(("url", "to", "host"), [
    ("https://localhost/a?b=1", ("localhost", 443, True, "localhost"), "localhost"),
    ("https://localhost:8443", ("localhost", 8443, True, "localhost"), "localhost:8443"),
    ("http://localhost", ("localhost", 80, False, None), "localhost"),
    ("http://localhost:443/", ("localhost", 443, False, None), "localhost:443"),
    ("http://[2606:4700::1]/", ("2606:4700::1", 80, False, None), "[2606:4700::1]"),
    ("https://[2606:4700::1]:8443/", ("2606:4700::1", 8443, True, "2606:4700::1"),
     "[2606:4700::1]:8443"),
])
def test_a_subrequest_goes_to_the_checked_address_with_tls_for_https_and_its_host(
        monkeypatch: pytest.MonkeyPatch, url: str, to: tuple[Any, ...], host: str) -> None:
    """TLS (verified against the URL's host, not the address) for https only; the
    connection to the address that was resolved and checked; Host as RFC 9112 wants it,
    the port only where it is not the scheme's."""
    wire = Wire()
    result = fetched(monkeypatch, wire, url, ["http://localhost", "https://localhost:*",
                                              "https://localhost", "http://localhost:*",
                                              "http://*", "https://*"])
    address, *rest = wire.to
    assert (address in ("127.0.0.1", "::1") if to[0] == "localhost" else address == to[0])
    assert tuple(rest) == to[1:]
    path = url.split(host, 1)[1].replace("]", "") or "/"
    assert treeless(bytes(wire.sent).decode()) == (
        f"GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n"
        f"user-agent: edgefn-fetch\r\ncontent-length: 0\r\ncdn-loop: edgefn; tree=T\r\n\r\n")
    assert result["status"] == 200 and base64.b64decode(result["body"]) == b"hi"


def test_a_subrequest_sends_the_functions_headers_once_and_its_body(
        monkeypatch: pytest.MonkeyPatch) -> None:
    wire = Wire()
    fetched(monkeypatch, wire, "http://localhost/x", ["http://localhost/*"],
            traceparent=TRACEPARENT, method="post", body=base64.b64encode(b"abc").decode(),
            headers={"X-Tag": "X", "TraceParent": "00-own"})
    assert treeless(bytes(wire.sent).decode()) == (
        "POST /x HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n"
        "user-agent: edgefn-fetch\r\ncontent-length: 3\r\n"
        "x-tag: X\r\ntraceparent: 00-own\r\ncdn-loop: edgefn; tree=T\r\n\r\nabc")


def test_the_response_s_headers_are_lowercased_and_joined_and_its_body_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    answer = (b"HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nSet-Cookie: a=1\r\n"
              b"Set-Cookie: b=2\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"2\r\nab\r\n2\r\ncd\r\n0\r\n\r\n")
    result = fetched(monkeypatch, Wire(answer), "http://localhost/", ["http://localhost"])
    assert result == {"status": 201,
                      "headers": {"content-type": "text/plain", "set-cookie": "a=1, b=2",
                                  "transfer-encoding": "chunked"},
                      "header_list": [["content-type", "text/plain"], ["set-cookie", "a=1"],
                                      ["set-cookie", "b=2"], ["transfer-encoding", "chunked"]],
                      "body": base64.b64encode(b"abcd").decode()}


def test_a_response_ends_at_its_length_or_at_the_close(monkeypatch: pytest.MonkeyPatch) -> None:
    """A complete response is answered though the server keeps the connection; a HEAD's
    has no body whatever its content-length; a body without a length ends at the close."""
    patterns = ["http://localhost"]
    kept = fetched(monkeypatch, Wire(OK, close=False), "http://localhost/", patterns)
    assert base64.b64decode(kept["body"]) == b"hi"
    head = fetched(monkeypatch, Wire(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
                                     close=False), "http://localhost/", patterns, method="HEAD")
    assert (head["status"], head["body"]) == (200, "")
    until_close = fetched(monkeypatch, Wire(b"HTTP/1.1 200 OK\r\n\r\nabc"), "http://localhost/",
                          patterns)
    assert base64.b64decode(until_close["body"]) == b"abc"
    most = fetched(monkeypatch, Wire(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n"
                                     % MAX_RESPONSE + b"x" * MAX_RESPONSE),
                   "http://localhost/", patterns)
    assert len(base64.b64decode(most["body"])) == MAX_RESPONSE  # at most, not less


@pytest.mark.parametrize(("answer", "words"), [
    (b"", "fetch: the server closed the connection before answering"),
    (b"garbage\r\n\r\n", "fetch: malformed response: "),
])
def test_a_server_that_does_not_answer_http_is_named(monkeypatch: pytest.MonkeyPatch,
                                                     answer: bytes, words: str) -> None:
    with pytest.raises(BindingError) as e:
        fetched(monkeypatch, Wire(answer), "http://localhost/", ["http://localhost"])
    assert str(e.value).startswith(words)


@pytest.mark.parametrize(("args", "error", "words"), [
    ({"method": "TRACE"}, BindingError,
     "fetch: method 'TRACE' is not one of DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"),
    ({"headers": {"x-a": "1\r\nevil: 1"}}, BindingError, "fetch: invalid header 'x-a'"),
    ({"headers": {"": "v"}}, BindingError, "fetch: invalid header ''"),
    # sent as given, a lenient server or proxy read a spoofed Host or a smuggled framing
    ({"headers": {"Host ": "evil.com"}}, BindingError, "fetch: invalid header 'host '"),
    ({"headers": {"transfer-encoding\t": "chunked"}}, BindingError,
     "fetch: invalid header 'transfer-encoding\\t'"),
    ({"headers": {"x-a": "1\x0b2"}}, BindingError, "fetch: invalid header 'x-a'"),
    ({"url": "http://localhost/a b HTTP/1.0\x0bX"}, BindingError,
     "fetch: bad URL 'http://localhost/a b HTTP/1.0\\x0bX': a space or control character"),
    ({"url": "http://localhost/a\x00"}, BindingError, "fetch: bad URL 'http://localhost/a\\x00'"),
    ({"body": base64.b64encode(b"x" * (MAX_REQUEST + 1)).decode()}, BindingError,
     f"fetch: request body larger than {MAX_REQUEST} bytes"),
    ({"timeout_ms": -1}, ValueError, "timeout_ms must be a number of milliseconds, at least 1, got -1"),
    ({"url": "http://user@localhost/"}, BindingError,
     "fetch: bad URL 'http://user@localhost/': credentials in URLs are not allowed"),
    ({"url": "http:///x"}, BindingError,
     "fetch: bad URL 'http:///x': expected http:// or https:// and a host"),
    ({"url": "http://localhost:x/"}, BindingError, "fetch: bad URL 'http://localhost:x/': Port"),
])
def test_a_bad_fetch_is_refused_before_it_connects(monkeypatch: pytest.MonkeyPatch,
                                                   args: dict[str, Any], error: type,
                                                   words: str) -> None:
    wire = Wire()
    with pytest.raises(error) as e:
        fetched(monkeypatch, wire, **{"url": "http://localhost/", **args},
                patterns=["http://*"])
    assert str(e.value).startswith(words) and not wire.to
    sent = fetched(monkeypatch, wire, "http://localhost/", ["http://localhost"],
                   body=base64.b64encode(b"x" * MAX_REQUEST).decode())  # at most: sent
    assert sent["status"] == 200 and bytes(wire.sent).endswith(b"x" * MAX_REQUEST)


def test_a_connection_that_fails_is_named() -> None:
    binding = FetchBinding("f", ["http://127.0.0.1:1"], 1000)
    with pytest.raises(BindingError, match=r"^fetch: 'http://127.0.0.1:1/' failed: \S"):
        asyncio.run(binding.call({"url": "http://127.0.0.1:1/"}))


def test_hops_counts_edgefn_entries_whatever_their_parameters() -> None:
    assert [fetch_binding.hops(v) for v in (None, "", "cdn.example", "Edgefn; v=2",
                                            "cdn.example; v=1, edgefn ,edgefn;x=y")] == [
        0, 0, 0, 1, 2]


def test_patterns_are_named_when_none_allows_and_hosts_are_read_whole() -> None:
    f = FetchBinding("f", ["https://a.example/*", "https://b.example/*",
                           "https://c.example/go?to=https://*"], 1000)
    with pytest.raises(BindingError, match=re.escape(
            "(allowed: https://a.example/*, https://b.example/*, https://c.example/go?to=")):
        f.allowed("https://d.example/")
    # a URL in the query is not the URL's scheme or host
    assert f.allowed("https://c.example/go?to=https://x.test/") == (
        Target("https", "c.example", 443, "/go?to=https://x.test/"), "")
    assert f.allowed("https://a.example/r?next=https://x.test") == (
        Target("https", "a.example", 443, "/r?next=https://x.test"), "")
    assert FetchBinding("f", ["https://*.example.com/*"], 1).allowed(
        "https://X.Example.com") == (Target("https", "x.example.com", 443, "/"), EXPLICITLY)
    assert FetchBinding("f", ["http://*"], 1).allowed("http://Api.Example.com:8080") == (
        Target("http", "api.example.com", 8080, "/"), EXPLICITLY)
    assert _pattern_host("http://10.0.0.5/go?to=http://x") == "10.0.0.5"
    assert _pattern_host("http://u:p@Example.com/*") == "example.com"  # userinfo: not the host
    assert _pattern_host("http://a@b@example.com:8080/*") == "example.com"
    assert _pattern_host("http://fd00::1/*") == "fd00::1"  # an unbracketed v6 literal, whole
    assert _pattern_host("http://[FD00::A]:8080/*") == "fd00::a"


def test_a_header_value_s_tab_is_sent_and_a_path_beyond_ascii_percent_encoded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    wire = Wire()
    fetched(monkeypatch, wire, "http://localhost/caf\u00e9?q=\u65e5", ["http://localhost/*"],
            headers={"X-Tag": "a\tb"})
    sent = bytes(wire.sent).decode()
    assert sent.startswith("GET /caf%C3%A9?q=%E6%97%A5 HTTP/1.1\r\n") and "x-tag: a\tb\r\n" in sent


def test_a_response_s_head_is_bounded_and_its_repeated_fields_joined_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A field repeated 150,000 times was joined anew at each repeat (the loop held
    1.8 s); 1,000,000 distinct fields took 370 MB: at most `MAX_RESPONSE_FIELDS` fields
    and `MAX_RESPONSE_HEAD` bytes of names and values; within them, joined."""
    field = b"x-r: " + b"a" * 100 + b"\r\n"
    def answer(fields: bytes) -> Wire:
        return Wire(b"HTTP/1.1 200 OK\r\n" + fields + b"content-length: 0\r\n\r\n")

    got = fetched(monkeypatch, answer(field * (MAX_RESPONSE_FIELDS - 1)), "http://localhost/",
                  ["http://localhost"])
    assert got["headers"]["x-r"] == ", ".join(["a" * 100] * (MAX_RESPONSE_FIELDS - 1))
    assert len(got["header_list"]) == MAX_RESPONSE_FIELDS
    words = (f"fetch: response headers past {MAX_RESPONSE_FIELDS} fields or "
             f"{MAX_RESPONSE_HEAD} bytes")
    started = time.perf_counter()
    for fields in (field * MAX_RESPONSE_FIELDS, field * 150_000,
                   b"x-big: " + b"b" * (MAX_RESPONSE_HEAD - 15) + b"\r\n"):
        with pytest.raises(BindingError) as e:
            fetched(monkeypatch, answer(fields), "http://localhost/", ["http://localhost"])
        assert str(e.value) == words
    assert time.perf_counter() - started < 1.0
