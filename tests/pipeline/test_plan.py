"""Per-target plans (`runtime.pipeline.plan`): a request skips only the stages that
declare they do nothing for its target, answers and records exactly what the full
chain does, and a deploy, rollback or new key makes the plans again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jwt as pyjwt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.net.message import Request, Response
from runtime.pipeline.chain import Chain
from runtime.pipeline.plan import Planner
from runtime.pipeline.stage import Context, Next, Result, Target
from runtime.pipeline.targets import Targets
from runtime.security import keys as key_file
from runtime.security.keys import KeyStore
from tests.pipeline.plan_support import Pair

CLIENT = "127.0.0.1:40000"
JWT_ENV, JWT_SECRET = "EDGEFN_PLANS_TEST_JWT", "plans-test-secret-" + "s" * 32


def request(path: str = "/f0", method: str = "GET", query: str = "",
            headers: list[tuple[bytes, bytes]] | None = None, body: bytes = b"") -> Request:
    return Request(method.encode(), path.encode(), query.encode(),
                   [(b"host", b"127.0.0.1:8080"), *(headers or [])], b"127.0.0.1:8080", "1.1",
                   True, CLIENT)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture
def pair_of(tmp_path: Path, loop: asyncio.AbstractEventLoop) -> Iterator[Callable[..., Pair]]:
    made: list[Pair] = []

    def make(keys: bool = False, **overrides: Any) -> Pair:
        made.append(Pair(tmp_path / str(len(made)), keys, **overrides))
        return made[-1]

    yield make
    for pair in made:
        pair.close()


# -- the plans answer what the full chain does ---------------------------------------------

AUTH = st.sampled_from(["", 'auth = "none"', 'auth = "key"', 'auth = "jwt"'])
WAF = st.sampled_from(["", '[waf]\nmode = "off"', '[waf]\nmode = "detect"',
                       '[waf]\nmode = "block"', '[waf]\nmode = "block"\nparanoia = 2'])
BOTS = st.sampled_from(["", '[bots]\nautomation = "block"', '[bots]\ndeclared_agent = "challenge"',
                        '[bots]\nbrowser = "limit"'])
LIMITS = st.sampled_from(["", '[[rate_limits]]\nby = "ip"\nlimit = "3/minute"',
                          '[[rate_limits]]\nby = "key"\nlimit = "2/minute"'])
POLICY = st.tuples(AUTH, WAF, BOTS, LIMITS).map(lambda p: "\n".join(x for x in p if x))
PATHS = ["/f0", "/f0/x", "/f1", "/nope", "/v1/models", "/v1/chat/completions", "/healthz",
         "/readyz"]
AGENTS = [b"wrk", b"curl/8.5.0", b"python-requests/2.31", b"GPTBot/1.2", b"Googlebot/2.1",
          b"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 Chrome/120 Safari/537.36",
          b"sqlmap/1.7", b""]
QUERIES = ["", "a=1", "id=1%27%20OR%20%271%27=%271", "q=<script>alert(1)</script>"]


def credentials(keys: list[str]) -> st.SearchStrategy[list[tuple[bytes, bytes]]]:
    options: list[list[tuple[bytes, bytes]]] = [
        [], [(b"authorization", b"Basic Zm9vOmJhcg==")], [(b"authorization", b"Bearer")],
        [(b"authorization", b"Bearer efn_nothing_here")], [(b"x-api-key", b"junk")],
        [(b"authorization", b"Bearer eyJhbGciOiJIUzI1NiJ9.e30.x")]]
    for key in keys:  # API keys both ways; a JWT is only ever a bearer token
        options.append([(b"authorization", b"Bearer " + key.encode())])
        if key.startswith("efn_"):
            options.append([(b"x-api-key", key.encode())])
    return st.sampled_from(options)


@st.composite
def requests(draw: st.DrawFn, keys: list[str]) -> Callable[[], Request]:
    headers = list(draw(credentials(keys)))
    agent = draw(st.sampled_from(AGENTS))
    if agent:
        headers.append((b"user-agent", agent))
    if draw(st.booleans()):
        headers.append((b"accept", b"*/*"))
    extra = draw(st.sampled_from([[], [(b"cache-control", b"no-cache")],
                                  [(b"x-edgefn-tenant", b"t1:1700000000:abc")],
                                  [(b"range", b"bytes=0-1")]]))
    headers += extra
    path, method = draw(st.sampled_from(PATHS)), draw(st.sampled_from(["GET", "POST", "HEAD"]))
    query = draw(st.sampled_from(QUERIES))
    body = draw(st.sampled_from([b"", b"{}", b"id=1' OR '1'='1"])) if method == "POST" else b""
    return lambda: request(path, method, query, list(headers), body)


def jwts() -> list[str]:
    """HS256 tokens: signed with `JWT_SECRET` for every function and for f1 only; then
    an expired one, one signed with another secret and one with no tenant claim."""
    soon = int(time.time()) + 3600

    def token(secret: str = JWT_SECRET, **claims: Any) -> str:
        body = {"tenant": "acme", "sub": "user-7", "scope": "fn:*", "exp": soon, **claims}
        return pyjwt.encode({k: v for k, v in body.items() if v is not None}, secret,
                            algorithm="HS256")

    return [token(), token(scope="fn:f1", sub="user-8"), token(exp=int(time.time()) - 120),
            token("another-secret-" + "t" * 32), token(tenant=None)]


JWT = {"auth.jwt": {"secret_env": JWT_ENV, "algorithms": ["HS256"]}}


@pytest.mark.parametrize(("keys", "tokens", "overrides"), [
    (False, False, {}),
    (True, False, {"ratelimit.rules": [{"by": "ip", "limit": "40/minute"}],
                   "waf.mode": "detect"}),
    (False, False, {"auth.functions": "key",
                    "ratelimit.rules": [{"by": "key", "limit": "5/minute"}],
                    "http_cache.enabled": False}),
    (True, True, {**JWT, "ratelimit.rules": [{"by": "key", "limit": "6/minute"}]}),
    (False, True, {**JWT, "auth.functions": "jwt", "auth.openai": "jwt"}),
], ids=["defaults", "keys-rules-waf-detect", "key-mode-no-cache", "keys-and-jwts",
        "jwt-mode"])
def test_plans_answer_and_record_what_the_full_chain_does(
        pair_of: Callable[..., Pair], loop: asyncio.AbstractEventLoop,
        monkeypatch: pytest.MonkeyPatch, keys: bool, tokens: bool,
        overrides: dict[str, Any]) -> None:
    monkeypatch.setenv(JWT_ENV, JWT_SECRET)
    pair = pair_of(keys, **overrides)
    credentials_ = pair.keys + (jwts() if tokens else [])
    skipped: set[str] = set()

    @settings(max_examples=40, deadline=None, derandomize=False,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.tuples(POLICY, POLICY), st.lists(requests(credentials_), min_size=1, max_size=8))
    def check(policies: tuple[str, str], made: list[Callable[[], Request]]) -> None:
        for name, policy in zip(("f0", "f1"), policies, strict=True):
            loop.run_until_complete(pair.deploy(name, policy))
        planner = pair.planned.pipeline.planner
        assert planner is not None
        for fn in pair.planned.registry.functions.values():
            skipped.update(planner.skipped(fn))
        for make in made:
            planned, full = loop.run_until_complete(pair.both(make))
            assert planned == full

    check()
    assert skipped, "no stage was skipped for any target: the test compared nothing new"


# -- what invalidates a plan ---------------------------------------------------------------

def status(pair: Pair, loop: asyncio.AbstractEventLoop, r: Request) -> int:
    result = pair.planned.pipeline(r)
    response = result if isinstance(result, Response) else loop.run_until_complete(result)
    return response.status


def test_a_redeploy_that_asks_for_auth_is_refused_at_once(
        pair_of: Callable[..., Pair], loop: asyncio.AbstractEventLoop) -> None:
    pair = pair_of()
    loop.run_until_complete(pair.deploy("f0", ""))
    planner = pair.planned.pipeline.planner
    assert planner is not None
    assert status(pair, loop, request()) == 200
    assert "auth" in planner.skipped(pair.planned.registry.functions["f0"])
    loop.run_until_complete(pair.deploy("f0", 'auth = "key"'))
    assert status(pair, loop, request()) == 401
    loop.run_until_complete(pair.planned.registry.rollback("f0"))
    assert status(pair, loop, request()) == 200


def test_a_redeploy_that_asks_for_the_waf_blocks_at_once(
        pair_of: Callable[..., Pair], loop: asyncio.AbstractEventLoop) -> None:
    pair = pair_of()
    attack = request(query="q=<script>alert(1)</script>")
    loop.run_until_complete(pair.deploy("f0", ""))
    assert status(pair, loop, attack) == 200
    loop.run_until_complete(pair.deploy("f0", '[waf]\nmode = "block"'))
    assert status(pair, loop, attack) == 403


def test_a_jwt_names_the_caller_of_a_function_with_auth_none(
        pair_of: Callable[..., Pair], loop: asyncio.AbstractEventLoop,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With `[auth.jwt]` set, auth is not idle for an `auth = "none"` function even
    with no key made: a JWT there still names its caller, planned as in full."""
    monkeypatch.setenv(JWT_ENV, JWT_SECRET)
    pair = pair_of(**JWT, **{"auth.functions": "jwt"})
    loop.run_until_complete(pair.deploy("f0", 'auth = "none"'))
    token = jwts()[0].encode()
    planned, full = loop.run_until_complete(pair.both(
        lambda: request(headers=[(b"authorization", b"Bearer " + token)])))
    assert planned == full
    assert planned["principal"] == [None, "acme"] and planned["status"] == 200


