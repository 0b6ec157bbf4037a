"""Which plans the native lane may serve (`runtime.pipeline.lane`): a request is taken
by the C (`NativeLane.serve` answers it) only when every stage its target's plan keeps
has an exact native form; otherwise it is left to Python, whose stages act on it. A
wrong rule serves in C a request a stage should have seen, so each case here sends the
request to the lane and, when the lane leaves it, to the PoP's chain, and checks what
the stage did there; what the lane takes it answers as the chain does. Real PoPs
(config, registry, plans, the C lane), no sockets."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runtime import config as c
from runtime.functions import deploys
from runtime.net.message import Request, Response
from runtime.observe.metrics import DURATION
from runtime.pipeline.lane import NativeLane
from runtime.pipeline.stage import Context
from runtime.pipeline.stages.ratelimit import RateLimit
from runtime.pop import PoP
from runtime.security.ratelimit import native as native_counters
from runtime.security.ratelimit.counters import Counters as PythonCounters
from tests.net.lane_support import MIRROR, static_reactor
from tests.net.test_native_lane_wasi import writing as wasi_command
from tests.support import function_dir

ROOT = Path(__file__).resolve().parents[2]
OK = static_reactor(200, [(b"Cache-Tag", b"t1"), (b"x-a", b"1")], b"ok")
CURL, GPTBOT = b"curl/8.5", b"GPTBot/1.2"
FIREFOX = b"Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0"
LONG = "/" + "l" * 254  # 255 bytes: the longest path the lane's table holds
# name: (routes, manifest lines)
FUNCTIONS: dict[str, tuple[list[str], str]] = {
    "plain": (["/plain", "/plain2"], ""),
    "nocache": (["/nocache"], "[cache.http]\nenabled = false\n"),
    "ttl": (["/ttl"], "[cache.http]\ndefault_ttl = 60\n"),
    "limited": (["/limited"], '[[rate_limits]]\nby = "ip"\nlimit = "1000/minute"\n'),
    "noautomation": (["/noautomation"], '[bots]\nautomation = "block"\n'),
    "noagents": (["/noagents"], '[bots]\ndeclared_agent = "challenge"\n'),
    "captures": (["/captures", "/captures/:id", "/star/*"], ""),
    "long": ([LONG, LONG + "x"], ""),
}


def pop_with(root: Path, **config: Any) -> PoP:
    pop = PoP(c.load(None, data=str(root / "data"), **{"ai.enabled": False, **config}))
    assert isinstance(pop.lane, NativeLane)
    return pop


def deploy(pop: PoP, folder: Path) -> None:
    asyncio.run(pop.registry.deploy(deploys.pack_dir(folder)))


def raw(path: str, ua: bytes = b"", method: bytes = b"GET") -> bytes:
    agent = b"User-Agent: %s\r\n" % ua if ua else b""
    return b"%s %s HTTP/1.1\r\nHost: x\r\n%s\r\n" % (method, path.encode(), agent)


def lane_answer(pop: PoP, path: str, ua: bytes = b"", method: bytes = b"GET"
                ) -> bytes | None:
    """The lane's answer to one request for `path`, or None when it leaves it to
    Python (then it took none of its bytes and started no call)."""
    assert pop.lane is not None
    data = raw(path, ua, method)
    used, out, call = pop.lane.serve(data, "127.0.0.1:1", b"date: D\r\n", b"", 1 << 20)
    assert call is None
    if used == 0:
        assert out == b""
        return None
    assert used == len(data)
    return bytes(out)


def chain_answer(pop: PoP, path: str, ua: bytes = b"", method: bytes = b"GET",
                 extra: list[tuple[bytes, bytes]] | None = None, ctx: Context | None = None
                 ) -> Response:
    """What the PoP's chain (Python's stages, by the target's plan) answers."""
    headers = [(b"host", b"x")] + ([(b"user-agent", ua)] if ua else []) + (extra or [])
    request = Request(method, path.encode(), b"", headers, b"x", "1.1", True, "127.0.0.1:1")

    async def run() -> Response:
        result = pop.pipeline.run(request, ctx or Context("127.0.0.1:1"))
        return result if isinstance(result, Response) else await result

    return asyncio.run(run())


def written(response: Response, method: bytes = b"GET") -> bytes:
    """`response` as the lane writes it: date first, then its headers, the length."""
    assert isinstance(response.body, bytes)
    head = b"".join(b"%s: %s\r\n" % (k, v) for k, v in response.headers)
    body = b"" if method == b"HEAD" else response.body
    return b"HTTP/1.1 %d %s\r\ndate: D\r\n%scontent-length: %d\r\n\r\n%s" % (
        response.status, _phrase(response.status), head, len(response.body), body)


def _phrase(status: int) -> bytes:
    from http import HTTPStatus
    return HTTPStatus(status).phrase.encode()


def same(lane: bytes | None, python: Response, method: bytes = b"GET") -> bool:
    """The lane's answer is the chain's, up to the request id's number and a rate
    limit's state (the quota left: one request apart, one fewer)."""
    assert lane is not None

    def plain(raw: bytes) -> bytes:
        raw = re.sub(rb"(x-request-id: [0-9a-f]+-)[0-9a-f]+", rb"\1N", raw)
        return re.sub(rb'("[a-z0-9-]+";)r=\d+;t=\d+', rb"\1r=R;t=T", raw)

    return plain(lane) == plain(written(python, method))


def header(response: Response, name: bytes) -> bytes | None:
    return next((v for k, v in response.headers if k == name), None)


@pytest.fixture(scope="module")
def pop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoP]:
    """A PoP with the default stages and `FUNCTIONS` deployed."""
    root = tmp_path_factory.mktemp("lane_plans")
    pop = pop_with(root)
    for name, (routes, extra) in FUNCTIONS.items():
        deploy(pop, function_dir(root / "fns", name, OK, routes=routes, extra=extra))
    yield pop
    pop.close()


def test_a_function_every_kept_stage_of_which_is_native_is_the_lanes(pop: PoP) -> None:
    """Default stages: health, request_id, events, bots, residency, http_cache (a MISS:
    nothing stored, no default TTL) and dispatch are kept, all native: the lane answers
    GET and HEAD on both literal routes as the chain does, for a request without a
    User-Agent (automation) and for a declared agent."""
    for path in ("/plain", "/plain2"):
        for ua in (b"", CURL, GPTBOT):
            for method in (b"GET", b"HEAD"):
                lane = lane_answer(pop, path, ua, method)
                assert lane is not None and b"\r\nx-edgefn-cache: MISS\r\n" in lane
                assert same(lane, chain_answer(pop, path, ua, method), method)


def test_the_http_cache_off_for_a_function_is_the_lanes_without_its_tags(pop: PoP) -> None:
    """``[cache.http] enabled = false``: http_cache only drops Cache-Tag (no MISS)."""
    lane = lane_answer(pop, "/nocache")
    python = chain_answer(pop, "/nocache")
    assert lane is not None and same(lane, python)
    assert b"cache-tag" not in lane.lower() and b"x-edgefn-cache" not in lane
    assert header(python, b"x-a") == b"1"


def test_a_default_ttl_leaves_the_function_to_python(pop: PoP) -> None:
    """A default TTL stores an answer without Cache-Control: the chain's cache must
    see the request (its next one is a HIT)."""
    assert lane_answer(pop, "/ttl") is None
    assert header(chain_answer(pop, "/ttl"), b"x-edgefn-cache") == b"MISS"
    assert header(chain_answer(pop, "/ttl"), b"x-edgefn-cache") == b"HIT"
    assert lane_answer(pop, "/ttl") is None


