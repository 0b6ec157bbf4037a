"""The WAF measured against CRS's own regression tests: of the tests that expect
a paranoia-level-1 rule to fire, how many the PoP blocks at its default profile
(PL1, anomaly threshold 5).

    git clone --depth 1 -b v3.3.4 https://github.com/coreruleset/coreruleset
    python bench/bench_waf_crs.py --tests coreruleset/tests/regression/tests \
        [--rules DIR] [--paranoia N] [--go-ftw] [--misses]

Each test is a go-ftw / ftw YAML stage. Its request is built as ftw builds it
(``method uri version``, the headers in order, ``data`` joined with CRLF when a
list; unless ``stop_magic``, a form Content-Type and a Content-Length are added
and a form body that is not yet percent-encoded is encoded; ``encoded_request``
and ``raw_request`` are sent as given), and those bytes are fed to edgefn's HTTP
front (`runtime.net.protocol.HttpProtocol`, no socket). The request the front
hands on goes to `WafEngine.inspect` (the PoP's default profile) and to the
`waf` stage in block mode: both must agree. A request the front refuses (a 4xx
before any stage) is counted as blocked by the front.

Positive tests only (``log_contains: id "N"``) for rules N at PL1 (the rule
files' ``EXECUTING_PARANOIA_LEVEL "@lt N"`` sections; `--paranoia N`: up to N,
with the profile at N); files whose ``meta.enabled`` is false are skipped, as
ftw skips them. `--rules` (default: the PoP's, Debian's modsecurity-crs) is the
folder the engine runs and levels are read from. `--go-ftw`: form bodies are sent
as written. `--misses` lists every test not blocked, with its reason.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, unquote, urlencode

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgefn_core.process import load_system_libstdcxx  # noqa: E402

load_system_libstdcxx()

from edgefn_core.errors import Rejected  # noqa: E402
from runtime.functions.manifest import Route  # noqa: E402
from runtime.functions.router import Router  # noqa: E402
from runtime.net.message import Request, Response  # noqa: E402
from runtime.net.protocol import HttpProtocol  # noqa: E402
from runtime.net.server import ServerConfig, ServerState  # noqa: E402
from runtime.pipeline.stage import Context  # noqa: E402
from runtime.pipeline.stages.waf import Waf  # noqa: E402
from runtime.pipeline.targets import Targets  # noqa: E402
from runtime.pipeline.warm import MemoryTransport  # noqa: E402
from runtime.security.settings import NO_POLICY, WafSettings  # noqa: E402
from runtime.security.waf.crs import Profile  # noqa: E402
from runtime.security.waf.engine import Verdict, WafEngine  # noqa: E402

CLIENT = "192.0.2.10:40000"
CRLF = "\r\n"
FORM = "application/x-www-form-urlencoded"


# -- the rules: which run at PL1, and their severity ---------------------------------------
class Rule(NamedTuple):
    paranoia: int
    severity: str


def rules_of(folder: Path) -> dict[int, Rule]:
    """Every rule id in the REQUEST-* files of `folder`, with the paranoia level of
    the section it is in and its severity."""
    rules = {}
    for path in sorted(folder.glob("REQUEST-*.conf")):
        level = 1
        text = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8", errors="replace"))
        for line in text.splitlines():
            marker = re.search(r'PARANOIA_LEVEL\s+"@lt (\d)"', line)
            if marker:
                level = int(marker.group(1))
                continue
            rid = re.search(r"\bid:(\d+)", line)
            if rid and line.lstrip().startswith(("SecRule", "SecAction")):
                severity = re.search(r"severity:'?(\w+)", line)
                rules[int(rid.group(1))] = Rule(level, severity.group(1) if severity else "-")
    return rules


# -- the tests: ftw's requests, as bytes ----------------------------------------------------
class Case(NamedTuple):
    file: str  # the CRS rule file the test is for, e.g. REQUEST-942-APPLICATION-ATTACK-SQLI
    title: str
    rule: int
    raw: bytes
    kind: str  # "plain", or "encoded_request" / "raw_request": replayed as given


def positives(folder: Path, encode_forms: bool = True) -> tuple[list[Case], list[str]]:
    """The positive stages of the enabled test files in `folder`, and the names of
    the disabled files. `encode_forms`: as ftw, percent-encode a form body that
    is not yet (go-ftw sends it as written)."""
    cases, disabled = [], []
    for path in sorted(folder.glob("REQUEST-*/*.yaml")):
        doc = yaml.safe_load(path.read_bytes())
        if not doc["meta"].get("enabled", True):
            disabled.append(path.name)
            continue
        for test in doc["tests"]:
            for stage in test["stages"]:
                expected = str(stage["stage"]["output"].get("log_contains") or "")
                rid = re.search(r"\d{6}", expected)
                if rid:
                    raw, kind = ftw_bytes(stage["stage"]["input"], encode_forms)
                    cases.append(Case(path.parent.name, str(test["test_title"]),
                                      int(rid.group()), raw, kind))
    return cases, disabled


def ftw_bytes(spec: dict[str, Any], encode_forms: bool = True) -> tuple[bytes, str]:
    """The bytes ftw sends for one stage's input."""
    if spec.get("encoded_request"):
        return base64.b64decode(spec["encoded_request"]), "encoded_request"
    if spec.get("raw_request"):
        return spec["raw_request"].encode("latin-1", "replace"), "raw_request"
    headers = {str(k): str(v) for k, v in (spec.get("headers") or {}).items()}
    data = spec.get("data") or ""
    data = CRLF.join(map(str, data)) if isinstance(data, list) else str(data)
    magic = not spec.get("stop_magic", False)
    if data and magic:
        headers.setdefault("Content-Type", FORM)
        if encode_forms and headers["Content-Type"] == FORM and unquote(data) == data:
            fields = parse_qsl(data)
            data = urlencode(fields) if fields else data
    body = _encoded(data, headers.get("Content-Type", "") if magic else "")
    if data and magic:
        headers.setdefault("Content-Length", str(len(body)))
    head = f"{spec.get('method', 'GET')} {spec.get('uri', '/')} {spec.get('version', 'HTTP/1.1')}"
    lines = [head, *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    return CRLF.join(lines).encode("utf-8") + body, "plain"


def _encoded(data: str, content_type: str) -> bytes:
    """`data` in the Content-Type's charset when Python knows it, else UTF-8."""
    m = re.search(r";\s?charset=([\w-]+)", content_type)
    try:
        return data.encode(m.group(1) if m else "utf-8")
    except (LookupError, UnicodeError):
        return data.encode("utf-8")


# -- the HTTP front, socket-free ------------------------------------------------------------
def through_front(raw: bytes, loop: asyncio.AbstractEventLoop) -> Request | int:
    """The first request edgefn's HTTP front makes of `raw`, or the status it
    refused it with (a 4xx written before any request was handed on)."""
    seen: list[Request] = []

    def app(request: Request) -> Response:
        seen.append(request)
        return Response(200, [], b"")

    proto = HttpProtocol(app, ServerState(ServerConfig(), loop))
    transport = MemoryTransport(loop, ("192.0.2.10", 40000))
    proto.connection_made(transport)  # type: ignore[arg-type]
    proto.data_received(raw)
    if seen:
        return seen[0]
    status = re.match(rb"HTTP/1\.1 (\d+)", transport.sent)
    return int(status.group(1)) if status else 0


# -- replaying ------------------------------------------------------------------------------
class Outcome(NamedTuple):
    case: Case
    fired: bool
    blocked: bool
    reason: str  # why it was not blocked, or by what it was


def replay(case: Case, engine: WafEngine, stage: Waf, rules: dict[int, Rule],
           loop: asyncio.AbstractEventLoop) -> Outcome:
    got = through_front(case.raw, loop)
    if isinstance(got, int):
        why = got or "incomplete, waits for more (408 after body_timeout)"
        return Outcome(case, False, got >= 400, f"HTTP front: {why}")
    verdict = engine.inspect(got, CLIENT, stage.pop[0].max_body_bytes)
    staged = _stage_blocks(stage, got)
    if staged != verdict.blocked:
        raise SystemExit(f"{case.title}: the stage blocked={staged}, the engine "
                         f"blocked={verdict.blocked}")
    fired = case.rule in verdict.rules
    return Outcome(case, fired, verdict.blocked, _reason(case, verdict, fired, rules))


def _stage_blocks(stage: Waf, request: Request) -> bool:
    ctx = Context(CLIENT)
    ctx.request_id = b"crs"
    try:
        stage(request, ctx, lambda r, c: Response(200))
    except Rejected as e:
        return e.status == 403
    return False


def _reason(case: Case, verdict: Verdict, fired: bool, rules: dict[int, Rule]) -> str:
    if verdict.blocked:
        return "blocked"
    if fired:
        return f"fired, {rules[case.rule].severity.lower()} alone (score {verdict.score})"
    others = ",".join(map(str, verdict.rules)) or "none"
    return f"rule did not fire (score {verdict.score}, rules {others})"


# -- report ---------------------------------------------------------------------------------
def report(outcomes: list[Outcome], show_misses: bool) -> None:
    by_file: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by_file[o.case.file].append(o)
    print(f"{'CRS file':48} {'pos':>5} {'fired':>7} {'blocked':>8}")
    for name, group in sorted(by_file.items()):
        _row(name, group)
    _row("total", outcomes)
    front = [o.case.title for o in outcomes if o.reason.startswith("HTTP front") and o.blocked]
    print(f"  of which refused by the HTTP front before the WAF: {len(front)} "
          f"({', '.join(front)})")
    staged = len(outcomes) - len(front)
    print(f"  the waf stage (block) and WafEngine.inspect agreed on all {staged} others")
    rates = [sum(o.blocked for o in g) / len(g) * 100 for g in by_file.values()]
    print(f"  blocked, the mean of the {len(rates)} files' rates: {sum(rates) / len(rates):.1f}%")
    for kind in ("encoded_request", "raw_request"):
        group = [o for o in outcomes if o.case.kind == kind]
        if group:
            _row(f"  {kind} tests (in the totals)", group)
    misses = [o for o in outcomes if not o.blocked]
    print(f"not blocked: {len(misses)}, by reason")
    for reason, n in Counter(_group(o.reason) for o in misses).most_common():
        print(f"  {n:4}  {reason}")
    if show_misses:
        for o in misses:
            print(f"  {o.case.title:16} {o.case.rule}  {o.reason}")
        unfired = [o for o in outcomes if o.blocked and not o.fired and o.reason == "blocked"]
        print(f"blocked, but not by the rule the test expects: {len(unfired)}")
        for o in unfired:
            print(f"  {o.case.title:16} {o.case.rule}")


def _row(name: str, group: list[Outcome]) -> None:
    n = len(group)
    fired = sum(o.fired for o in group) / n * 100
    blocked = sum(o.blocked for o in group) / n * 100
    print(f"{name:48} {n:5} {fired:6.1f}% {blocked:7.1f}%")


def _group(reason: str) -> str:
    return re.sub(r" \(.*\)$", "", reason)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tests", type=Path, required=True,
                    help="coreruleset/tests/regression/tests of CRS v3.3.4")
    ap.add_argument("--rules", type=Path, default=Path(WafSettings().crs_rules),
                    help="the CRS rules folder the engine runs (default: the PoP's)")
    ap.add_argument("--paranoia", type=int, default=1, choices=(1, 2, 3, 4),
                    help="the profile's paranoia level; tests of rules up to it are run")
    ap.add_argument("--go-ftw", action="store_true",
                    help="send `data` as go-ftw does: never percent-encoded by the runner")
    ap.add_argument("--misses", action="store_true", help="list each test not blocked")
    args = ap.parse_args()
    settings = WafSettings(mode="block", paranoia=args.paranoia, crs_rules=str(args.rules))
    rules = rules_of(args.rules)
    cases, disabled = positives(args.tests, encode_forms=not args.go_ftw)
    chosen = [c for c in cases if c.rule in rules and rules[c.rule].paranoia <= args.paranoia]
    unknown = sorted({c.rule for c in cases if c.rule not in rules})
    print(f"rules: {args.rules} ({len(rules)} ids); tests: {args.tests}")
    print(f"positive stages: {len(cases)}; at PL<={args.paranoia}: {len(chosen)}; above: "
          f"{len(cases) - len(chosen) - sum(c.rule in unknown for c in cases)}; "
          f"rule not in these files: {unknown}; files disabled: {', '.join(disabled)}")
    engine = WafEngine(Profile.of(settings))
    router = Router([(Route("/"), "f", SimpleNamespace(
        label="f@1", kind="function", name="f", tenant=None, policy=NO_POLICY))])
    stage = Waf(settings, Targets(SimpleNamespace(router=router, canaries={})))  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    try:
        outcomes = [replay(c, engine, stage, rules, loop) for c in chosen]
    finally:
        loop.close()
    report(outcomes, args.misses)


if __name__ == "__main__":
    main()
