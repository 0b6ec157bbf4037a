"""The WAF through a real PoP over loopback: the PoP refuses exactly what
libmodsecurity + CRS, driven directly by this test, blocks."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import pytest

from edgefn_core.errors import InvalidConfig
from runtime import config
from runtime.pop import PoP
from runtime.security.settings import WafSettings
from runtime.security.waf import crs
from tests.security.waf_corpus import ATTACKS, CLEAN, Case
from tests.support import Running, function_dir, pop_thread, reactor


def send(pop: Running, case: Case) -> tuple[int, dict[str, str], bytes]:
    """`case` exactly as written: no header added by the client library."""
    conn = http.client.HTTPConnection(pop.host, pop.port, timeout=10)
    try:
        conn.putrequest(case.method, case.target, skip_host=True, skip_accept_encoding=True)
        for name, value in case.all_headers():
            conn.putheader(name, value.encode())
        conn.endheaders(case.body or None)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def direct_blocks(case: Case) -> bool:
    """The same request straight into libmodsecurity with CRS 3.3.4 at PL1: does
    CRS's blocking evaluation (949110) fire?"""
    from libmodsecurity import ModSecurity, RulesSet, Transaction

    if not hasattr(direct_blocks, "rules"):
        rules = RulesSet()
        for kind, value in crs.sources(crs.Profile.of(WafSettings())):
            assert (rules.load(value) if kind == "text" else rules.load_from_uri(value)) >= 0
        modsec = ModSecurity()
        modsec.set_log_callback(lambda line: None)
        direct_blocks.rules = (modsec, rules)  # type: ignore[attr-defined]
    modsec, rules = direct_blocks.rules  # type: ignore[attr-defined]
    t = Transaction(modsec, rules)
    t.process_connection("127.0.0.1", 40000, "127.0.0.1", 8080)
    t.process_uri(case.target, case.method, "1.1")
    for name, value in case.all_headers():
        t.add_request_header(name, value)
    t.process_request_headers()
    if case.body:
        t.append_request_body(case.body)
    t.process_request_body()
    return any(m.rule_id == crs.BLOCKING_RULE for m in t.get_rule_messages())


def catch_all(root: Path, extra: str = "", name: str = "site", route: str = "/") -> Path:
    return function_dir(root, name, reactor(""), routes=[route], extra=extra)


def waf_blocked(status: int, headers: dict[str, str]) -> bool:
    return status == 403 and headers.get("x-edgefn-error") == "waf_blocked"


def front_refuses(case: Case) -> bool:
    """The HTTP front's own 400, before any stage: an HTTP/1.1 request with no Host."""
    return dict(case.all_headers()).get("host") is None


def test_pop_agrees_with_the_engine_on_every_payload(tmp_path: Path) -> None:
    with pop_thread(tmp_path / "data", **{"waf.mode": "block"}) as pop:
        pop.deploy(catch_all(tmp_path))
        disagree = []
        blocked = 0
        for case in ATTACKS + CLEAN:
            status, headers, _ = send(pop, case)
            if front_refuses(case):
                assert status == 400, (case, status)
                continue
            through_pop = waf_blocked(status, headers)
            assert through_pop or status == 200, (case, status)
            blocked += through_pop
            if through_pop != direct_blocks(case):
                disagree.append(case)
        print(f"through the PoP: {blocked}/{len(ATTACKS) + len(CLEAN)} blocked, "
              f"{len(disagree)} disagreements with the engine")
        assert disagree == []
        assert blocked > 0.9 * len(ATTACKS)


def test_detect_serves_every_payload(tmp_path: Path) -> None:
    with pop_thread(tmp_path / "data", **{"waf.mode": "detect"}) as pop:
        pop.deploy(catch_all(tmp_path))
        statuses = {send(pop, case)[0] for case in ATTACKS if not front_refuses(case)}
        assert statuses == {200}


def test_blocked_answer_names_request_and_rules(tmp_path: Path) -> None:
    sqli = Case("942-sqli", "GET", "/search?q=1%27%20OR%20%271%27%3D%271")
    with pop_thread(tmp_path / "data", **{"waf.mode": "block"}) as pop:
        status, headers, body = send(pop, sqli)
    error = json.loads(body)["error"]
    assert (status, error["kind"], error["rules"]) == (403, "waf_blocked", [942100, 949110])
    assert error["request_id"] == headers["x-request-id"] and headers["x-request-id"]


