"""The bots stage without sockets: a Request built by hand, the stage called with
a Context, a real router behind `Targets`."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgefn_core.errors import InvalidConfig, Rejected
from runtime.net.message import Response
from runtime.pipeline.chain import Chain
from runtime.security.bots import pow
from runtime.security.ratelimit import native
from runtime.security.settings import BotOverride, BotPolicy, BotSettings
from tests.security.bots_helpers import (
    BROWSER_HEADERS,
    CHROME,
    directory,
    ok,
    request,
    run,
    signed,
    stage,
)

AGENT = "https://agent.example"
KEY = Ed25519PrivateKey.generate()
CURL = {"user-agent": "curl/8.5.0"}


def settings(**policy: str) -> BotSettings:
    return BotSettings(policy=BotPolicy(**policy), pow_difficulty=8)  # type: ignore[arg-type]


def refused(bots: object, req: object) -> Rejected:
    with pytest.raises(Rejected) as info:
        run(bots, req)  # type: ignore[arg-type]
    return info.value


def test_a_browser_passes_and_its_class_is_recorded() -> None:
    response, ctx = run(stage(), request("/fn", {"user-agent": CHROME, **BROWSER_HEADERS}))
    assert response.body == b"passed"
    assert (ctx.bot, ctx.agent) == ("browser", None)
    assert ctx.decisions == {"bots": {"class": "browser", "agent": None, "signals": (),
                                      "action": "allow"}}


def test_a_verified_agent_is_recorded_with_its_identity() -> None:
    response, ctx = run(stage(keys=directory((KEY, AGENT))), signed(KEY, agent=AGENT))
    assert response.body == b"passed"
    assert (ctx.bot, ctx.agent) == ("verified_agent", AGENT)
    assert ctx.decisions and ctx.decisions["bots"]["signals"] == ("web_bot_auth",)


def test_a_forged_signature_is_abusive_and_blocked_by_default() -> None:
    forged = signed(Ed25519PrivateKey.generate(), agent=AGENT)
    bots = stage(keys=directory((KEY, AGENT)))
    keyid = dict(signed(KEY).headers)[b"signature-input"].split(b'keyid="')[1][:43]
    forged.headers = [(k, v.replace(v.split(b'keyid="')[1][:43], keyid)
                       if k == b"signature-input" else v) for k, v in forged.headers]
    err = refused(bots, forged)
    assert (err.code, err.status) == ("bot_blocked", 403)
    assert "abusive" in str(err) and "Web Bot Auth" in str(err)
    assert err.detail == {"class": "abusive", "signals": ["bad_signature"]}


def test_a_replayed_signature_is_abusive() -> None:
    bots = stage(keys=directory((KEY, AGENT)))
    req = signed(KEY, agent=AGENT)
    run(bots, req)
    err = refused(bots, req)
    assert err.detail == {"class": "abusive", "signals": ["replayed_signature"]}


def test_an_expired_signature_is_abusive_unless_the_policy_allows_it() -> None:
    import time

    old = signed(KEY, agent=AGENT, created=time.time() - 120, expires_in=60)
    err = refused(stage(keys=directory((KEY, AGENT))), old)
    assert err.code == "bot_blocked" and "expires" in str(err)
    response, ctx = run(stage(settings(abusive="allow"), keys=directory((KEY, AGENT))), old)
    assert response.body == b"passed" and (ctx.bot, ctx.agent) == ("abusive", None)
    assert ctx.decisions and "expires" in ctx.decisions["bots"]["reason"]


@pytest.mark.parametrize("headers", [
    {"signature-input": "sig1=(", "signature": "sig1=:AAAA:"},
    {"signature-input": 'sig1=("@authority");keyid="x";tag="web-bot-auth"'},
    {"signature-input": 'sig1=("@authority");created=1;keyid="x";tag="web-bot-auth"',
     "signature": "sig1=:AAAA:", "signature-agent": "(("},
    {"signature-input": "\xff" * 100, "signature": "\x00"},
])
def test_malformed_signature_headers_get_a_clear_403_through_the_chain(
        headers: dict[str, str]) -> None:
    chain = Chain([stage(keys=directory((KEY, AGENT))), _Answer()])
    response = chain(request("/fn", {**CURL, **headers}))
    assert isinstance(response, Response)
    assert response.status == 403
    assert b'"kind":"bot_blocked"' in bytes(response.body)  # type: ignore[arg-type]


def test_signatures_of_other_protocols_are_not_web_bot_auth() -> None:
    bots = stage(keys=directory((KEY, AGENT)))
    # a draft-cavage Signature (ActivityPub servers send one) has no Signature-Input
    cavage = {**CURL, "signature": 'keyId="https://a.example/actor#main-key",'
                                   'headers="(request-target) host date",signature="AAAA"'}
    _, ctx = run(bots, request("/fn", cavage))
    assert ctx.decisions and ctx.decisions["bots"]["signals"] == ("ua:curl",)
    # an RFC 9421 signature without the web-bot-auth tag (a webhook's) is someone else's
    webhook = {**CURL, "signature-input": 'hook=("@method");created=1;keyid="k"',
               "signature": "hook=:AAAA:"}
    response, ctx = run(bots, request("/fn", webhook))
    assert response.body == b"passed" and ctx.bot == "automation"
    assert ctx.decisions and ctx.decisions["bots"]["signals"] == ("ua:curl", "not_web_bot_auth")


def test_without_a_directory_a_signature_proves_nothing() -> None:
    _, ctx = run(stage(), signed(KEY, extra=CURL))
    assert (ctx.bot, ctx.agent) == ("automation", None)
    assert ctx.decisions and ctx.decisions["bots"]["signals"] == ("ua:curl", "unknown_key")
    # and a key no trusted directory holds is not a forgery either
    _, ctx = run(stage(keys=directory((KEY, AGENT))), signed(Ed25519PrivateKey.generate(),
                                                             extra=CURL))
    assert ctx.bot == "automation"


def test_an_agent_rotating_addresses_is_limited_as_one_identity() -> None:
    s = BotSettings(policy=BotPolicy(verified_agent="limit", automation="limit"),
                    budgets={"verified_agent": "3/minute", "automation": "3/minute"})
    bots = stage(s, keys=directory((KEY, AGENT)))
    for i in range(3):
        run(bots, signed(KEY, agent=AGENT, client=f"203.0.113.{i}:1000"))
    err = refused(bots, signed(KEY, agent=AGENT, client="203.0.113.99:1000"))
    assert (err.code, err.status) == ("rate_limited", 429)
    assert AGENT in str(err)
    retry = int(dict(err.headers)[b"retry-after"])
    assert 1 <= retry <= 60
    # unsigned clients are counted per address: four addresses, one request each, pass
    for i in range(4):
        run(bots, request("/fn", CURL, client=f"203.0.113.{i}:1000"))
    for _ in range(2):
        run(bots, request("/fn", CURL, client="203.0.113.0:1000"))
    assert refused(bots, request("/fn", CURL, client="203.0.113.0:1000")).code == "rate_limited"


def test_a_class_without_its_own_budget_keeps_the_default_one() -> None:
    # budgets names only verified_agent: automation keeps its default, 30/minute
    s = BotSettings(policy=BotPolicy(automation="limit"), budgets={"verified_agent": "3/minute"})
    bots = stage(s)
    for _ in range(30):
        run(bots, request("/fn", CURL))
    err = refused(bots, request("/fn", CURL))
    assert err.code == "rate_limited" and "30 per 1 minute" in str(err)


def test_an_ipv6_client_counts_as_its_64() -> None:
    """Per address, a client stepped round a class budget with the 2**64 addresses
    of its own /64."""
    s = BotSettings(policy=BotPolicy(automation="limit"), budgets={"automation": "3/minute"})
    bots = stage(s)
    for i in range(3):
        run(bots, request("/fn", CURL, client=f"2001:db8:0:1::{i + 1}:1000"))
    err = refused(bots, request("/fn", CURL, client="2001:db8:0:1:ffff::9:1000"))
    assert err.code == "rate_limited"
    run(bots, request("/fn", CURL, client="2001:db8:0:2::1:1000"))  # the next /64 is not


def test_past_the_abusive_rate_a_client_is_abusive() -> None:
    bots = stage(BotSettings(abusive_rate="5/minute"), keys=directory((KEY, AGENT)))
    for _ in range(5):
        run(bots, request("/fn", CURL))
    err = refused(bots, request("/fn", CURL))
    assert err.detail == {"class": "abusive", "signals": ["ua:curl", "rate"]}
    run(bots, request("/fn", CURL, client="198.51.100.8:1"))  # another client is not
    # a verified agent's rate is its identity's, whatever its address
    for i in range(5):
        run(bots, signed(KEY, agent=AGENT, client=f"192.0.2.{i}:1"))
    err = refused(bots, signed(KEY, agent=AGENT, client="192.0.2.200:1"))
    assert err.detail == {"class": "abusive", "signals": ["web_bot_auth", "rate"]}


def test_workers_count_the_abusive_rate_together(tmp_path: Path) -> None:
    """``workers = N``: the PoP processes' bots stages count `abusive_rate` in their
    shared table (before, each let a client through at the whole rate)."""
    assert native.create_table(tmp_path / "table", 16)
    s = BotSettings(abusive_rate="5/minute", policy=BotPolicy(automation="limit"),
                    budgets={"automation": "100/minute"})
    workers = [stage(s, counters=native.counters(table=str(tmp_path / "table")))
               for _ in range(2)]
    for i in range(5):
        run(workers[i % 2], request("/fn", CURL))  # the 5 in the minute, PoP-wide
    err = refused(workers[1], request("/fn", CURL))
    assert err.detail == {"class": "abusive", "signals": ["ua:curl", "rate"]}
    alone = stage(s)
    for _ in range(5):
        run(alone, request("/fn", CURL))
    assert refused(alone, request("/fn", CURL)).detail["signals"] == ["ua:curl", "rate"]


def test_workers_count_a_class_budget_together(tmp_path: Path) -> None:
    """``workers = N``: a class budget counts PoP-wide in the workers' shared table
    (a sliding window there; one process's is a moving window): two workers taking
    a client's requests in turn refuse its 5th in the minute of a 4/minute budget
    (before, each worker let 4 through: 8), with a Retry-After within the minute."""
    assert native.create_table(tmp_path / "table", 16)
    s = BotSettings(policy=BotPolicy(automation="limit"), budgets={"automation": "4/minute"})
    workers = [stage(s, counters=native.counters(table=str(tmp_path / "table")))
               for _ in range(2)]
    for i in range(4):
        run(workers[i % 2], request("/fn", CURL))
    for worker in workers:
        err = refused(worker, request("/fn", CURL))
        assert (err.code, err.status) == ("rate_limited", 429)
        assert 1 <= int(dict(err.headers)[b"retry-after"]) <= 60
    alone = stage(s)  # one process: the moving window, exact
    assert alone.manager._budget_algorithm == "moving_window"
    for _ in range(4):
        run(alone, request("/fn", CURL))
    assert refused(alone, request("/fn", CURL)).code == "rate_limited"


def test_a_challenge_solved_passes_once() -> None:
    bots = stage(settings(automation="challenge"))
    err = refused(bots, request("/fn", CURL))
    assert (err.code, err.status) == ("challenge", 429)
    challenge = dict(err.headers)[b"x-edgefn-challenge"].decode()
    assert challenge.endswith("; difficulty=8") and err.detail["challenge"] == challenge
    assert "x-edgefn-pow" in str(err.detail["instructions"])
    solution = pow.solve(challenge)
    response, ctx = run(bots, request("/fn", {**CURL, "x-edgefn-pow": solution}))
    assert response.body == b"passed" and ctx.bot == "automation"
    reused = refused(bots, request("/fn", {**CURL, "x-edgefn-pow": solution}))
    assert (reused.code, reused.detail["solution"]) == ("challenge", "reused")


def test_a_wrong_or_malformed_solution_gets_a_new_challenge() -> None:
    bots = stage(settings(automation="challenge"))
    challenge = dict(refused(bots, request("/fn", CURL)).headers)[b"x-edgefn-challenge"]
    nonce = challenge.split(b";")[0]
    wrong = next(nonce + b":%d" % n for n in range(1000)
                 if not pow.solves(nonce + b":%d" % n, 8))
    for value, why in ((wrong, "wrong"), (b"garbage", "malformed")):
        err = refused(bots, request("/fn", {**CURL, "x-edgefn-pow": value.decode()}))
        assert err.code == "challenge" and err.detail["solution"] == why
        assert dict(err.headers)[b"x-edgefn-challenge"] != challenge


def test_a_functions_bots_table_overrides_the_pops_policy() -> None:
    bots = stage(settings(automation="block"), fn=None,
                 open=BotOverride(automation="allow"), shut=BotOverride(browser="block"))
    assert refused(bots, request("/fn", CURL)).code == "bot_blocked"
    assert run(bots, request("/open", CURL))[0].body == b"passed"
    browser = {"user-agent": CHROME, **BROWSER_HEADERS}
    assert run(bots, request("/fn", browser))[0].body == b"passed"
    assert refused(bots, request("/shut", browser)).code == "bot_blocked"
    # a path no function serves gets the PoP's policy (route answers its 404 later)
    assert refused(bots, request("/nowhere", CURL)).code == "bot_blocked"


def test_declared_agents_can_be_blocked_with_a_clear_message() -> None:
    gptbot = {"user-agent": "Mozilla/5.0 (compatible; GPTBot/1.1; +https://openai.com/gptbot)"}
    err = refused(stage(settings(declared_agent="block")), request("/fn", gptbot))
    assert str(err) == "requests from declared_agent clients are blocked here"
    assert err.detail == {"class": "declared_agent", "signals": ["ua:GPTBot"]}


def test_a_key_directory_that_cannot_be_read_stops_the_stage_being_built(tmp_path) -> None:
    from runtime.pipeline.stages.bots import Bots

    missing = str(tmp_path / "no-such-jwks.json")
    with pytest.raises(InvalidConfig, match=r"no-such-jwks.json: field `bots.directories`: "
                                            r"cannot read the key directory"):
        Bots.from_settings(BotSettings(directories=[missing]), stage().targets)


def test_a_rate_that_cannot_be_parsed_names_its_field() -> None:
    with pytest.raises(InvalidConfig, match=r"field `bots.budgets.automation`"):
        stage(BotSettings(budgets={"automation": "lots please"}))
    with pytest.raises(InvalidConfig, match=r"field `bots.abusive_rate`"):
        stage(BotSettings(abusive_rate="fast"))


class _Answer:
    name = "answer"

    def __call__(self, req: object, ctx: object, call_next: object) -> Response:
        return ok(req, ctx)  # type: ignore[arg-type]
