"""`WafEngine`: one compiled CRS rules set (a `Profile`) and the inspection of a
request by it, through libmodsecurity's Python bindings.

The rules run in ModSecurity's DetectionOnly mode: one engine serves both
``detect`` and ``block``, and the stage decides from the `Verdict`. A request is
blocked when CRS's anomaly score reaches the profile's threshold (rule 949110
matched), or when its body did not parse (rule 10003) and was not cut short.

libmodsecurity holds the GIL while it inspects (about 1 ms at PL1): the stage
calls `inspect` on the event loop, and the WAF stays opt-in.
"""

from __future__ import annotations

import codecs
import json
import time
from typing import TYPE_CHECKING

from msgspec import Struct

from edgefn_core.errors import InvalidConfig
from runtime.net.message import Request
from runtime.security.waf import crs

if TYPE_CHECKING:
    from libmodsecurity import ModSecurity, RuleMessage, RulesSet


class Verdict(Struct, frozen=True, gc=False):
    """What the rules found: the ids of the rules that matched, each once, in the
    order they first matched (a rule matching two variables, as 930110 does for a
    traversal in ARGS and REQUEST_URI, reports twice; CRS's anomaly score report,
    rule 10004, left out), the inbound anomaly
    score, whether the request is to be blocked, and whether its body was cut."""

    rules: list[int]
    score: int
    blocked: bool
    truncated: bool


_shared: ModSecurity | None = None


def _modsecurity() -> ModSecurity:
    """The process's one ModSecurity instance (its log callback is registered for
    the life of the process, so it is made once)."""
    global _shared
    if _shared is None:
        from libmodsecurity import ModSecurity

        _shared = ModSecurity()
        _shared.set_connector_information("edgefn")
        _shared.set_log_callback(_discard)  # matches are read per transaction instead
    return _shared


def _discard(_line: str) -> None:
    pass


class WafEngine:
    def __init__(self, profile: crs.Profile) -> None:
        """Compile the rules of `profile` (about 0.05-0.1 s: not on the event loop
        while it serves). Raises `InvalidConfig` (field ``waf``) when the engine,
        the setup file or the rules are absent or do not load."""
        self.profile = profile
        started = time.perf_counter()
        self.rules = _load(profile)
        self.load_ms = (time.perf_counter() - started) * 1000
        self._modsec = _modsecurity()

    def inspect(self, request: Request, client: str, max_body_bytes: int,
                request_id: str | None = None) -> Verdict:
        """Run the request phases of the rules over `request` (URI, query, headers,
        and its body up to `max_body_bytes`). `client` is ``address:port``."""
        from libmodsecurity import Transaction

        t = Transaction(self._modsec, self.rules, request_id or None)
        address, _, port = client.rpartition(":")
        t.process_connection(address or client, int(port) if port.isdigit() else 0,
                             "0.0.0.0", 0)
        # The URI and headers go in as bytes, as received: the bindings encode a str
        # as UTF-8, so a str decoded from latin-1 would double every byte >= 0x80
        uri = request.path + b"?" + request.query if request.query else request.path
        t.process_uri(uri, request.method.decode("latin-1"),  # type: ignore[arg-type]
                      request.http_version)
        truncated = len(request.body) > max_body_bytes
        body = request.body[:max_body_bytes] if truncated else request.body
        disguised = _json_in_disguise(request.headers, body, truncated)
        json_body = disguised is not None
        if disguised is not None:
            body = disguised  # as UTF-8: what the rules read is what the function parses
        typed = False
        for name, value in request.headers:  # Content-Type picks the body processor
            if json_body and name.lower() == b"content-type":
                value, typed = b"application/json", True  # read as the function will
            t.add_request_header(name, value)  # type: ignore[arg-type]
        if json_body and not typed:
            t.add_request_header(b"content-type", b"application/json")  # type: ignore[arg-type]
        t.process_request_headers()
        if body:
            t.append_request_body(body)
        t.process_request_body()
        return _verdict(t.get_rule_messages(), truncated)


# types CRS allows but whose body reaches the rules as one opaque value, which they
# mostly do not read (the others are parsed into ARGS, or refused by type: 920420)
OPAQUE = (b"", b"text/plain")


def _json_in_disguise(headers: list[tuple[bytes, bytes]], body: bytes,
                      truncated: bool = False) -> bytes | None:
    """`body` as UTF-8 if it is a JSON object or array sent as text/plain (or with
    no type), or as JSON with a byte-order mark or in UTF-16 or UTF-32, else None: a
    function may parse it as JSON whatever the type says (the Python SDK's
    `request.json()` does, as `json.loads` of bytes, which takes a byte-order mark
    and UTF-16 or UTF-32 too), so the rules must read its fields as JSON (such a body
    was never inspected: a WAF bypass, with a BOM or in UTF-16 even after plain UTF-8
    was handled; typed as JSON, the rules' parser refused it as unparseable, 10003).
    A `truncated` body (cut at ``max_body_bytes``) cannot parse whole: one that begins
    as an object or array is read as JSON up to the cut, as one typed JSON is (it was
    not inspected at all: an attack in its first bytes passed)."""
    if not body:
        return None
    kind = next((v for k, v in headers if k.lower() == b"content-type"), b"")
    kind = kind.split(b";", 1)[0].strip().lower()
    if kind not in OPAQUE and not (crs.is_json_type(kind) and _encoded(body)):
        return None
    try:  # incremental: a cut may fall inside a character
        text = codecs.getincrementaldecoder(json.detect_encoding(body))().decode(
            body, final=not truncated)
    except (UnicodeDecodeError, LookupError):
        return None
    if text[:1] == "\ufeff":  # a UTF-16/32 BOM stays after the decode (utf-8-sig drops its own)
        text = text[1:]
    if text.lstrip()[:1] not in ("{", "["):
        return None
    if not truncated:
        try:
            json.loads(text)
        except ValueError:
            return None
    return text.encode()


def _encoded(body: bytes) -> bool:
    """Whether JSON `body` is not plain UTF-8: a byte-order mark, or UTF-16/32."""
    return body.startswith(b"\xef\xbb\xbf") or json.detect_encoding(body) != "utf-8"


def _verdict(messages: list[RuleMessage], truncated: bool) -> Verdict:
    rules: list[int] = []
    score = 0
    blocked = False
    for m in messages:
        rid = m.rule_id
        if rid == crs.SCORE_RULE:
            score = int(m.message) if m.message.isdigit() else 0
            continue
        if rid == crs.BODY_ERROR_RULE:
            if truncated:
                continue  # a body cut at the limit does not parse: expected
            blocked = True
        elif rid in (crs.BLOCKING_RULE, crs.ARGS_RULE):
            blocked = True
        if rid not in rules:
            rules.append(rid)
    return Verdict(rules, score, blocked, truncated)


def _load(profile: crs.Profile) -> RulesSet:
    try:
        from libmodsecurity import RulesSet
    except ImportError as e:
        raise InvalidConfig("pop.toml", f"the WAF engine is absent: {e}", "waf") from None
    rules = RulesSet()
    try:
        sources = crs.sources(profile)
    except FileNotFoundError as e:
        raise InvalidConfig("pop.toml", str(e), "waf") from None
    for source in sources:
        loaded = rules.load(source.value) if source.kind == "text" else rules.load_from_uri(
            source.value)
        if loaded < 0:
            where = source.value if source.kind == "file" else "edgefn's WAF rules"
            raise InvalidConfig("pop.toml", f"{where} did not load: "
                                f"{rules.get_parser_error().strip()}", "waf")
    return rules