def test_a_rate_limited_function_is_the_lanes_counted_in_the_stages_counts(pop: PoP
                                                                           ) -> None:
    """A WASM function with a rate limit by ip (1000/minute): the lane serves it as
    the chain does, the RateLimit fields and the pass in its event included, each
    request counted once in the stage's counters whichever path took it (the quota
    left goes down by one per request, lane or chain)."""
    counted_alike(pop)


def test_with_the_python_counters_the_lane_counts_as_the_chain(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the counters' C cannot be had (no compiler), counters.py's count: the
    lane asks them and counts in them as it does the C's (`admits_all`, `count`)."""
    monkeypatch.setattr(native_counters, "load", lambda: None)
    pop = pop_with(tmp_path)
    try:
        routes, extra = FUNCTIONS["limited"]
        deploy(pop, function_dir(tmp_path / "fns", "limited", OK, routes=routes, extra=extra))
        stage = next(s for s in pop.pipeline.stages if isinstance(s, RateLimit))
        assert type(stage.limiter.counters) is PythonCounters
        counted_alike(pop)
    finally:
        pop.close()


def counted_alike(pop: PoP) -> None:
    """/limited, twice by the lane and twice by the chain, in turns: the same answers
    and events (but the quota and the request id), the quota down by one each time."""
    quota = re.compile(rb";r=(\d+);t=\d+")

    def plain(raw: bytes) -> bytes:  # but the quota's state and the request id's number
        return re.sub(rb"(x-request-id: [0-9a-f]+-)[0-9a-f]+", rb"\1N", quota.sub(b"", raw))

    remaining = []
    for _ in range(2):
        lane = lane_answer(pop, "/limited")
        assert lane is not None
        lane_event = fields(pop, 1)[0]
        python = chain_answer(pop, "/limited")
        assert lane_event["decisions"]["ratelimit"] == {"limited": None}
        assert lane_event == fields(pop, 1)[0]
        state = header(python, b"ratelimit")
        assert state is not None
        remaining += [int(quota.findall(lane)[0]), int(quota.findall(state)[0])]
        assert plain(lane) == plain(written(python, b"GET"))
    assert remaining == list(range(remaining[0], remaining[0] - 4, -1))


@pytest.mark.parametrize("path, taken, blocked, left", [
    ("/noautomation", [GPTBOT], [b"", CURL], []),
    ("/noagents", [b"", CURL], [], [GPTBOT]),
])
def test_the_lane_serves_only_the_bot_classes_a_function_allows(
        pop: PoP, path: str, taken: list[bytes], blocked: list[bytes], left: list[bytes]
        ) -> None:
    """The classes a function's ``[bots]`` allows are the lane's; one it blocks is
    bots' 403, written by the lane as the chain answers it; one it challenges is the
    chain's (429)."""
    for ua in taken:
        assert same(lane_answer(pop, path, ua), chain_answer(pop, path, ua))
    for ua in blocked:
        answer = lane_answer(pop, path, ua)
        assert answer is not None and answer.startswith(b"HTTP/1.1 403 ")
        assert same(answer, chain_answer(pop, path, ua))
    for ua in left:
        assert lane_answer(pop, path, ua) is None
        assert chain_answer(pop, path, ua).status in (403, 429)


CHROME = (b"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
          b"Chrome/120.0.0.0 Safari/537.36")
SAFARI = (b"Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, "
          b"like Gecko) Version/17.0 Safari/605.1.15")
HINTS = [b'"Chromium";v="120", "Not(A:Brand";v="24", "Google Chrome";v="120"',
         b'"Not(A:Brand";v="24", "Google Chrome";v="119"', b'"Microsoft Edge";  v="120"',
         b'"Chromium";\tv="120"', b'"Chromium";v="1234567", "Chromium";v="120"',
         b'"Chromium";v="0120"', b'"Brave";v="120"', b'"Chromium" ;v="120"',
         b'x"Chromium";v="120"', b'"Chromium";v=120', b"", b'"Chromium";v=""']


def served(pop: PoP, path: str, headers: list[tuple[bytes, bytes]], method: bytes = b"GET"
           ) -> bytes | None:
    """The lane's answer to `method` `path` with `headers`, or None (Python's)."""
    assert pop.lane is not None
    data = b"%s %s HTTP/1.1\r\nHost: x\r\n%s\r\n" % (
        method, path.encode(), b"".join(b"%s: %s\r\n" % h for h in headers))
    used, out, call = pop.lane.serve(data, "127.0.0.1:1", b"date: D\r\n", b"", 1 << 20)
    assert call is None and used in (0, len(data))
    return bytes(out) if used else None


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ua=st.sampled_from([CHROME, FIREFOX, SAFARI]), accept=st.booleans(),
       language=st.booleans(), fetch=st.booleans(),
       hints=st.lists(st.sampled_from(HINTS), max_size=2),
       path=st.sampled_from(["/plain", "/noautomation"]))
def test_a_browsers_class_is_decided_in_c_as_the_classifier_decides_it(
        pop: PoP, ua: bytes, accept: bool, language: bool, fetch: bool, hints: list[bytes],
        path: str) -> None:
    """A browser's User-Agent was always Python's (its other headers decide its class).
    Now the C decides it as `Classifier.classify` does: automation without Accept or
    Accept-Language, without Sec-Fetch-Mode where its version sends it, or with
    Sec-CH-UA hints (the last copy) whose Chromium version differs; else a browser.
    The lane's answer and event (class, signals) are the chain's; a class the
    function blocks (``/noautomation``) is Python's, which refuses it."""
    headers = [(b"user-agent", ua)]
    headers += [(b"accept", b"text/html")] if accept else []
    headers += [(b"accept-language", b"en")] if language else []
    headers += [(b"sec-fetch-mode", b"cors")] if fetch else []
    headers += [(b"sec-ch-ua", h) for h in hints]
    lane = served(pop, path, headers)
    python = chain_answer(pop, path, ua, extra=headers[1:])
    if lane is None:
        assert path == "/noautomation" and python.status == 403
        return
    event = fields(pop, 2)
    assert same(lane, python) and event[0] == event[1]


def test_a_literal_route_and_what_lies_under_it_alone_are_the_lanes(pop: PoP) -> None:
    """Every route is a prefix: the lane serves a literal route and the paths under it
    that no other route takes (``/plain/sub``; ``/plain2`` is beside it; ``/captures/``,
    whose empty segment ``/captures/:id`` refuses), a capture's matches and a
    wildcard's (``/star/*``), as the chain answers them; a path past a segment
    boundary is Python's."""
    assert same(lane_answer(pop, "/captures"), chain_answer(pop, "/captures"))
    for path in ("/plain/sub", "/plain/a/b/", "/plain2/x", "/noagents/1", "/captures/",
                 "/captures/1", "/captures/1/x", "/star/a", "/star", "/star/", "/star/a//b"):
        assert same(lane_answer(pop, path), chain_answer(pop, path)), path
        served = fields(pop, 2)
        assert served[0] == served[1], path
    assert lane_answer(pop, "/plainx") is None
    assert chain_answer(pop, "/plainx").status in (200, 404)


SEGMENTS = ["plain", "plain2", "captures", "star", "nocache", "limited", "noagents", "sub",
            "1", "x", "", "l" * 254]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(segments=st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=4),
       method=st.sampled_from([b"GET", b"HEAD", b"POST"]))
def test_a_path_the_lane_serves_is_served_as_the_router_routes_it(
        pop: PoP, segments: list[str], method: bytes) -> None:
    """Any path made of the routes' segments: what the lane answers, it answers as the
    chain does (the function, the answer) and leaves the chain's event (its route and
    path, decisions, bytes); what it leaves, the chain answers. A path under a literal
    route that no other route lies under, or a wildcard's, is the lane's
    (completeness)."""
    path = "/" + "/".join(segments)
    lane = lane_answer(pop, path, method=method)
    if lane is not None:
        served = fields(pop, 1)
        assert same(lane, chain_answer(pop, path, method=method), method), path
        assert served == fields(pop, 1), path
    else:
        chain_answer(pop, path, method=method)
    # the literal routes nothing else lies under, and the wildcard: each path from them
    # on is the lane's (a rate-limited function's too)
    if segments[0] in ("plain", "plain2", "nocache", "noagents", "l" * 254, "star",
                       "limited"):
        assert lane is not None, path


