"""The rules a WAF engine runs: the OWASP Core Rule Set (CRS 3.3, Debian's
``modsecurity-crs`` by default) set up for one `Profile`.

A rules set is, in load order: the engine directives below (`ENGINE`), CRS's
setup file, the profile's paranoia level, anomaly threshold and allowed content
types, Debian's local exclusion file, CRS's ``REQUEST-*`` rule files (not
``REQUEST-910``: it needs GeoIP, which the wheel's libmodsecurity lacks; not the
``RESPONSE-*`` ones: responses are not inspected), the profile's exclusions
(``SecRuleRemoveById``), for the OpenAI API the prompt fields taken out of
every CRS rule's targets (`PROMPT_FIELDS`: a prompt is text for a model, and
code or SQL in it is ordinary), and `SCORE_RULE`.

Beyond CRS's defaults, the setup allows the methods PUT, PATCH and DELETE and
the content type text/plain (functions are APIs).

Rule ids edgefn adds (in ModSecurity's range for local rules):
    10001 / 10002  turn on the JSON / XML body processor from the Content-Type
    10003          the body did not parse (REQBODY_ERROR): refused in block mode
                   unless the body was cut at ``max_body_bytes``
    10004          reports CRS's inbound anomaly score (never listed as a match)
    10005          the request has more than `MAX_ARGS` arguments: those past it are
                   never read (an attack after 1000 padding ones passed), so it is
                   refused in block mode (ModSecurity's recommended rule 200007)
    10006          any ``application/*+json`` type is allowed (merge-patch, JSON:API,
                   problem+json: CRS's list names two, and 920420 refused the rest);
                   its body is read as JSON (10001)
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from runtime.security.settings import WafSettings

JSON_RULE, XML_RULE, BODY_ERROR_RULE, SCORE_RULE, ARGS_RULE = 10001, 10002, 10003, 10004, 10005
MAX_ARGS = 1000  # arguments (query, form, JSON leaves) the engine reads
JSON_TYPES_RULE = 10006
BLOCKING_RULE = 949110  # CRS: inbound anomaly score exceeded
LOCAL_EXCLUSIONS = "/etc/modsecurity/crs/REQUEST-900-EXCLUSION-RULES-BEFORE-CRS.conf"
SKIPPED = frozenset({"REQUEST-910-IP-REPUTATION.conf"})
BODY_LIMIT = 16 * 1024 * 1024 + 1  # above any max_body_bytes: edgefn cuts bodies itself
# CRS's default list (901162) and text/plain, which functions commonly take, less
# multipart/related: libmodsecurity parses only multipart/form-data, so its parts reached
# the rules as one opaque value that none read (a bypass); it is refused (920420)
CONTENT_TYPES = ("|application/x-www-form-urlencoded| |multipart/form-data| "
                 "|text/xml| |application/xml| |application/soap+xml| |application/json| "
                 "|application/cloudevents+json| |application/cloudevents-batch+json| "
                 "|text/plain|")
METHODS = "GET HEAD POST OPTIONS PUT PATCH DELETE"  # CRS's default (900200) + PUT PATCH DELETE
# the OpenAI API's prompt text, as libmodsecurity's JSON processor names it (one
# pattern each: `|` separates targets in SecLanguage, even inside a regex)
PROMPT_FIELDS = (r"^json\.messages\.array_\d+\.content$",
                 r"^json\.messages\.array_\d+\.content\.array_\d+\.text$",
                 r"^json\.prompt(?:\.array_\d+)?$", r"^json\.input(?:\.array_\d+)?$",
                 r"^json\.suffix$", r"^json\.instructions$")

ENGINE = rf"""
SecRuleEngine DetectionOnly
SecRequestBodyAccess On
SecRequestBodyLimit {BODY_LIMIT}
SecRequestBodyNoFilesLimit {BODY_LIMIT}
SecRequestBodyLimitAction ProcessPartial
SecArgumentsLimit {MAX_ARGS + 1}
SecRequestBodyJsonDepthLimit 256
SecResponseBodyAccess Off
SecAuditEngine Off
SecRule REQUEST_HEADERS:Content-Type "@rx (?i)^application/(?:[a-z0-9.+-]*\+)?json" \
    "id:{JSON_RULE},phase:1,t:none,pass,nolog,ctl:requestBodyProcessor=JSON"
SecRule REQUEST_HEADERS:Content-Type "@rx (?i)^application/[a-z0-9.-]+\+json\s*(?:;|$)" \
    "id:{JSON_TYPES_RULE},phase:1,t:none,pass,nolog,ctl:ruleRemoveById=920420"
SecRule REQUEST_HEADERS:Content-Type "@rx (?i)^(?:application(?:/soap\+|/)|text/)xml" \
    "id:{XML_RULE},phase:1,t:none,pass,nolog,ctl:requestBodyProcessor=XML"
