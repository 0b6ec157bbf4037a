"""The bot manager end to end: a real PoP on loopback, real HTTP, a key directory
served over HTTP on another loopback port."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from runtime.security.bots import pow, webbotauth
from tests.security.bots_helpers import served_directory
from tests.support import EXAMPLES, Running, function_dir, pop_thread, reactor

KEY = Ed25519PrivateKey.generate()


def get(pop: Running, path: str, headers: dict[str, str] | None = None,
        source: str = "127.0.0.1") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(pop.host, pop.port, timeout=10,
                                      source_address=(source, 0))
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def signing(pop: Running, path: str, agent: str) -> dict[str, str]:
    return webbotauth.sign(KEY, "GET", f"http://{pop.host}:{pop.port}{path}",
                           signature_agent=agent)


def kind(body: bytes) -> Any:
    return json.loads(body)["error"]["kind"]


def test_a_signed_agent_is_verified_with_a_directory_fetched_over_http(tmp_path: Path) -> None:
    with (served_directory({"keys": [webbotauth.public_jwk(KEY)]}) as origin,
          pop_thread(tmp_path / "data", **{"bots.directories": [origin],
                                           "bots.policy.automation": "block"}) as pop):
        pop.deploy(EXAMPLES / "hello-wat")
        pop.deploy(function_dir(tmp_path, "open", reactor(""),
                                extra='[bots]\nautomation = "allow"'))
        status, headers, body = get(pop, "/hello")  # no User-Agent: automation
        assert (status, headers["x-edgefn-error"], kind(body)) == (403, "bot_blocked",
                                                                   "bot_blocked")
        signature = signing(pop, "/hello", origin)
        status, _, body = get(pop, "/hello", signature)
        assert (status, body) == (200, b"Hello from edgefn (WASM)!\n")
        status, _, body = get(pop, "/hello", signature)  # the same signature again
        assert status == 403 and b"already used" in body
        forged = {**signing(pop, "/hello", origin), "signature": "sig1=:" + "A" * 86 + "==:"}
        status, _, body = get(pop, "/hello", forged)
        assert status == 403 and kind(body) == "bot_blocked"
        for bad in ({"signature-input": "sig1=((", "signature": "x"},
                    {"signature-agent": "((", **signing(pop, "/hello", origin)}):
            status, _, body = get(pop, "/hello", bad)
            assert status == 403 and b"Web Bot Auth" in body
        assert get(pop, "/open")[0] == 200  # its [bots] allows automation


def test_an_agent_on_many_addresses_is_limited_as_one(tmp_path: Path) -> None:
    overrides = {"bots.policy.verified_agent": "limit",
                 "bots.budgets": {"verified_agent": "3/minute"}}
    with (served_directory({"keys": [webbotauth.public_jwk(KEY)]}) as origin,
          pop_thread(tmp_path / "data", **{"bots.directories": [origin], **overrides}) as pop):
        pop.deploy(EXAMPLES / "hello-wat")
        for n in (2, 3, 4):
            assert get(pop, "/hello", signing(pop, "/hello", origin), f"127.0.0.{n}")[0] == 200
        status, headers, body = get(pop, "/hello", signing(pop, "/hello", origin), "127.0.0.5")
        assert (status, kind(body)) == (429, "rate_limited")
        assert 1 <= int(headers["retry-after"]) <= 60


def test_a_challenged_crawler_passes_with_a_solution(tmp_path: Path) -> None:
    gptbot = {"user-agent": "Mozilla/5.0 (compatible; GPTBot/1.1; +https://openai.com/gptbot)"}
    with pop_thread(tmp_path / "data", **{"bots.policy.declared_agent": "challenge",
                                          "bots.pow_difficulty": 8}) as pop:
        pop.deploy(EXAMPLES / "hello-wat")
        status, headers, body = get(pop, "/hello", gptbot)
        assert (status, kind(body)) == (429, "challenge")
        challenge = headers["x-edgefn-challenge"]
        assert json.loads(body)["error"]["challenge"] == challenge
        solution = {**gptbot, "x-edgefn-pow": pow.solve(challenge)}
        assert get(pop, "/hello", solution)[0] == 200
        status, _, body = get(pop, "/hello", solution)
        assert status == 429 and json.loads(body)["error"]["solution"] == "reused"