def test_the_longest_path_the_table_holds(pop: PoP) -> None:
    """A route of 255 bytes is the lane's, one of 256 Python's."""
    assert same(lane_answer(pop, LONG), chain_answer(pop, LONG))
    assert lane_answer(pop, LONG + "x") is None
    assert chain_answer(pop, LONG + "x").status == 200


def test_a_path_no_function_serves_is_pythons(pop: PoP) -> None:
    assert lane_answer(pop, "/nothing") is None
    assert chain_answer(pop, "/nothing").status == 404


def test_a_reactor_with_host_imports_is_pythons_and_a_wasi_command_the_lanes(tmp_path: Path
                                                                           ) -> None:
    """The lane calls a reactor without host imports itself; a reactor with the KV
    binding is answered by the chain; a WASI command (``_start``) without host imports
    or sleeps is run by the C too (lane.c `command_call`), answered as the chain does;
    one that sleeps (`poll_oneoff`, Python's) is a call the lane starts (`_command`)."""
    pop = pop_with(tmp_path)
    try:
        deploy(pop, ROOT / "functions" / "examples" / "hello-c")
        deploy(pop, ROOT / "functions" / "examples" / "counter-c")
        deploy(pop, function_dir(tmp_path / "fns", "plain", OK))
        sleepy = wasi_command(b"X-A: b\n\nslept\n", before="(call $sleep (i64.const 1000))")
        deploy(pop, function_dir(tmp_path / "fns", "sleepy", sleepy, extra='abi = "wasi"'))
        assert lane_answer(pop, "/plain") is not None
        assert lane_answer(pop, "/counter-c") is None
        assert chain_answer(pop, "/counter-c").status == 200
        assert same(lane_answer(pop, "/hello-c"), chain_answer(pop, "/hello-c"))

        async def started() -> Response:
            assert pop.lane is not None
            data = raw("/sleepy")
            used, out, call = pop.lane.serve(data, "127.0.0.1:1", b"date: D\r\n", b"", 1 << 20)
            assert (used, out) == (len(data), b"") and call is not None
            return await call[0]

        got = asyncio.run(started())
        assert got.status == 200 and got.body == b"slept\n"
    finally:
        pop.close()


def test_a_function_with_a_canary_is_pythons_until_it_ends(tmp_path: Path) -> None:
    """A canary splits requests between two versions by key: the chain chooses. Once
    it is dropped the live version is the lane's again."""
    pop = pop_with(tmp_path)
    try:
        deploy(pop, function_dir(tmp_path / "1", "f", OK))
        two = function_dir(tmp_path / "2", "f", static_reactor(200, [], b"two"))
        version = asyncio.run(pop.registry.stage(deploys.pack_dir(two))).version
        asyncio.run(pop.registry.activate("f", version, canary=50))
        assert lane_answer(pop, "/f") is None
        bodies = {chain_answer(pop, "/f").body for _ in range(1)}
        assert bodies <= {b"ok", b"two"}
        asyncio.run(pop.registry.rollback("f"))  # drops the canary
        assert lane_answer(pop, "/f") is not None
    finally:
        pop.close()


def test_a_host_bound_route_takes_every_function_off_the_lane(tmp_path: Path) -> None:
    """Routes bound to a host are matched on the Host header, which the lane's table
    does not read: while one exists, no function is the lane's."""
    pop = pop_with(tmp_path)
    try:
        deploy(pop, function_dir(tmp_path / "fns", "plain", OK))
        assert lane_answer(pop, "/plain") is not None
        hosted = function_dir(tmp_path / "fns", "hosted", OK)
        manifest = hosted / "edgefn.toml"
        manifest.write_text(manifest.read_text().replace(
            'routes = ["/hosted"]', 'routes = [{path = "/h", host = "example.com"}]'))
        deploy(pop, hosted)
        assert lane_answer(pop, "/plain") is None
        assert chain_answer(pop, "/plain").status == 200
        asyncio.run(pop.registry.delete("hosted"))
        assert lane_answer(pop, "/plain") is not None
    finally:
        pop.close()


def test_a_key_file_with_keys_leaves_anonymous_requests_of_public_functions_on_the_lane(
        tmp_path: Path) -> None:
    """auth is idle while no key exists; once the key file has one, auth (and the
    ratelimit stage after it: a key may carry limits) is kept for every function (its
    stamp changes the plans). That took every function off the lane, once anyone made
    a key (for the OpenAI API, say). Now a public function's (mode ``none``) requests
    without a credential stay on it, answered as the chain answers them; one with a
    key is the chain's, whose auth proves its principal, and a function that needs a
    key (``auth = "key"``) is the chain's but for auth's 401 to a request without a
    credential (the lane's, the chain's bytes); a function with a rate limit by ip stays
    the lane's, counted in the stage's counters (`RateLimit.lane_checks`)."""
    pop = pop_with(tmp_path)
    try:
        deploy(pop, function_dir(tmp_path / "fns", "plain", OK))
        deploy(pop, function_dir(tmp_path / "fns", "private", OK, routes=["/private"],
                                 extra='auth = "key"\n'))
        routes, extra = FUNCTIONS["limited"]
        deploy(pop, function_dir(tmp_path / "fns", "limited", OK, routes=routes, extra=extra))
        assert lane_answer(pop, "/plain") is not None
        assert pop.keys is not None
        key = pop.keys.store.create("acme", ("*",))[0]
        pop.keys.reload()
        assert pop.lane is not None
        names = [s.name for s in pop.pipeline.kept(pop.registry.functions["plain"]) or []]
        assert "auth" in names and "ratelimit" in names
        served = lane_answer(pop, "/plain", CURL)
        assert served is not None and same(served, chain_answer(pop, "/plain", CURL))
        refused = lane_answer(pop, "/private", CURL)  # no credential: auth's 401, the C's
        assert refused is not None and same(refused, chain_answer(pop, "/private", CURL))
        assert refused.startswith(b"HTTP/1.1 401 ")
        private = b"GET /private HTTP/1.1\r\nHost: x\r\nx-api-key: %s\r\n\r\n" % key.encode()
        assert pop.lane.serve(private, "127.0.0.1:1", b"date: D\r\n", b"", 1 << 20)[0] == 0
        served = lane_answer(pop, "/limited", CURL)
        assert served is not None and same(served, chain_answer(pop, "/limited", CURL))
        with_key = b"GET /plain HTTP/1.1\r\nHost: x\r\nx-api-key: %s\r\n\r\n" % key.encode()
        assert pop.lane.serve(with_key, "127.0.0.1:1", b"date: D\r\n", b"", 1 << 20)[0] == 0
        ctx = Context("127.0.0.1:1")
        assert chain_answer(pop, "/plain", extra=[(b"x-api-key", key.encode())],
                            ctx=ctx).status == 200
        assert ctx.principal is not None and ctx.principal.tenant == "acme"
    finally:
        pop.close()


def test_with_the_http_cache_off_the_lane_answers_as_the_chain(tmp_path: Path) -> None:
    """``[http_cache] enabled = false``: no http_cache stage runs, and nothing says
    MISS; a function's Cache-Tag is still the cache's, never the client's (it reached
    clients), on both paths."""
    pop = pop_with(tmp_path, **{"http_cache.enabled": False})
    try:
        deploy(pop, function_dir(tmp_path / "fns", "plain", OK))
        lane = lane_answer(pop, "/plain")
        chain = chain_answer(pop, "/plain")
        assert lane is not None and same(lane, chain)
        assert b"cache-tag" not in lane.lower() and b"x-edgefn-cache" not in lane
        assert header(chain, b"cache-tag") is None and header(chain, b"x-a") == b"1"
    finally:
        pop.close()