SecRule &ARGS "@gt {MAX_ARGS}" \
    "id:{ARGS_RULE},phase:2,t:none,pass,log,msg:'Too many arguments to read them all',\
severity:'CRITICAL'"
SecRule REQBODY_ERROR "!@eq 0" \
    "id:{BODY_ERROR_RULE},phase:2,t:none,pass,log,msg:'Request body did not parse',\
logdata:'%{{reqbody_error_msg}}',severity:'CRITICAL'"
"""
SCORE = (f'SecRule TX:ANOMALY_SCORE "@gt 0" '
         f'"id:{SCORE_RULE},phase:2,t:none,pass,log,msg:\'%{{tx.anomaly_score}}\'"\n')


PROMPTS = "\n".join(f'SecRuleUpdateTargetByTag "OWASP_CRS" "!ARGS:/{field}/"'
                    for field in PROMPT_FIELDS) + "\n"


PROBE = 'SecRule ARGS "@rx ^probe$" "id:10009,phase:1,pass,nolog"\n'


class Profile(NamedTuple):
    """What makes one rules set differ from another: one engine per profile."""

    setup: str
    rules: str
    paranoia: int
    threshold: int
    exclusions: tuple[int, ...]
    prompts: bool = False  # exclude the OpenAI API's prompt fields (PROMPT_FIELDS)

    @classmethod
    def of(cls, settings: WafSettings, prompts: bool = False) -> Profile:
        return cls(settings.crs_setup, settings.crs_rules, settings.paranoia,
                   settings.anomaly_threshold, tuple(sorted(set(settings.exclude_rules))),
                   prompts)


class Source(NamedTuple):
    kind: str  # "text" (SecLanguage) or "file" (a path)
    value: str


def is_json_type(kind: bytes) -> bool:
    """Whether a Content-Type (lower case, no parameters) makes the rules read the body
    as JSON (rule 10001's match: ``application/json``, ``application/*+json``)."""
    return kind.startswith(b"application/") and (kind == b"application/json"
                                                 or kind.endswith(b"+json"))


def sources(profile: Profile) -> list[Source]:
    """The rules set of `profile`, in load order. Raises `FileNotFoundError` naming
    the setup file or rules folder when either is absent."""
    return [Source("text", ENGINE), Source("file", _existing(profile.setup)),
            Source("text", _setup(profile)),
            *([Source("file", LOCAL_EXCLUSIONS)] if Path(LOCAL_EXCLUSIONS).is_file() else []),
            *(Source("file", str(p)) for p in rule_files(profile.rules)),
            *([Source("text", _exclusions(profile.exclusions))] if profile.exclusions else []),
            *([Source("text", PROMPTS)] if profile.prompts else []),
            Source("text", SCORE)]


def rule_files(folder: str) -> list[Path]:
    """CRS's request rule files in `folder`, in CRS's order. Raises
    `FileNotFoundError` when it has none."""
    files = sorted(p for p in Path(folder).glob("REQUEST-*.conf") if p.name not in SKIPPED)
    if not files:
        raise FileNotFoundError(f"no CRS rules (REQUEST-*.conf) in {folder}")
    return files


def missing(settings: WafSettings) -> str | None:
    """Why a WAF with these settings cannot run (no engine, no rules), or None."""
    try:
        from libmodsecurity import RulesSet
    except ImportError as e:
        return f"libmodsecurity is not installed ({e}); pip install libmodsecurity"
    if RulesSet().load(PROBE) < 0:
        return ("libmodsecurity cannot parse rules in this process: a C++ library that "
                "carries its own libstdc++ (usearch) was loaded before the system's; call "
                "edgefn_core.process.load_system_libstdcxx() where the process starts")
    try:
        _existing(settings.crs_setup)
        rule_files(settings.crs_rules)
    except FileNotFoundError as e:
        return f"{e}; install Debian's modsecurity-crs (make services)"
    return None


def _existing(path: str) -> str:
    if not Path(path).is_file():
        raise FileNotFoundError(f"no CRS setup file at {path}")
    return path


def _setup(profile: Profile) -> str:
    return "\n".join([
        f'SecAction "id:900000,phase:1,pass,nolog,t:none,'
        f'setvar:tx.paranoia_level={profile.paranoia}"',
        f'SecAction "id:900110,phase:1,pass,nolog,t:none,'
        f'setvar:tx.inbound_anomaly_score_threshold={profile.threshold},'
        f'setvar:tx.outbound_anomaly_score_threshold=4"',
        f"SecAction \"id:900200,phase:1,pass,nolog,t:none,setvar:'tx.allowed_methods={METHODS}'\"",
        f'SecAction "id:900220,phase:1,pass,nolog,t:none,'
        f"setvar:'tx.allowed_request_content_type={CONTENT_TYPES}'\"",
    ]) + "\n"


def _exclusions(ids: tuple[int, ...]) -> str:
    return "SecRuleRemoveById " + " ".join(map(str, ids)) + "\n"
