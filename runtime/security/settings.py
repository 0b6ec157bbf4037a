"""What the security stages are told: their settings in ``pop.toml`` (one
``[[pipeline]]`` entry each, see `runtime.config`) and what a function asks of
them in its ``edgefn.toml`` (`TargetPolicy`).

Plain msgspec Structs and nothing else, so the config and the manifest can
import them without loading an engine. A function's table is merged over the
PoP's: a field the function leaves out keeps the PoP's value (`merge`).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct, field

from runtime.security.principal import TENANT_PATTERN

AuthMode = Literal["none", "key", "jwt"]
WafMode = Literal["off", "detect", "block"]
BotClass = Literal["browser", "verified_agent", "declared_agent", "automation", "abusive"]
BotAction = Literal["allow", "limit", "challenge", "block"]
LimitKey = Literal["ip", "key", "tenant", "agent", "function", "model"]
Algorithm = Literal["moving_window", "sliding_window", "fixed_window"]
Paranoia = Annotated[int, Meta(ge=1, le=4)]
RuleId = Annotated[int, Meta(ge=1, le=9_999_999)]
# a `limits` rate string: "100/minute", "10 per second", "1000/hour;50/minute"
RateString = Annotated[str, Meta(min_length=3, max_length=200)]
Scope = Annotated[str, Meta(pattern=r"^(\*|(fn|model|route|admin):[^\s,]{1,200})$")]
TenantName = Annotated[str, Meta(pattern=TENANT_PATTERN)]


# -- auth -----------------------------------------------------------------------------------
class JwtSettings(Struct, forbid_unknown_fields=True, frozen=True):
    """JWT bearer tokens: RS256/ES256 verified with the keys of a JWKS file, HS256
    with the secret in the environment variable `secret_env`. `tenant_claim` and
    `scopes_claim` (a space-separated string or a list) map a token to a principal."""

    jwks: str | None = None
    secret_env: str | None = None
    algorithms: list[Literal["HS256", "RS256", "ES256"]] = field(
        default_factory=lambda: ["RS256", "ES256"])
    issuer: str | None = None
    audience: str | None = None
    tenant_claim: str = "tenant"
    scopes_claim: str = "scope"
    leeway_seconds: Annotated[float, Meta(ge=0, le=300)] = 30.0


class AuthSettings(Struct, forbid_unknown_fields=True, frozen=True):
    """`functions`: the default mode of functions that say nothing (`auth` in a
    manifest overrides it). `openai`: the OpenAI API's mode; ``auto`` asks for a key
    once any key exists."""

    functions: AuthMode = "none"
    openai: AuthMode | Literal["auto"] = "auto"
    jwt: JwtSettings | None = None


# -- WAF ------------------------------------------------------------------------------------
class WafSettings(Struct, forbid_unknown_fields=True, frozen=True):
    """The OWASP Core Rule Set on libmodsecurity. `anomaly_threshold` is CRS's
    inbound anomaly score threshold; `exclude_rules` are rule ids removed
    (``SecRuleRemoveById``); request bodies are inspected up to `max_body_bytes`.
    `crs_setup` and `crs_rules` (PoP-wide only): CRS's setup file and its rules
    folder (default: Debian's ``modsecurity-crs``)."""

    mode: WafMode = "off"
    paranoia: Paranoia = 1
    anomaly_threshold: Annotated[int, Meta(ge=1, le=1000)] = 5
    exclude_rules: list[RuleId] = []
    max_body_bytes: Annotated[int, Meta(ge=0, le=16 * 1024 * 1024)] = 128 * 1024
    crs_setup: str = "/etc/modsecurity/crs/crs-setup.conf"
    crs_rules: str = "/usr/share/modsecurity-crs/rules"


class WafOverride(Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    """A function's ``[waf]``: any field of `WafSettings`."""

    mode: WafMode | None = None
    paranoia: Paranoia | None = None
    anomaly_threshold: Annotated[int, Meta(ge=1, le=1000)] | None = None
    exclude_rules: list[RuleId] | None = None
    max_body_bytes: Annotated[int, Meta(ge=0, le=16 * 1024 * 1024)] | None = None


# -- bots -----------------------------------------------------------------------------------
class BotPolicy(Struct, forbid_unknown_fields=True, frozen=True):
    """What each class of client gets. ``limit`` applies the class's budget in
    `BotSettings.budgets` (per client: a verified agent's identity, else its address)."""

    browser: BotAction = "allow"
    verified_agent: BotAction = "allow"
    declared_agent: BotAction = "allow"
    automation: BotAction = "allow"
    abusive: BotAction = "block"


class BotOverride(Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    """A function's ``[bots]``: any field of `BotPolicy`."""

    browser: BotAction | None = None
    verified_agent: BotAction | None = None
    declared_agent: BotAction | None = None
    automation: BotAction | None = None
    abusive: BotAction | None = None


class BotSettings(Struct, forbid_unknown_fields=True, frozen=True):
    """`agents`: a TOML list of known AI agents and crawlers (default: the packaged
    one). `directories`: Web Bot Auth key directories (JWKS files or URLs) whose
    signatures are trusted. `budgets`: the rate of the ``limit`` action per class.
    `abusive_rate`: a client (a verified agent's identity, else its address) past
    this rate is classed abusive; None (the default) turns the rate signal off, so
    that one busy client (a load test, a NAT) is not blocked unless asked."""

    policy: BotPolicy = field(default_factory=BotPolicy)
    agents: str | None = None
    directories: list[str] = []
    signature_max_age: Annotated[float, Meta(gt=0, le=86400)] = 300.0
    budgets: dict[BotClass, RateString] = field(default_factory=lambda: {
        "verified_agent": "600/minute", "declared_agent": "60/minute",
        "automation": "30/minute", "browser": "600/minute", "abusive": "1/minute"})
    abusive_rate: RateString | None = None  # e.g. "50/second"
    pow_difficulty: Annotated[int, Meta(ge=1, le=32)] = 16


# -- rate limits ----------------------------------------------------------------------------
# what `limits.parse_many` reads ("100/minute", "10 per 2 seconds", "1000/hour;50/minute")
# (an amount or a window of 0 would refuse every request with a retry hint never true)
_ONE_RATE = r"\s*[1-9][0-9]*\s*(/|per)\s*([1-9][0-9]*)?\s*(second|minute|hour|day|month|year)s?\s*"
_RATES = re.compile(rf"{_ONE_RATE}([,;|]{_ONE_RATE})*", re.IGNORECASE)


class RateRule(Struct, forbid_unknown_fields=True, frozen=True):
    """`limit` requests per window for each value of `by` (every client address,
    every key, ...). A rule by ``model`` counts OpenAI API and ``ai`` binding calls.
    Raises ValueError (a ValidationError when decoded) for a `limit` that is not a
    rate, so pop.toml and edgefn.toml are refused when they load."""

    by: LimitKey
    limit: RateString
    # the sliding window counter costs O(1) per hit, in memory and on Redis; a moving
    # window keeps every hit of its window (exact, but O(limit) per hit in memory)
    algorithm: Algorithm = "sliding_window"

    def __post_init__(self) -> None:
        if not _RATES.fullmatch(self.limit):
            raise ValueError(f"limit {self.limit!r} is not a rate like '100/minute', "
                             "'10 per 2 seconds' or '1000/hour;50/minute' (amounts and "
                             "windows of 1 or more)")


class TenantLimits(Struct, forbid_unknown_fields=True, frozen=True):
    """A tenant's limits, shared by all its keys and its functions' ``ai`` calls."""

    rpm: Annotated[int, Meta(ge=1)] | None = None
    tpm: Annotated[int, Meta(ge=1)] | None = None
    max_streams: Annotated[int, Meta(ge=1)] | None = None


class RateLimitSettings(Struct, forbid_unknown_fields=True, frozen=True):
    """`storage`: ``memory://`` for one PoP, ``redis://HOST:PORT[/DB]`` to share
    counts across PoPs. Client addresses are aggregated to /`ipv4_prefix` and
    /`ipv6_prefix` networks. `rules` apply to every request; a key's rpm/tpm and
    `tenants` add their own."""

    storage: str = "memory://"
    ipv4_prefix: Annotated[int, Meta(ge=8, le=32)] = 32
    # an IPv6 client has a /64 to itself (RFC 6177): counted per address it had 2**64
    # identities, and stepped round a per-IP limit by changing its last 64 bits
    ipv6_prefix: Annotated[int, Meta(ge=16, le=128)] = 64
    rules: list[RateRule] = []
    # a name no tenant can have ("Bad Tenant") was accepted, its limit never applying
    tenants: dict[TenantName, TenantLimits] = {}
    headers: bool = True  # RateLimit-Policy / RateLimit on every limited response
    # reserved when a request sets none: what the model worker generates then (256)
    default_max_tokens: Annotated[int, Meta(ge=1)] = 256
    # storage unreachable (Redis down): "open" admits uncounted, "closed" answers 503
    on_storage_error: Literal["open", "closed"] = "open"
    # ``workers = N``: the windows their shared table holds (8 MiB at the default);
    # past it, a full group gives up the window that ends first (see README)
    shared_keys: Annotated[int, Meta(ge=8, le=1 << 26, multiple_of=8)] = 131072


# -- what a target asks -----------------------------------------------------------------------
class TargetPolicy(Struct, forbid_unknown_fields=True, frozen=True):
    """What one target (a function, or the OpenAI API) asks of the security stages
    beyond the PoP's settings. None: the PoP's setting."""

    auth: AuthMode | None = None
    waf: WafOverride | None = None
    bots: BotOverride | None = None
    rate_limits: list[RateRule] = []


NO_POLICY = TargetPolicy()


def merge[S: Struct](base: S, override: Struct | None) -> S:
    """`base` with every field `override` sets (not None) replaced."""
    if override is None:
        return base
    changes = {k: v for k, v in msgspec.structs.asdict(override).items() if v is not None}
    return msgspec.structs.replace(base, **changes) if changes else base