def test_abusive_rate_leaves_every_function_to_python(tmp_path: Path) -> None:
    """abusive_rate counts every request: no function is the lane's."""
    pop = pop_with(tmp_path, **{"bots.abusive_rate": "50/second"})
    try:
        for name in ("plain", "nocache"):
            routes, extra = FUNCTIONS[name]
            deploy(pop, function_dir(tmp_path / "fns", name, OK, routes=routes, extra=extra))
        assert lane_answer(pop, "/plain") is None
        assert chain_answer(pop, "/plain").status == 200
        assert lane_answer(pop, "/nocache") is None
    finally:
        pop.close()


# another worker of the PoP (its own process: LMDB opens a folder once per process)
# stores a response for /plain of the deployment labelled argv[2]
OTHER_WORKER = """
import sys
from pathlib import Path
from runtime import config as c
from runtime.cache.http.cache import HttpCache
from runtime.net.message import Request, Response
data, label = Path(sys.argv[1]), sys.argv[2]
cache = HttpCache(c.load(None, data=str(data)).http_cache, data, writers=2)
request = Request(b"GET", b"/plain", b"", [(b"host", b"x")], b"x", "1.1", True, "o:1")
key = HttpCache.key(label, request)
entry = cache.admit(key, request, "", Response(200, [(b"cache-control", b"max-age=60")],
                                               b"theirs"), 1.0, None)
assert not isinstance(entry, str), entry
cache.stored(key, label)
cache.close()
"""


def test_with_workers_the_lane_serves_a_function_until_any_worker_stores_its_response(
        tmp_path: Path) -> None:
    """workers = 2 (the HTTP cache's disk shared): the lane serves /plain, of which no
    worker stored anything, as the chain does. Once another worker (a second cache on
    the same folder) stores a response of that deployment, the lane's next read
    leaves /plain to Python, whose lookup serves the stored response: the lane never
    answers a request the chain would have answered from the cache."""
    pop = pop_with(tmp_path, workers=2)
    try:
        for name in ("plain", "nocache"):
            routes, extra = FUNCTIONS[name]
            deploy(pop, function_dir(tmp_path / "fns", name, OK, routes=routes, extra=extra))
        assert same(lane_answer(pop, "/plain"), chain_answer(pop, "/plain"))
        label = pop.registry.functions["plain"].label
        subprocess.run([sys.executable, "-c", OTHER_WORKER, str(pop.data_dir), label],
                       cwd=ROOT, check=True, timeout=60)
        assert lane_answer(pop, "/plain") is None
        got = chain_answer(pop, "/plain")
        assert (got.body, header(got, b"x-edgefn-cache")) == (b"theirs", b"HIT")
        assert lane_answer(pop, "/nocache") is not None  # the cache is off for it: still C's
    finally:
        pop.close()


def fields(pop: PoP, n: int) -> list[dict[str, Any]]:
    """The last `n` events of `pop`'s ring, without what differs between two requests
    alike (the request id's number, the times)."""
    pop.observers.flush()
    out = []
    for e in list(pop.ring.events)[-n:]:
        d = {f: getattr(e, f) for f in e.__struct_fields__}
        d["rid"] = d["rid"].rpartition("-")[0]
        del d["ts"], d["duration_ms"], d["stages_ms"]
        out.append(d)
    return out


def test_the_lanes_events_and_counts_are_the_chains(pop: PoP) -> None:
    """Each request the lane answers leaves the event the chain leaves for it (bot
    class and decisions, http_cache's MISS or none, route, bytes, HEAD's) and counts
    in the same request series."""
    cases = [("/plain", b"", b"GET"), ("/plain2", GPTBOT, b"HEAD"), ("/nocache", CURL, b"GET"),
             ("/noautomation", GPTBOT, b"GET"), ("/captures", b"", b"HEAD")]
    assert pop.metrics is not None
    series = pop.metrics.requests.series

    def counts() -> dict[Any, int]:  # every series' request count: its buckets together
        return {k: int(sum(v[:DURATION.n])) for k, v in series.items()}

    for path, ua, method in cases:
        before = counts()
        assert lane_answer(pop, path, ua, method) is not None
        lane, by_lane = fields(pop, 1), counts()
        chain_answer(pop, path, ua, method)
        chain, by_chain = fields(pop, 1), counts()
        assert lane == chain, path
        assert {k: by_lane[k] - before.get(k, 0) for k in by_lane} == \
            {k: by_chain[k] - by_lane.get(k, 0) for k in by_chain}, path


PYFN = '''
from edgefn import Response


def handle(request, env):
    do = request.query.get("do", "ok")
    if do == "boom":
        raise RuntimeError("boom")
    if do == "cached":
        return Response("keep\\n", headers={"Cache-Control": "max-age=60"})
    if do == "wait":
        import time
        time.sleep(0.2)
    return Response(f"hi {request.method}\\n", headers=[("Cache-Tag", "t1"), ("x-a", "1")])
'''


def test_a_python_functions_requests_are_called_by_the_lane(tmp_path: Path) -> None:
    """A Python function whose plan is all native: the lane starts its call and writes
    its answer as the chain would; one past `limits.concurrency` is the chain's
    (dispatch's 503); one with a rate limit is counted as the lane submits it, its
    answer with the limiter's headers, as the chain's. A call that fails, one
    whose answer the HTTP cache stores, one whose connection closes and one whose
    client left are finished by the stages' own code, with the chain's events."""
    from tests.support import python_function

    pool = "min = 1\nmax = 1\nstandby = false"
    folders = [python_function(tmp_path / "fns", name, PYFN, pool=pool, limits=limits,
                               extra=extra)
               for name, limits, extra in [
                   ("py", "", ""), ("cached", "", ""), ("one", "concurrency = 1", ""),
                   ("limited", "", '[[rate_limits]]\nby = "ip"\nlimit = "1000/minute"')]]

    async def main(pop: PoP, lane: NativeLane) -> None:
        for folder in folders:
            await pop.registry.deploy(deploys.pack_dir(folder))

        async def chain(path: str, query: bytes = b"") -> Response:
            request = Request(b"GET", path.encode(), query, [(b"host", b"x")], b"x", "1.1",
                              True, "127.0.0.1:1")
            result = pop.pipeline.run(request, Context("127.0.0.1:1"))
            response = result if isinstance(result, Response) else await result
            pop.observers.flush()
            return response

        def start(target: str) -> tuple[Any, ...] | None:
            """The call the lane started for `target`, None when it left it to Python."""
            data = raw(target)
            used, out, call = lane.serve(data, "127.0.0.1:1", b"date: D\r\n", b"", 1 << 20)
            assert out == b"" and used == (len(data) if call is not None else 0)
            return call

        async def answer(call: tuple[Any, ...] | None, gone: bool = False,
                         closing: bool = False) -> Any:
            assert call is not None
            await asyncio.wait([call[0]])
            got = lane.answer(call, gone, closing, b"date: D\r\n", b"")
            pop.observers.flush()
            return got

        # the C writes the answer; the event is the chain's
        got = await answer(start("/py?do=ok"))
        assert isinstance(got, bytes) and same(got, await chain("/py", b"do=ok"))
        assert fields(pop, 2)[0] == fields(pop, 2)[1]
        # a failure is contained by the stages' code: the chain's 500 and event
        got = await answer(start("/py?do=boom"))
        python = await chain("/py", b"do=boom")
        assert isinstance(got, tuple) and got[1].status == python.status == 500
        assert got[1].headers[:-1] == python.headers[:-1]  # but the request id
        assert fields(pop, 2)[0] == fields(pop, 2)[1]
        # a connection that closes after it: Python writes the same response
        got = await answer(start("/py?do=ok"), closing=True)
        python = await chain("/py", b"do=ok")
        assert isinstance(got, tuple) and got[1].status == 200
        assert got[1].body == python.body and got[1].headers[:-1] == python.headers[:-1]
        # a client gone during the call: a 499 event, the slot given back
        assert await answer(start("/py?do=ok"), gone=True) is None
        assert [e.status for e in list(pop.ring.events)[-1:]] == [499]
        # an answer the HTTP cache stores: Python's MISS; then the deployment has an
        # entry and its requests are the chain's (a HIT)
        got = await answer(start("/cached?do=cached"))
        assert isinstance(got, tuple) and header(got[1], b"x-edgefn-cache") == b"MISS"
        assert start("/cached?do=cached") is None
        assert header(await chain("/cached", b"do=cached"), b"x-edgefn-cache") == b"HIT"
        # past limits.concurrency: the chain's 503; the slot comes back once answered
        first = start("/one?do=wait")
        assert start("/one") is None
        assert (await chain("/one")).status == 503
        assert isinstance(await answer(first), bytes)
        assert isinstance(await answer(start("/one")), bytes)
        # a rate-limited function's call: counted as submitted, answered with the fields
        got = await answer(start("/limited"))
        assert isinstance(got, bytes) and same(got, await chain("/limited"))
        assert b"\r\nratelimit-policy: " in got
        assert fields(pop, 2)[0] == fields(pop, 2)[1]
        assert all(fn.inflight == 0 for fn in pop.registry.functions.values())

    async def run() -> None:
        pop = pop_with(tmp_path)
        assert pop.lane is not None
        try:
            await main(pop, pop.lane)
        finally:
            pop.close()

    asyncio.run(run())


