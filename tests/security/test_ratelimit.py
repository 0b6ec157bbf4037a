"""The ratelimit stage without sockets: a plain Request through a Chain of the
stage and a last stage that answers, with the memory storage."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgefn_core.errors import EdgefnError, InvalidConfig, ManifestError, Rejected
from runtime import config
from runtime.ai.openai_api import OpenAITarget
from runtime.functions import manifest
from runtime.functions.router import Router
from runtime.net.message import Request, Response, json_response
from runtime.pipeline.chain import Chain
from runtime.pipeline.stage import Context, Next, Result
from runtime.pipeline.stages.ratelimit import RateLimit
from runtime.pipeline.targets import Targets
from runtime.security.principal import Principal
from runtime.security.ratelimit import limiter as limiter_module
from runtime.security.ratelimit.limiter import compile_rules
from runtime.security.settings import (
    NO_POLICY,
    RateLimitSettings,
    RateRule,
    TargetPolicy,
    TenantLimits,
)

# draft-ietf-httpapi-ratelimit-headers-09: sf-lists of sf-strings with parameters
POLICY_ITEM = r'"[a-z0-9-]+";q=\d+;w=\d+'
STATE_ITEM = r'"[a-z0-9-]+";r=\d+;t=\d+'


class Function:
    """A deployed function as the stage sees it (`Target`)."""

    kind = "function"
    tenant = "acme"

    def __init__(self, name: str, policy: TargetPolicy = NO_POLICY) -> None:
        self.name, self.label, self.policy = name, f"{name}@v1", policy

    def error_response(self, err: EdgefnError) -> Response:
        return json_response({"function": self.name, "error": err.code}, err.status)

    def crashed(self, exc: Exception) -> EdgefnError:
        return EdgefnError(str(exc))


class Answer:
    name = "answer"

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        return Response(200, [], b"ok")


class SetContext:
    """Stands where auth and bots run: sets the principal and agent a test gives."""

    name = "who"

    def __init__(self, principal: Principal | None = None, agent: str | None = None) -> None:
        self.principal, self.agent = principal, agent

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        ctx.principal, ctx.agent = self.principal, self.agent
        return call_next(request, ctx)


FUNCTIONS = {b"/a": Function("a"), b"/b": Function("b"),
             b"/limited": Function("limited", TargetPolicy(rate_limits=[
                 RateRule("ip", "2/minute")])),
             b"/v1/chat/completions": OpenAITarget()}


def chain(settings: RateLimitSettings, principal: Principal | None = None,
          agent: str | None = None) -> tuple[Chain, RateLimit]:
    targets = Targets(SimpleNamespace(router=Router(), canaries={}), FUNCTIONS)  # type: ignore[arg-type]
    stage = RateLimit(settings, targets)
    return Chain([SetContext(principal, agent), stage, Answer()]), stage


@pytest.fixture
def closing() -> Iterator[list[RateLimit]]:
    stages: list[RateLimit] = []
    yield stages
    for s in stages:
        s.close()


def call(app: Chain, path: bytes = b"/a", ip: str = "10.0.0.1", body: bytes = b"",
         ) -> Response:
    request = Request(b"POST", path, b"", [], b"example.com", "1.1", True, f"{ip}:4000")
    request.body = body
    response = app(request)
    assert isinstance(response, Response), "the memory path must stay synchronous"
    return response


def header(response: Response, name: bytes) -> str | None:
    return next((v.decode() for k, v in response.headers if k == name), None)


def statuses(app: Chain, n: int, **kw: Any) -> list[int]:
    return [call(app, **kw).status for _ in range(n)]


def test_nothing_to_do_passes_the_response_through(closing: list[RateLimit]) -> None:
    _, stage = chain(RateLimitSettings())
    closing.append(stage)
    request = Request(b"GET", b"/a", b"", [], b"example.com", "1.1", True, "10.0.0.1:4000")
    ctx = Context(request.client)
    sentinel = Response(200, [], b"ok")
    assert stage(request, ctx, lambda r, c: sentinel) is sentinel
    assert ctx.decisions is None and sentinel.headers == []


@pytest.mark.parametrize("algorithm", ["moving_window", "sliding_window", "fixed_window"])
def test_an_ip_rule_admits_its_limit_then_429(algorithm: str, closing: list[RateLimit]
                                              ) -> None:
    app, stage = chain(RateLimitSettings(rules=[RateRule("ip", "3/minute", algorithm)]))  # type: ignore[arg-type]
    closing.append(stage)
    assert statuses(app, 4) == [200, 200, 200, 429]
    refused = call(app)
    body = msgspec.json.decode(refused.body)
    assert refused.status == 429 and body["error"]["kind"] == "rate_limited"
    assert body["error"]["policy"] == "by-ip"
    assert 1 <= int(header(refused, b"retry-after") or 0) <= 60
    assert header(refused, b"ratelimit-policy") == '"by-ip";q=3;w=60'
    assert re.fullmatch(r'"by-ip";r=0;t=\d+', header(refused, b"ratelimit") or "")
    assert call(app, ip="10.0.0.2").status == 200  # another client has its own window


@pytest.mark.parametrize("algorithm", ["moving_window", "sliding_window", "fixed_window"])
def test_admitted_responses_carry_the_headers_counting_down(algorithm: Any,
                                                            closing: list[RateLimit]) -> None:
    app, stage = chain(RateLimitSettings(rules=[RateRule("ip", "3/minute", algorithm),
                                                RateRule("ip", "100/hour", algorithm)]))
    closing.append(stage)
    seen = []
    for _ in range(3):
        r = call(app)
        policy, state = header(r, b"ratelimit-policy"), header(r, b"ratelimit")
        assert policy == '"by-ip";q=3;w=60, "by-ip-2";q=100;w=3600'
        assert state is not None and re.fullmatch(f"{STATE_ITEM}, {STATE_ITEM}", state)
        first = re.match(r'"by-ip";r=(\d+);t=(\d+)', state)
        assert first is not None and int(first[2]) <= 60
        seen.append(int(first[1]))
    assert seen == [2, 1, 0]


def test_headers_off_leaves_admitted_responses_alone(closing: list[RateLimit]) -> None:
    app, stage = chain(RateLimitSettings(rules=[RateRule("ip", "2/minute")], headers=False))
    closing.append(stage)
    assert call(app).headers == []
    call(app)
    refused = call(app)
    assert refused.status == 429 and header(refused, b"retry-after") is not None
    assert header(refused, b"ratelimit") is None


def test_ipv4_clients_aggregate_to_their_24(closing: list[RateLimit]) -> None:
    app, stage = chain(RateLimitSettings(ipv4_prefix=24, rules=[RateRule("ip", "2/minute")]))
    closing.append(stage)
    assert [call(app, ip=ip).status for ip in ("192.0.2.1", "192.0.2.200", "192.0.2.77")] \
        == [200, 200, 429]
    assert call(app, ip="192.0.3.1").status == 200  # the next /24 is another client


def test_ipv6_clients_aggregate_to_their_64(closing: list[RateLimit]) -> None:
    """By default: counted per address, a client stepped round its limit with the
    2**64 addresses of its own /64."""
    app, stage = chain(RateLimitSettings(rules=[RateRule("ip", "2/minute")]))
    closing.append(stage)
    assert [call(app, ip=ip).status for ip in ("2001:db8:0:1::1", "2001:db8:0:1:ffff::9",
                                               "2001:db8:0:1::abcd")] == [200, 200, 429]
    assert call(app, ip="2001:db8:0:2::1").status == 200


def test_without_aggregation_each_address_counts_alone(closing: list[RateLimit]) -> None:
    app, stage = chain(RateLimitSettings(ipv6_prefix=128, rules=[RateRule("ip", "1/minute")]))
    closing.append(stage)
    assert [call(app, ip=f"192.0.2.{i}").status for i in range(1, 5)] == [200] * 4
    assert [call(app, ip=f"2001:db8::{i}").status for i in range(1, 5)] == [200] * 4


def test_a_key_is_limited_by_its_rpm_and_a_tenant_by_its_own(closing: list[RateLimit]) -> None:
    settings = RateLimitSettings(tenants={"acme": TenantLimits(rpm=3)})
    one, s1 = chain(settings, Principal("key", "acme", key_id="k1", rpm=2))
    closing.append(s1)
    two = Chain([SetContext(Principal("key", "acme", key_id="k2")), s1, Answer()])
    assert statuses(one, 3) == [200, 200, 429]
    refused = call(one)
    assert header(refused, b"ratelimit-policy") == '"key-rpm";q=2;w=60'
    assert statuses(two, 2) == [200, 429]  # the tenant's 3 are spent (2 by k1)
    assert header(call(two), b"ratelimit-policy") == '"tenant-rpm";q=3;w=60'


def test_an_agent_is_limited_as_one_across_addresses(closing: list[RateLimit]) -> None:
    settings = RateLimitSettings(rules=[RateRule("agent", "2/minute")])
    app, stage = chain(settings, agent="crawler.example")
    closing.append(stage)
    assert [call(app, ip=f"198.51.100.{i}").status for i in range(3)] == [200, 200, 429]
    anonymous = Chain([SetContext(), stage, Answer()])
    assert statuses(anonymous, 4) == [200] * 4  # no verified agent: the rule does not apply


def test_function_rules_count_per_function(closing: list[RateLimit]) -> None:
    app, stage = chain(RateLimitSettings(rules=[RateRule("function", "2/minute")]))
    closing.append(stage)
    assert statuses(app, 3, path=b"/a") == [200, 200, 429]
    assert statuses(app, 2, path=b"/b") == [200, 200]
    refused = call(app, path=b"/a")
    assert msgspec.json.decode(refused.body)["error"]["kind"] == "rate_limited"
    assert call(app, path=b"/nothing-serves-this").status == 200  # no function: no count


def test_a_functions_own_rules_apply_to_it_only(closing: list[RateLimit]) -> None:
    app, stage = chain(RateLimitSettings())
    closing.append(stage)
    assert statuses(app, 3, path=b"/limited") == [200, 200, 429]
    assert header(call(app, path=b"/limited"), b"ratelimit-policy") == '"fn-ip";q=2;w=60'
    assert statuses(app, 3, path=b"/a") == [200] * 3


def test_model_rules_count_per_model_on_the_openai_api(closing: list[RateLimit]) -> None:
    app, stage = chain(RateLimitSettings(rules=[RateRule("model", "1/minute")]))
    closing.append(stage)
    path = b"/v1/chat/completions"
    assert call(app, path=path, body=b'{"model": "m1"}').status == 200
    refused = call(app, path=path, body=b'{"model": "m1", "messages": []}')
    err = msgspec.json.decode(refused.body)["error"]
    assert refused.status == 429 and err["type"] == "rate_limit_error"  # OpenAI's shape
    assert err["code"] == "rate_limited"
    assert call(app, path=path, body=b'{"model": "m2"}').status == 200
    # a body that is not JSON (or has no model) is the API's 400 to give: not counted
    assert [call(app, path=path, body=b).status for b in (b"{not json", b"{}", b"[1]")] \
        == [200] * 3


@pytest.mark.parametrize("rate", ["often", "lots/minute", "10/fortnight", "10/minute;", "",
                                  "0/minute", "10 per 0 seconds", "100/hour;0/minute"])
def test_a_bad_rate_in_pop_toml_is_refused_naming_the_rule(rate: str) -> None:
    rules = [{"by": "ip", "limit": "1/minute"}, {"by": "ip", "limit": rate}]
    with pytest.raises(InvalidConfig, match=r"ratelimit\.rules\[1\].*(not a rate like|>= 3)"):
        config.load(None, **{"ratelimit.rules": rules})


def test_a_bad_rate_in_edgefn_toml_refuses_the_deploy(tmp_path: Path) -> None:
    (tmp_path / "edgefn.toml").write_text(
        'name = "f"\nruntime = "wasm"\nentry = "main.wat"\nroutes = ["/f"]\n'
        '[[rate_limits]]\nby = "ip"\nlimit = "lots/minute"\n')
    (tmp_path / "main.wat").write_text("(module)")
    with pytest.raises(ManifestError, match=r"rate_limits\[0\].*'lots/minute' is not a rate"):
        manifest.load(tmp_path)


def test_rates_limits_reads_are_accepted() -> None:
    for rate in ("100/minute", "10 per 2 seconds", "1000/hour;50/minute", "5/Second"):
        assert compile_rules([RateRule("ip", rate)], "by", "t", "rules")


def test_a_storage_other_than_memory_or_redis_is_refused() -> None:
    targets = Targets(SimpleNamespace(router=Router(), canaries={}), {})  # type: ignore[arg-type]
    with pytest.raises(InvalidConfig, match=r"ratelimit\.storage.*'memcached://x'"):
        RateLimit(RateLimitSettings(storage="memcached://x"), targets)


def test_decisions_are_recorded(closing: list[RateLimit]) -> None:
    targets = Targets(SimpleNamespace(router=Router(), canaries={}), FUNCTIONS)  # type: ignore[arg-type]
    stage = RateLimit(RateLimitSettings(rules=[RateRule("ip", "1/minute")]), targets)
    closing.append(stage)
    request = Request(b"GET", b"/a", b"", [], b"h", "1.1", True, "10.9.9.9:1")
    first, second = Context(request.client), Context(request.client)
    stage(request, first, lambda r, c: Response(200, [], b""))
    with pytest.raises(Rejected):
        stage(request, second, lambda r, c: Response(200, [], b""))
    assert first.decisions == {"ratelimit": {"limited": None}}
    assert second.decisions == {"ratelimit": {"limited": "by-ip"}}


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.floats(0.001, 25.0), min_size=1, max_size=40),
       algorithm=st.sampled_from(["fixed_window", "sliding_window", "moving_window"]))
def test_the_lanes_refusals_are_the_stages_429s(steps: list[float], algorithm: Any) -> None:
    """What `lane_refusal` gives the native lane (rendered once per limit and the
    seconds its message and fields say, then kept) is, at every instant, the 429
    the stage's own path answers: two stages, the same rule, the same requests at the
    same clock (steps apart), one asked as the lane asks (`admits_all`, then `count`
    or `lane_refusal`), one called as a chain calls it."""
    clock = [1_796_000_000.25]
    fake = SimpleNamespace(time=lambda: clock[0])
    rules = [RateRule("ip", "3/minute", algorithm)]
    app, stage = chain(RateLimitSettings(rules=rules))
    _, lane_rl = chain(RateLimitSettings(rules=rules))
    prepared, hits = lane_rl.lane_checks([(r, ("pop", r.name), True) for r in lane_rl.rules],
                                         "10.0.0.1")
    counters = lane_rl.limiter.counters
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(limiter_module, "time", fake)
        try:
            for step in steps:
                clock[0] += step
                python = call(app)
                now = clock[0]
                if counters.admits_all(prepared, now):
                    counters.count(prepared, now, True)
                    assert python.status == 200
                    continue
                made = lane_rl.lane_refusal(hits, now)
                assert made is not None and python.status == 429
                status, head, body, name, code = made
                assert (status, body, name, code) == (429, python.body, "by-ip", "rate_limited")
                assert head == b"".join(b"%s: %s\r\n" % h for h in python.headers)
        finally:
            stage.close()
            lane_rl.close()