def test_a_key_made_while_auth_was_skipped_is_read_and_limited(
        pair_of: Callable[..., Pair], loop: asyncio.AbstractEventLoop) -> None:
    pair = pair_of()
    loop.run_until_complete(pair.deploy("f0", ""))
    assert status(pair, loop, request()) == 200  # planned: no key, auth and ratelimit idle
    key = KeyStore(pair.root / "a").create("t1", ("*",), rpm=1)[0]
    pair.planned.keys.reload()  # as `edgefn keys create` asks the PoP to
    auth = [(b"authorization", b"Bearer " + key.encode())]
    assert status(pair, loop, request(headers=auth)) == 200
    assert status(pair, loop, request(headers=auth)) == 429  # the key's 1 rpm


def test_the_openai_api_asks_for_a_key_once_one_is_made_even_untold(
        pair_of: Callable[..., Pair], loop: asyncio.AbstractEventLoop,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``[auth] openai = "auto"``: open while no key exists (auth skipped), a key from
    then on, found by the key file's polling (nobody asks the PoP to reload)."""
    monkeypatch.setattr(key_file, "RELOAD_INTERVAL", 0.0)
    pair = pair_of()
    assert status(pair, loop, request("/v1/models")) == 404  # no model worker: API off
    KeyStore(pair.root / "a").create("t1", ("*",))
    assert status(pair, loop, request("/v1/models")) == 401


# -- which stages a plan skips -------------------------------------------------------------

class Passing:
    """Hands every request on; declares nothing unless told to."""

    def __init__(self, name: str, idle: Callable[[Target | None], bool] | None = None) -> None:
        self.name = name
        self.calls = 0
        if idle is not None:
            self.idle_for = idle

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        self.calls += 1
        return call_next(request, ctx)


class Answer:
    name = "answer"

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        return Response(204, [], b"")


def broken(target: Target | None) -> bool:
    raise RuntimeError("a declaration that fails")


def test_only_stages_that_declare_themselves_idle_are_skipped(
        pair_of: Callable[..., Pair]) -> None:
    pop = pair_of().planned
    before = Passing("before")
    idle, busy, failing = (Passing("idle", lambda t: True), Passing("busy", lambda t: False),
                           Passing("failing", broken))
    silent = Passing("silent")  # no declaration: never skipped, wherever it stands
    chain = Chain([before, idle, silent, busy, failing, Answer()], targets=Targets(pop.registry))
    assert isinstance(chain.planner, Planner)
    assert chain.planner.stages[0] is idle  # the first declaring stage's place
    for _ in range(3):
        response = chain(request("/nope"))
        assert isinstance(response, Response) and response.status == 204
    assert (before.calls, idle.calls, silent.calls, busy.calls, failing.calls) == (3, 0, 3, 3, 3)
    assert chain.planner.skipped(None) == ["idle"]


def test_a_timed_chain_runs_every_stage(pair_of: Callable[..., Pair]) -> None:
    pop = pair_of().planned
    idle = Passing("idle", lambda t: True)
    chain = Chain([idle, Answer()], timed=True, targets=Targets(pop.registry))
    ctx = Context(CLIENT)
    chain.run(request("/nope"), ctx)
    assert chain.planner is None and idle.calls == 1 and [n for n, _ in ctx.marks] == [
        "idle", "answer"]


def test_a_public_function_skips_waf_auth_ratelimit_openai_and_route(
        pair_of: Callable[..., Pair], loop: asyncio.AbstractEventLoop) -> None:
    pair = pair_of()
    loop.run_until_complete(pair.deploy("f0", ""))
    planner = pair.planned.pipeline.planner
    assert planner is not None
    assert planner.skipped(pair.planned.registry.functions["f0"]) == [
        "waf", "auth", "ratelimit", "openai", "route"]