NO_EVENTS = [{"stage": s} for s in ("health", "request_id", "waf", "bots", "auth",
                                     "residency", "ratelimit", "http_cache", "route",
                                     "dispatch")]


def test_without_an_events_stage_the_lane_serves_and_counts_the_cache_as_the_chain(
        tmp_path: Path) -> None:
    """A pipeline without ``events`` (nor ``access_log``), made lighter: the lane still
    serves its functions, a WASM reactor's and a Python function's, with the chain's
    answers; no event is made on either path, and http_cache counts the lane's MISS
    and BYPASS as the chain's, per function. A client gone during a Python call
    leaves no event and gives its slot back."""
    from tests.support import python_function

    pop = pop_with(tmp_path, pipeline=NO_EVENTS)
    lane = pop.lane
    assert lane is not None and lane.events is None and lane.maker is None
    stage = lane.http_cache
    assert stage is not None and stage.stats is not None
    stats = stage.stats

    def counts() -> dict[tuple[str, str], int]:
        return {(k[1], k[4]): t.count for k, t in stats.tallies.items() if k[0] == "http"}

    async def main() -> None:
        await pop.registry.deploy(deploys.pack_dir(function_dir(tmp_path / "fns", "plain",
                                                                OK, routes=["/plain"])))
        await pop.registry.deploy(deploys.pack_dir(python_function(
            tmp_path / "fns", "py", PYFN, pool="min = 1\nmax = 1\nstandby = false")))
        for path, method in [("/plain", b"GET"), ("/plain", b"POST"), ("/py", b"GET"),
                             ("/py", b"POST")]:
            data = raw(path, CURL, method)
            before = counts()
            used, out, call = lane.serve(data, "127.0.0.1:1", b"date: D\r\n", b"", 1 << 20)
            assert used == len(data), path
            if call is not None:
                await asyncio.wait([call[0]])
                out = lane.answer(call, False, False, b"date: D\r\n", b"")
            assert isinstance(out, bytes) and out.startswith(b"HTTP/1.1 200 "), path
            lane.drain()
            after = counts()
            by_lane = {k: n - before.get(k, 0) for k, n in after.items() if n > before.get(k, 0)}
            headers = [(b"host", b"x"), (b"user-agent", CURL)]
            request = Request(method, path.encode(), b"", headers, b"x", "1.1", True,
                              "127.0.0.1:1")
            result = pop.pipeline.run(request, Context("127.0.0.1:1"))
            python = result if isinstance(result, Response) else await result
            assert same(bytes(out), python, method), path
            by_chain = {k: n - after.get(k, 0) for k, n in counts().items()
                        if n > after.get(k, 0)}
            assert by_lane == by_chain and sum(by_lane.values()) == 1, path
        call = lane.serve(raw("/py", CURL), "127.0.0.1:1", b"date: D\r\n", b"", 1 << 20)[2]
        assert call is not None
        await asyncio.wait([call[0]])
        assert lane.answer(call, True, False, b"date: D\r\n", b"") is None
        assert all(fn.inflight == 0 for fn in pop.registry.functions.values())
        assert lane.served == 4 and lane.calls == 3
        pop.observers.flush()
        assert len(pop.ring.events) == 0

    try:
        asyncio.run(main())
    finally:
        pop.close()


def with_cors() -> list[dict[str, Any]]:
    """The default pipeline with a ``cors`` stage before ``auth``, as the README shows."""
    names = [type(s).__struct_config__.tag for s in c.default_pipeline()]  # type: ignore[attr-defined]
    cors = {"stage": "cors", "allowed_origins": ["https://app.example"],
            "paths": ["/v1/", "/cors/"]}
    at = names.index("auth")
    return [{"stage": n} for n in names[:at]] + [cors] + [{"stage": n} for n in names[at:]]


def test_a_cors_stage_leaves_the_lane_every_request_it_hands_on_untouched(
        tmp_path: Path) -> None:
    """A ``cors`` stage in the pipeline (the README's example) took every function off
    the lane. Now the lane serves what cors hands on untouched, as the chain answers
    it: a request without an Origin header, or with one for a path outside the
    stage's `paths`; one with an Origin on them (cors tags its response, or answers
    its preflight) is Python's, and gets its CORS headers there."""
    pop = pop_with(tmp_path, pipeline=with_cors())
    try:
        deploy(pop, function_dir(tmp_path / "fns", "plain", OK, routes=["/plain"]))
        deploy(pop, function_dir(tmp_path / "fns", "under", OK, routes=["/cors/x"]))
        origin = (b"origin", b"https://app.example")

        def lane(path: str, headers: list[tuple[bytes, bytes]], method: bytes = b"GET"
                 ) -> bytes | None:
            return served(pop, path, [(b"user-agent", CURL), *headers], method)

        for path, headers in [("/plain", []), ("/plain", [origin]), ("/cors/x", [])]:
            answer = lane(path, headers)
            python = chain_answer(pop, path, CURL, extra=headers)
            assert answer is not None and same(answer, python), (path, headers)
            assert header(python, b"access-control-allow-origin") is None
        assert lane("/cors/x", [origin]) is None
        python = chain_answer(pop, "/cors/x", CURL, extra=[origin])
        assert header(python, b"access-control-allow-origin") == b"https://app.example"
        assert lane("/cors/x", [(b"Origin", b"https://evil.example")]) is None  # any case
        preflight = [origin, (b"access-control-request-method", b"POST")]
        assert lane("/cors/x", preflight, b"OPTIONS") is None
        assert chain_answer(pop, "/cors/x", CURL, b"OPTIONS", preflight).status == 204
    finally:
        pop.close()


ROOTED: dict[str, tuple[list[str], bytes]] = {  # name: (routes, body)
    "root": (["/"], b"root"), "plain": (["/plain", "/plain/deep"], b"plain"),
    "captures": (["/captures/:id"], b"captured"), "files": (["/files/*"], b"files")}
