"""Rate limits over real HTTP on loopback: one PoP in memory, and two PoPs that
share one real Redis server (together they admit exactly the limit)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runtime.security.keys import KeyStore
from tests.support import EXAMPLES, function_dir, pop_thread, reactor

from .redis_server import RedisServer, redis_server  # noqa: F401

RULE = [{"by": "ip", "limit": "5/minute"}]


def test_one_pop_limits_a_function_and_says_when_to_retry(tmp_path: Path) -> None:
    with pop_thread(tmp_path / "data", **{"ratelimit.rules": RULE}) as pop:
        pop.deploy(function_dir(tmp_path, "hello", reactor("")))
        answers = [pop.get("/hello") for _ in range(6)]
    assert [a[0] for a in answers] == [200] * 5 + [429]
    remaining = [re.fullmatch(r'"by-ip";r=(\d+);t=(\d+)', a[1]["ratelimit"]) for a in answers[:5]]
    assert [int(m[1]) for m in remaining if m] == [4, 3, 2, 1, 0]
    assert all(a[1]["ratelimit-policy"] == '"by-ip";q=5;w=60' for a in answers[:5])
    _, headers, body = answers[5]
    assert headers["ratelimit-policy"] == '"by-ip";q=5;w=60'
    assert 1 <= int(headers["retry-after"]) <= 60
    assert b'"kind":"rate_limited"' in body


def test_two_pops_sharing_redis_admit_the_limit_together(tmp_path: Path,
                                                         redis_server: RedisServer  # noqa: F811
                                                         ) -> None:
    shared = {"ratelimit.storage": redis_server.url, "ratelimit.rules": RULE}
    with pop_thread(tmp_path / "a", **shared) as a, pop_thread(tmp_path / "b", **shared) as b:
        # nothing serves /x: the limit applies before routing, so 404 means admitted
        statuses = [(a if i % 2 else b).get("/x")[0] for i in range(12)]
        after = a.get("/x")
    assert statuses.count(404) == 5 and statuses.count(429) == 7
    assert statuses[:5] == [404] * 5  # admitted first, by both PoPs in turn
    assert after[0] == 429 and after[1]["ratelimit-policy"] == '"by-ip";q=5;w=60'


def test_an_api_keys_rpm_limits_it_over_http(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    key, _ = KeyStore(tmp_path / "data").create("acme", ("*",), rpm=2)  # before the PoP reads
    other, _ = KeyStore(tmp_path / "data").create("acme", ("*",))
    with pop_thread(tmp_path / "data") as pop:
        pop.deploy(function_dir(tmp_path, "hello", reactor("")))
        bearer = {"authorization": f"Bearer {key}"}
        statuses = [pop.get("/hello", headers=bearer)[0] for _ in range(3)]
        refused = pop.get("/hello", headers={"x-api-key": key})
        anonymous = [pop.get("/hello")[0] for _ in range(3)]
        others = [pop.get("/hello", headers={"x-api-key": other})[0] for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert refused[0] == 429 and refused[1]["ratelimit-policy"] == '"key-rpm";q=2;w=60'
    assert anonymous == others == [200] * 3  # no key, or a key without an rpm: no limit


def storage_url(storage: str, request: pytest.FixtureRequest) -> str:
    """``memory://``, or the module's Redis emptied (its other tests counted this
    address there, under the same rule)."""
    if storage == "memory":
        return "memory://"
    server: RedisServer = request.getfixturevalue("redis_server")
    server.client().flushall()
    return server.url


@pytest.mark.parametrize("storage", ["memory", "redis"])
def test_requests_auth_refuses_count_against_the_per_ip_limits(
        tmp_path: Path, storage: str, request: pytest.FixtureRequest) -> None:
    """`auth` runs first: a flood of wrong keys got 401 after 401 and was never
    counted, so a per-IP limit did not slow credential guessing."""
    url = storage_url(storage, request)
    with pop_thread(tmp_path / "data", **{"ratelimit.storage": url, "ratelimit.rules": [
            {"by": "ip", "limit": "3/minute"}]}) as pop:
        pop.deploy(function_dir(tmp_path, "locked", reactor(""), extra='auth = "key"'))
        wrong = {"x-api-key": "efk_" + "x" * 40}
        got = [pop.request("GET", "/locked", headers=wrong)[0] for _ in range(5)]
        assert got == [401, 401, 401, 429, 429], got
        status, headers, _ = pop.request("GET", "/locked")  # no key at all: counted too
        assert status == 429 and int(headers["retry-after"]) >= 1


GPTBOT = {"user-agent": "Mozilla/5.0 (compatible; GPTBot/1.1; +https://openai.com/gptbot)"}
REFUSERS = {  # a stage before ratelimit, what it refuses, and its config
    "waf": ("/hello?q=<script>alert(1)</script>", {}, "waf_blocked", {"waf.mode": "block"}),
    "bots": ("/hello", GPTBOT, "bot_blocked", {"bots.policy.declared_agent": "block"}),
}


@pytest.mark.parametrize("storage", ["memory", "redis"])
@pytest.mark.parametrize("stage", sorted(REFUSERS))
def test_requests_the_waf_or_bots_refuse_count_against_the_per_ip_limits(
        tmp_path: Path, storage: str, stage: str, request: pytest.FixtureRequest) -> None:
    """As auth's: attack payloads (each a WAF inspection) and a blocked crawler got 403
    after 403, never counted."""
    url = storage_url(storage, request)
    path, headers, code, config = REFUSERS[stage]
    with pop_thread(tmp_path / "data", **{"ratelimit.storage": url, "ratelimit.rules": [
            {"by": "ip", "limit": "3/minute"}], **config}) as pop:
        pop.deploy(EXAMPLES / "hello-wat")
        got = [pop.request("GET", path, headers=headers) for _ in range(5)]
        assert [g[0] for g in got] == [403, 403, 403, 429, 429], got
        assert got[0][1]["x-edgefn-error"] == code
        status, headers, _ = pop.request("GET", "/hello")  # a clean one: the same address
        assert status == 429 and int(headers["retry-after"]) >= 1
