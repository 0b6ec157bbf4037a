"""The WAF sees a request's bytes as they arrived: UTF-8 (or any byte >= 0x80) in
the request target and the headers reaches libmodsecurity unchanged, so CRS's
transformations (utf8toUnicode, urlDecodeUni) decode what the client sent.

Found replaying CRS 3.3.4's regression test 941110-8 (bench/bench_waf_crs.py):
a Cookie named ``<script>`` in full-width brackets was not detected, because each
byte had been widened to two on its way into the engine."""

from __future__ import annotations

import http.client
from pathlib import Path

import pytest

from runtime.net.message import Request
from runtime.security.settings import WafSettings
from runtime.security.waf.crs import Profile
from runtime.security.waf.engine import WafEngine
from tests.support import function_dir, pop_thread, reactor

# full-width < and > (U+FF1C, U+FF1E): CRS maps them to ASCII before matching
XSS = "\uff1cscript\uff1ealert(1)\uff1c/script\uff1e".encode()
CLIENT = "192.0.2.10:40000"


@pytest.fixture(scope="module")
def pl1() -> WafEngine:
    return WafEngine(Profile.of(WafSettings()))


def get(query: bytes = b"", extra: list[tuple[bytes, bytes]] | None = None) -> Request:
    headers = [(b"host", b"example.com"), (b"user-agent", b"curl/8.5.0"), (b"accept", b"*/*"),
               *(extra or [])]
    return Request(b"GET", b"/", query, headers, b"example.com", "1.1", True, CLIENT)


def test_utf8_in_a_cookie_name_is_matched_as_sent(pl1: WafEngine) -> None:
    verdict = pl1.inspect(get(extra=[(b"cookie", XSS + b"=value")]), CLIENT, 1024)
    assert 941110 in verdict.rules and verdict.blocked


def test_utf8_in_a_header_value_is_matched_as_sent(pl1: WafEngine) -> None:
    verdict = pl1.inspect(get(extra=[(b"referer", b"https://example.com/" + XSS)]), CLIENT, 1024)
    assert 941110 in verdict.rules and verdict.blocked


def test_utf8_in_the_query_is_matched_as_sent(pl1: WafEngine) -> None:
    verdict = pl1.inspect(get(b"q=" + XSS), CLIENT, 1024)
    assert 941110 in verdict.rules and verdict.blocked


def test_plain_utf8_text_passes(pl1: WafEngine) -> None:
    text = "東京の天気—café-crème".encode()  # no space: a request line has none
    verdict = pl1.inspect(get(b"q=" + text, [(b"x-name", text), (b"cookie", b"city=" + text)]),
                          CLIENT, 1024)
    assert (verdict.rules, verdict.score, verdict.blocked) == ([], 0, False)


def test_pop_blocks_a_utf8_cookie_attack_over_loopback(tmp_path: Path) -> None:
    with pop_thread(tmp_path / "data", **{"waf.mode": "block"}) as pop:
        pop.deploy(function_dir(tmp_path, "site", reactor(""), routes=["/"]))
        statuses = []
        for cookie in (XSS + b"=value", "city=東京".encode()):
            conn = http.client.HTTPConnection(pop.host, pop.port, timeout=10)
            conn.putrequest("GET", "/", skip_accept_encoding=True)
            conn.putheader("Cookie", cookie)
            conn.endheaders()
            response = conn.getresponse()
            statuses.append((response.status, response.getheader("x-edgefn-error")))
            conn.close()
    assert statuses == [(403, "waf_blocked"), (200, None)]