ROOTED_SEGMENTS = ["plain", "plainx", "deep", "captures", "files", "healthz", "readyz", "x", "1",
                   ""]


@pytest.fixture(scope="module")
def rooted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoP]:
    """A PoP whose ``root`` function serves ``/`` (the catch-all), beside a literal
    route with one under it, a capture's and a wildcard's."""
    root = tmp_path_factory.mktemp("lane_rooted")
    pop = pop_with(root)
    for name, (routes, body) in ROOTED.items():
        deploy(pop, function_dir(root / "fns", name, static_reactor(200, [], body),
                                 routes=routes))
    yield pop
    pop.close()


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(segments=st.lists(st.sampled_from(ROOTED_SEGMENTS), min_size=0, max_size=4))
def test_the_catch_all_serves_on_the_lane_what_the_router_gives_it(
        rooted: PoP, segments: list[str]) -> None:
    """``/`` serves every path no other target takes: on the lane now too, but the
    health paths (answered before routes), a capture's or a wildcard's paths and
    the subtrees of the literal routes (each its own): the lane answers a path as
    the chain does, with the chain's event, and every path the router gives the
    catch-all (and no built-in takes) is the lane's, but those under a capture's
    literal head."""
    path = "/" + "/".join(segments)
    lane = lane_answer(rooted, path)
    ctx = Context("127.0.0.1:1")
    python = chain_answer(rooted, path, ctx=ctx)
    if lane is not None:
        event = fields(rooted, 2)
        assert same(lane, python) and event[0] == event[1], path
    # (under a capture's literal head the lane leaves every path: what the capture
    # refuses, an empty segment, is the catch-all's in Python)
    if path not in ("/healthz", "/readyz") and ctx.route == "/" and \
            not path.startswith("/captures/"):
        assert lane is not None and lane.endswith(b"\r\n\r\nroot"), path


CAPTURING: dict[str, list[str]] = {  # name: routes (mirrors: the guest's request, params too)
    "users": ["/users", "/users/:id", "/users/:id/posts", "/users/me", "/users/me/:tab"],
    "orgs": ["/orgs/:org/repos/:repo"], "plain": ["/plain"],
    "files": ["/files/*", "/users/:id/files/*"]}
CAPTURING_SEGMENTS = ["users", "me", "7", "posts", "x", "orgs", "acme", "repos", "r1",
                      "plain", "", "healthz", "files", "a.txt"]


@pytest.fixture(scope="module")
def capturing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoP]:
    """A PoP whose functions have routes with captures (one beside a literal and a
    longer one of its own), each a mirror of what its guest is given."""
    root = tmp_path_factory.mktemp("lane_capturing")
    pop = pop_with(root)
    for name, routes in CAPTURING.items():
        deploy(pop, function_dir(root / "fns", name, MIRROR, routes=routes))
    yield pop
    pop.close()


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(segments=st.lists(st.sampled_from(CAPTURING_SEGMENTS), min_size=1, max_size=5),
       method=st.sampled_from([b"GET", b"POST"]))
@example(segments=["users", "7", "posts"], method=b"GET")
@example(segments=["users", "7", "posts", "x"], method=b"GET")
@example(segments=["users", "me", "posts"], method=b"GET")
@example(segments=["users", "me", "x"], method=b"GET")
@example(segments=["users", "7", "x"], method=b"POST")
@example(segments=["orgs", "acme", "repos", "r1", "x"], method=b"GET")
@example(segments=["orgs", "acme", "repos", ""], method=b"GET")
@example(segments=["files"], method=b"GET")
@example(segments=["files", ""], method=b"GET")
@example(segments=["files", "x", "", "a.txt"], method=b"POST")
@example(segments=["users", "7", "files", "x", "a.txt"], method=b"GET")
@example(segments=["users", "me", "files"], method=b"GET")
def test_a_route_with_captures_serves_on_the_lane_what_the_router_gives_it(
        capturing: PoP, segments: list[str], method: bytes) -> None:
    """A route with captures (``/users/:id``) or a final wildcard (``/files/*``,
    ``/users/:id/files/*``: the rest of the path as ``*``) was always Python's. Now the
    C matches it as the Router's regex does and encodes its params, but leaves what a
    route that outranks it takes (``/users/me``, ``/users/:id/posts``): the lane
    answers a path as the chain does (the mirror's body is the guest's request, params
    included), with the chain's event (its route), and every path the router gives
    such a route is the lane's."""
    path = "/" + "/".join(segments)
    lane = lane_answer(capturing, path, method=method)
    ctx = Context("127.0.0.1:1")
    python = chain_answer(capturing, path, method=method, ctx=ctx)
    if lane is not None:
        event = fields(capturing, 2)
        assert same(lane, python, method) and event[0] == event[1], path
    if ctx.route is not None and (":" in ctx.route or "*" in ctx.route):
        assert lane is not None, path
        assert all(v.encode() in lane for v in ctx.params.values())


def test_a_route_deployed_under_a_prefix_takes_its_paths_from_the_lane_at_once(
        tmp_path: Path) -> None:
    """``/shop`` serves ``/shop/cart`` on the lane until another function deploys
    ``/shop/cart``: from the next read on, that path and those under it are the new
    function's (on the lane: its literal route), the rest under ``/shop`` still
    ``/shop``'s."""
    pop = pop_with(tmp_path)
    try:
        deploy(pop, function_dir(tmp_path / "fns", "shop", OK, routes=["/shop"]))
        served = lane_answer(pop, "/shop/cart/1")
        assert served is not None and b"x-edgefn-function: shop@" in served
        cart = static_reactor(200, [], b"cart")
        deploy(pop, function_dir(tmp_path / "fns", "cart", cart, routes=["/shop/cart"]))
        for path in ("/shop/cart", "/shop/cart/1"):
            served = lane_answer(pop, path)
            assert served is not None and served.endswith(b"\r\n\r\ncart"), path
            assert same(served, chain_answer(pop, path))
        for path in ("/shop/x", "/shop/cartx", "/shop/x/cart"):
            served = lane_answer(pop, path)
            assert served is not None and served.endswith(b"\r\n\r\nok"), path
            assert same(served, chain_answer(pop, path))
    finally:
        pop.close()


def test_a_bearer_token_is_pythons_where_a_jwt_may_prove_someone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``[auth.jwt]`` a bearer token that is no edgefn key proves no one (auth
    in mode ``none`` ignores it): the lane serves it as the chain answers it. With
    one, the token may prove a principal (the function's principal section, its
    limits): Python's, where a valid token sets it."""
    import jwt as pyjwt

    monkeypatch.setenv("EDGEFN_LANE_JWT", "lane-test-secret-" + "s" * 32)
    token = pyjwt.encode({"tenant": "acme", "sub": "u", "scope": "fn:*",
                          "exp": int(__import__("time").time()) + 600},
                         "lane-test-secret-" + "s" * 32, algorithm="HS256")
    bearer = [(b"authorization", b"Bearer " + token.encode())]
    for jwt_on in (False, True):
        root = tmp_path / str(jwt_on)
        extra = {"auth.jwt": {"secret_env": "EDGEFN_LANE_JWT", "algorithms": ["HS256"]}} \
            if jwt_on else {}
        pop = pop_with(root, **extra)
        try:
            deploy(pop, function_dir(root / "fns", "plain", OK, routes=["/plain"]))
            lane = served(pop, "/plain", bearer)
            if jwt_on:
                assert lane is None
                ctx = Context("127.0.0.1:1")
                assert chain_answer(pop, "/plain", extra=bearer, ctx=ctx).status == 200
                assert ctx.principal is not None and ctx.principal.tenant == "acme"
            else:
                assert same(lane, chain_answer(pop, "/plain", extra=bearer))
                event = fields(pop, 2)
                assert event[0] == event[1]
        finally:
            pop.close()