def test_function_waf_over_a_pop_without_one(tmp_path: Path) -> None:
    sqli = "/search?q=1%27%20OR%20%271%27%3D%271"
    fn = catch_all(tmp_path, '[waf]\nmode = "block"\n', name="shop", route="/shop")
    with pop_thread(tmp_path / "data") as pop:
        pop.deploy(fn)
        pop.deploy(catch_all(tmp_path, name="plain", route="/plain"))
        assert pop.get("/shop" + sqli[7:])[0] == 403
        assert pop.get("/shop?q=running%20shoes")[0] == 200
        assert pop.get("/plain" + sqli[7:])[0] == 200  # its own setting: the PoP's off


def test_exclusion_in_a_manifest_stops_that_block(tmp_path: Path) -> None:
    fn = catch_all(tmp_path, '[waf]\nexclude_rules = [942100]\n', name="shop", route="/shop")
    with pop_thread(tmp_path / "data", **{"waf.mode": "block"}) as pop:
        pop.deploy(fn)
        assert pop.get("/shop?q=1%27%20OR%20%271%27%3D%271")[0] == 200
        assert pop.get("/other?q=1%27%20OR%20%271%27%3D%271")[0] == 403


def test_pop_refuses_block_without_rules(tmp_path: Path) -> None:
    """Building the PoP fails (through `running_pop` too, which holds the data
    dir's lock first: built directly here, as that lock is not let go on failure)."""
    cfg = config.load(None, data=str(tmp_path / "data"), **{
        "ai.enabled": False, "waf.mode": "block", "waf.crs_rules": str(tmp_path / "none")})
    with pytest.raises(InvalidConfig) as e:
        PoP(cfg)
    assert e.value.field == "waf.mode" and "modsecurity-crs" in str(e.value)
    assert str(tmp_path / "none") in str(e.value)


def test_body_past_max_body_bytes_is_not_inspected(tmp_path: Path) -> None:
    pad = b'{"note": "' + b"n" * 80 + b'", '
    attack = b'"q": "<script>alert(1)</script>"}'
    early = Case("json", "POST", "/api", {"content-type": "application/json"},
                 b'{' + attack[:-1] + b', "note": "' + b"n" * 80 + b'"}')
    late = Case("json", "POST", "/api", {"content-type": "application/json"}, pad + attack)
    with pop_thread(tmp_path / "data", **{"waf.mode": "block", "waf.max_body_bytes": 64}) as pop:
        pop.deploy(catch_all(tmp_path))
        assert send(pop, early)[0] == 403  # inside the first 64 bytes
        # starts at byte 92, past the limit; the JSON cut there does not count as unparsable
        assert send(pop, late)[0] == 200


def test_a_function_asking_to_block_is_refused_where_the_rules_are_missing(
        tmp_path: Path) -> None:
    from edgefn_core.errors import AdminError

    with pop_thread(tmp_path / "data", **{"waf.crs_rules": str(tmp_path / "no-rules")}) as pop:
        with pytest.raises(AdminError) as err:
            pop.deploy(catch_all(tmp_path, '[waf]\nmode = "block"\n', name="guarded"))
        assert err.value.code == "deploy_rejected" and 'mode = "block" needs the WAF' in str(
            err.value)
        assert "no-rules" in str(err.value)
        pop.deploy(catch_all(tmp_path, '[waf]\nmode = "detect"\n', name="watched"))
        assert pop.get("/")[0] == 200


def test_edgefn_serve_runs_the_waf_in_block_mode(tmp_path: Path) -> None:
    """The CLI's own process: libmodsecurity parses CRS after usearch is loaded
    (`runtime.cli.start` makes the system libstdc++ global first)."""
    import http.client

    from runtime.admin.client import AdminClient
    from tests.support import pop_process

    with pop_process(tmp_path, '[waf]\nmode = "block"\n') as proc:
        AdminClient(tmp_path / "data").deploy(catch_all(tmp_path))
        conn = http.client.HTTPConnection(proc.host, proc.port, timeout=10)
        conn.request("GET", "/?id=1%27%20OR%20%271%27=%271")
        blocked = conn.getresponse()
        blocked.read()
        conn.request("GET", "/?q=edge+functions")
        clean = conn.getresponse()
        clean.read()
        conn.close()
    assert (blocked.status, blocked.getheader("x-edgefn-error")) == (403, "waf_blocked")
    assert clean.status == 200