@pytest.mark.parametrize("route", ["/cors", "/", "/cors/*"])
def test_under_a_prefix_route_cors_still_sees_every_request_it_acts_on(tmp_path: Path,
                                                                        route: str) -> None:
    """A route the lane serves as a prefix (``/cors``; ``/``; a wildcard's, ``/cors/*``)
    whose paths reach into a cors `paths` entry (``/cors/``): a request with an Origin
    under it is Python's, where cors tags it; one without is the lane's."""
    pop = pop_with(tmp_path, pipeline=with_cors())
    try:
        deploy(pop, function_dir(tmp_path / "fns", "top", OK, routes=[route]))
        origin = (b"origin", b"https://app.example")

        def lane(path: str, headers: list[tuple[bytes, bytes]]) -> bytes | None:
            return served(pop, path, [(b"user-agent", CURL), *headers])

        assert same(lane("/cors/y", []), chain_answer(pop, "/cors/y", CURL))
        assert lane("/cors/y", [origin]) is None
        python = chain_answer(pop, "/cors/y", CURL, extra=[origin])
        assert header(python, b"access-control-allow-origin") == b"https://app.example"
    finally:
        pop.close()


def test_under_load_the_lanes_records_are_drained_at_most_every_drain_every(
        pop: PoP, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone request's record is drained as its loop turn ends; the next one's,
    within DRAIN_EVERY of that drain, once DRAIN_EVERY is past (one pass for a
    millisecond's requests), or at once when the observers are read (a flush). The
    stamp is checked once a turn, delayed drain or not."""
    from runtime.pipeline import lane as lane_module

    monkeypatch.setattr(lane_module, "DRAIN_EVERY", 0.2)  # wide: a busy CI's turns fit in it
    lane = pop.lane
    assert lane is not None and lane.stamp is not None
    stamp, checks = lane.stamp, [0]

    def counted() -> object:
        checks[0] += 1
        return stamp()

    monkeypatch.setattr(lane, "stamp", counted)

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def one() -> None:
            data = raw("/plain", CURL)
            assert lane.serve(data, "127.0.0.1:1", b"date: D\r\n", b"", 1 << 20)[0] == len(data)

        lane.drained = loop.time() - 1.0  # the last drain long ago
        served = lane.served
        one()
        one()  # the same turn: the stamp is not checked again
        assert checks[0] == 1
        await asyncio.sleep(0)
        assert lane.served == served + 2 and not lane.scheduled  # drained at the turn's end
        one()  # within DRAIN_EVERY of that drain: waits for it
        started = loop.time()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert lane.served == served + 2 and lane.scheduled and checks[0] == 2
        one()  # a later turn before the drain: the stamp checked again
        assert checks[0] == 3
        one()  # and not again in that turn (it was, for every read, until the drain)
        assert checks[0] == 3
        await asyncio.sleep(0)
        one()  # nor in the next one, but once
        one()
        assert checks[0] == 4
        while lane.served < served + 7 and loop.time() - started < 5:
            await asyncio.sleep(0.01)
        assert lane.served == served + 7 and 0.15 <= loop.time() - started < 1.0
        one()
        pop.observers.flush()  # what reads the observers drains the lane first
        assert lane.served == served + 8 and not lane.scheduled

    asyncio.run(main())


@pytest.mark.parametrize("trust", [True, False])
def test_a_callers_request_id_is_kept_or_replaced_on_the_lane_as_request_id_does(
        tmp_path: Path, trust: bool) -> None:
    """A request that sends its own id (a proxy's: Envoy sets one on every request)
    was Python's. Now the lane serves it as the ``request_id`` stage does: a
    well-formed id is kept when ``trust_incoming`` is on (the counter does not move),
    anything else, or any id when it is off, gets the counter's next number; the
    first of two copies is the one read; the name is the stage's ``header``."""
    names = [type(s).__struct_config__.tag for s in c.default_pipeline()]  # type: ignore[attr-defined]
    stages = [{"stage": n} for n in names]
    stages[names.index("request_id")] = {"stage": "request_id", "header": "X-Trace-Ref",
                                         "trust_incoming": trust}
    pop = pop_with(tmp_path, pipeline=stages)
    try:
        deploy(pop, function_dir(tmp_path / "fns", "plain", OK, routes=["/plain"]))
        lane = pop.lane
        assert lane is not None
        prefix = lane.request_id.prefix

        def both(ids: list[bytes]) -> tuple[bytes, bytes]:
            """The id the lane answered with, and the one the chain did."""
            data = b"GET /plain HTTP/1.1\r\nHost: x\r\n%s\r\n" % b"".join(
                b"x-trace-ref: %s\r\n" % i for i in ids)
            before = lane.c.counter
            used, out, call = lane.serve(data, "127.0.0.1:1", b"date: D\r\n", b"", 1 << 20)
            assert used == len(data) and call is None, ids
            got = re.findall(rb"\r\nx-trace-ref: ([^\r]*)\r\n", out)
            assert len(got) == 1 and b"x-request-id" not in out
            python = chain_answer(pop, "/plain", extra=[(b"x-trace-ref", i) for i in ids])
            numbered = got[0] == b"%s-%x" % (prefix, before + 1)
            assert lane.c.counter == before + 2 * numbered  # and the chain's number
            assert same(out.replace(got[0], b"ID"),
                        Response(python.status, [(k, b"ID" if k == b"x-trace-ref" else v)
                                                 for k, v in python.headers], python.body))
            return got[0], header(python, b"x-trace-ref") or b""

        for ids in ([b"abc"], [b"Z.9:_-" * 21 + b"ab"], [b"first", b"second"]):
            lane_id, python_id = both(ids)
            if trust:
                assert lane_id == python_id == ids[0]
            else:
                assert lane_id.startswith(prefix + b"-") and python_id.startswith(prefix + b"-")
        for bad in ([b"a b"], [b"a" * 129], [b"warmup"], [b"a/b", b"ok"], [b""]):
            lane_id, python_id = both(bad)
            assert lane_id.startswith(prefix + b"-") and python_id.startswith(prefix + b"-")
    finally:
        pop.close()


def test_a_verdict_the_c_no_longer_has_is_pythons(tmp_path: Path) -> None:
    """The C's User-Agent cache names verdicts by index: were its verdict table ever
    given fewer, a cached index past it is asked again and, still past it, left to
    Python (never read past the table); with the table back, the lane serves it."""
    pop = pop_with(tmp_path)
    try:
        deploy(pop, function_dir(tmp_path / "fns", "plain", OK, routes=["/plain"]))
        lane = pop.lane
        assert lane is not None
        assert lane_answer(pop, "/plain", GPTBOT) is not None  # cached, a new verdict
        assert lane._classify(GPTBOT) == len(lane.verdicts) - 1 > 0
        lane.c.verdicts(lane._classes()[:1])
        assert lane_answer(pop, "/plain", GPTBOT) is None
        assert chain_answer(pop, "/plain", GPTBOT).status == 200
        lane.c.verdicts(lane._classes())
        assert same(lane_answer(pop, "/plain", GPTBOT), chain_answer(pop, "/plain", GPTBOT))
    finally:
        pop.close()


def test_a_route_table_the_c_cannot_take_is_refused_with_why(rooted: PoP) -> None:
    """`Lane.routes` refuses what Python never builds (exclusions not a tuple of (bytes,
    kind) with a kind it knows; a pattern route with an empty segment, a `*` not last,
    or no segment; a guard that is no refusal, or on a limited route), as `Lane.blocks`
    a block that is no refusal, with a ValueError
    saying what it takes, and keeps only the valid routes before it: a rebuild serves
    again."""
    lane = rooted.lane
    assert lane is not None
    fn = rooted.registry.functions["root"]
    entry = lane._entry(fn, "/", "/", lane.allowed(fn), lane._cache_mode(fn), ())
    for excluded in ((("/plain", 1),), ((b"/plain", 99),), [(b"/plain", 1)]):
        with pytest.raises(ValueError, match="exclusions"):
            lane.c.routes([(*entry[:18], excluded)])
    bad = list(entry)
    # an empty segment, a `*` not last (twice), no segment
    for path in (b"/a//:id", b"/a/*/b", b"/*/*", b"/"):
        bad[0], bad[12] = path, 4  # ROUTE_PATTERN
        with pytest.raises(ValueError, match="pattern route"):
            lane.c.routes([tuple(bad)])
    # a guard (auth's refusal) not a refusal, or on a route the lane calls or counts
    refusal = (401, b"", b"", ({}, "unauthorized"))
    for guard, origin in (((401, b""), 0), (refusal, 8)):  # 8: ROUTE_LIMITED
        bad = [*entry[:19], 0, guard]
        bad[12] = origin
        with pytest.raises(ValueError, match="a guard"):
            lane.c.routes([tuple(bad)])
    with pytest.raises(ValueError, match="a verdict's block"):  # bots' 403s by verdict
        lane.c.blocks(((403, b""),))
    with pytest.raises(TypeError, match="blocks"):
        lane.c.blocks([None])
    lane.c.blocks(tuple(lane.blocks))
    lane._rebuild()
    assert same(lane_answer(rooted, "/x/y"), chain_answer(rooted, "/x/y"))


def test_with_the_fields_off_the_lane_writes_none_and_still_counts(tmp_path: Path) -> None:
    """``[ratelimit] headers = false``: a limited function's lane answer carries no
    RateLimit field, as the chain's does not, and the lane still counts: past the
    limit it refuses, with the chain's 429 (a Retry-After, no field)."""
    pop = pop_with(tmp_path, **{"ratelimit.headers": False})
    try:
        deploy(pop, function_dir(tmp_path / "fns", "limited", OK, routes=["/limited"],
                                 extra='[[rate_limits]]\nby = "ip"\nlimit = "2/minute"\n'))
        lane = lane_answer(pop, "/limited")
        assert lane is not None and b"ratelimit" not in lane.lower()
        assert header(chain_answer(pop, "/limited"), b"ratelimit") is None
        third = lane_answer(pop, "/limited")  # refused: the lane's 429
        python = chain_answer(pop, "/limited")
        assert third is not None and third.startswith(b"HTTP/1.1 429 ")
        assert python.status == 429 and header(python, b"ratelimit") is None

        def waited(raw: bytes) -> bytes:  # (the seconds to the reset, a moment apart: as
            # many Ns, the length kept)
            return re.sub(rb"(?<=retry-after: )\d+|(?<=retry after )\d+",
                          lambda m: b"N" * len(m[0]), raw)

        headers = [(k, waited(b"retry-after: " + v)[13:] if k == b"retry-after" else v)
                   for k, v in python.headers]
        assert same(waited(third), Response(python.status, headers, waited(python.body)))
        assert b"\r\nretry-after: " in third and b"ratelimit" not in third.lower()
    finally:
        pop.close()


def test_ratelimit_before_bots_leaves_its_refusals_to_python(tmp_path: Path) -> None:
    """The lane writes ratelimit's 429 only where the stages after it are those a
    refused request never reaches (http_cache, dispatch): in the default order it
    does; with ``ratelimit`` before ``bots`` (which then never records a refused
    request's class) the refusal is Python's, counted once, and its event has no bots
    record; the admitted requests are still the lane's. Bots' 403 likewise: the lane's
    where no ratelimit comes before bots, else Python's (ratelimit counts it first).
    With http_cache before both (it marks and counts what passes it back), both are
    Python's."""
    names = [type(s).__struct_config__.tag for s in c.default_pipeline()]  # type: ignore[attr-defined]
    names.remove("ratelimit")
    early = [{"stage": n} for n in names[:names.index("bots")]] + [{"stage": "ratelimit"}] + \
        [{"stage": n} for n in names[names.index("bots"):]]
    # the default order but http_cache first of all (it marks and counts what passes it)
    cache_first = [{"stage": "http_cache"}] + [
        {"stage": type(s).__struct_config__.tag} for s in c.default_pipeline()  # type: ignore[attr-defined]
        if type(s).__struct_config__.tag != "http_cache"]  # type: ignore[attr-defined]
    limited = '[[rate_limits]]\nby = "ip"\nlimit = "1/minute"\n'
    orders = ((None, True), (early, False), (cache_first, False))
    for i, (pipeline, refuses) in enumerate(orders):
        counted_first = pipeline is early  # ratelimit before bots: it counts a blocked one
        root = tmp_path / str(i)
        pop = pop_with(root, **({"pipeline": pipeline} if pipeline else {}))
        try:
            deploy(pop, function_dir(root / "fns", "one", OK, extra=limited))
            deploy(pop, function_dir(root / "fns", "guarded", OK, extra=limited +
                                     '[bots]\nautomation = "block"\n'))
            lane = pop.lane
            assert lane is not None
            # bots' 403: the lane's where ratelimit comes after bots (it counts nothing);
            # before it, ratelimit counts it first: Python's
            blocked = lane_answer(pop, "/guarded", CURL)
            if refuses:
                assert blocked is not None and blocked.startswith(b"HTTP/1.1 403 ")
                assert same(blocked, chain_answer(pop, "/guarded", CURL))
            else:
                assert blocked is None
                ctx = Context("127.0.0.1:1")
                assert chain_answer(pop, "/guarded", CURL, ctx=ctx).status == 403
                assert ("ratelimit" in ctx.decisions) is counted_first
            assert lane_answer(pop, "/one", CURL) is not None  # admitted: the lane's
            assert bool(lane.refusing) is refuses
            answer = lane_answer(pop, "/one", CURL)
            if refuses:
                assert answer is not None and answer.startswith(b"HTTP/1.1 429 ")
                continue
            assert answer is None
            ctx = Context("127.0.0.1:1")
            python = chain_answer(pop, "/one", CURL, ctx=ctx)
            assert python.status == 429 and ("bots" not in ctx.decisions) is counted_first
            assert ctx.decisions["ratelimit"] == {"limited": "fn-ip"}
        finally:
            pop.close()


def test_a_guarded_functions_401_is_the_lanes_counted_where_ratelimit_counts_it(
        tmp_path: Path) -> None:
    """Auth's 401 to a request without a credential is the lane's (`_guard`), the
    chain's bytes; where a PoP rule by ip counts auth's refusals (`on_refused`: a
    credential-guessing flood meets its 429) the lane asks the stage, which counts it
    (`_guard_refusal`): the lane's and the chain's requests share the count, and past
    the limit both answer the 429 (auth's record and ratelimit's)."""
    for rules in ([], [{"by": "ip", "limit": "4/minute"}]):
        root = tmp_path / str(len(rules))
        pop = pop_with(root, **{"ratelimit.rules": rules})
        try:
            deploy(pop, function_dir(root / "fns", "keyed", OK, extra='auth = "key"\n'))
            for n in range(3):  # lane, chain, lane, chain, ...: 6 with a rule of 4
                answer = lane_answer(pop, "/keyed", FIREFOX)
                ctx = Context("127.0.0.1:1")
                python = chain_answer(pop, "/keyed", FIREFOX, ctx=ctx)
                assert answer is not None
                assert ctx.decisions["auth"] == {"mode": "key", "result": "unauthorized"}
                if not rules or n < 2:
                    assert python.status == 401 and same(answer, python)
                    assert "ratelimit" not in ctx.decisions
                    continue
                assert answer.startswith(b"HTTP/1.1 429 ") and python.status == 429
                assert ctx.decisions["ratelimit"] == {"limited": "by-ip"}
        finally:
            pop.close()
