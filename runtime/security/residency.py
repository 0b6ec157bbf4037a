"""Data residency: tenants pinned to a region (``[residency]`` in pop.toml).

A pinned tenant is served only by PoPs of its region; the `residency` stage
refuses it anywhere else. Between the PoPs of a topology the tenant travels as
the ``x-edgefn-tenant`` header, signed with the topology's shared ``secret``
(HMAC-SHA256 over the tenant, the request id and when it was signed: a token
names one request and holds `SIGNED_FOR_S` seconds, so a captured header cannot be
replayed later), and the receiving PoP enforces the pin again. A forwarded model
call's fair share of the model worker travels the same way, as ``x-edgefn-client``
(`sign_client`); the receiving PoP honours only a signed one (`verify_client`).

A PoP also knows where its model calls go when it forwards them (``[residency.uplink]``:
the forwarded models and the PoPs its uplink may reach, in order). A pinned tenant's
call that could reach a PoP outside its region is refused here, before it leaves
(`before_hop`), or, for a tenant in ``allow_desensitised``, sent de-sensitised
(`runtime.ai.egress`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from typing import Annotated, Any

from msgspec import Meta, Struct, field

from edgefn_core.errors import InvalidConfig, Rejected
from runtime.security.principal import TENANT, TENANT_PATTERN

TENANT_HEADER = b"x-edgefn-tenant"
# the model worker's fair share a call counts in (`runtime.security.principal.model_client`),
# signed like the tenant (`sign_client`): the next tier shares its model by the caller
# behind the PoP that forwarded the call, not by that PoP
CLIENT_HEADER = b"x-edgefn-client"
_CLIENT_SCOPE = "client:"  # what a signed client is bound to, besides the request id
# marks a call a PoP de-sensitised before it left the tenant's region; its value is
# the tenant's keyed hash (`hashed_id`)
DESENSITISED_HEADER = b"x-edgefn-desensitised"
_REGION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
MIN_SECRET = 16
# how long a signed tenant holds, either way of the receiver's clock: it is signed as
# the hop leaves and checked as it arrives (skew between machines included)
SIGNED_FOR_S = 120


class SampleSettings(Struct, forbid_unknown_fields=True, frozen=True):
    """``[residency.samples]``: de-sensitised event samples shipped to central."""

    rate: Annotated[float, Meta(ge=0, le=1)] = 0.0  # share of events sampled; 0 = off
    batch: Annotated[int, Meta(ge=1, le=100_000)] = 200  # events per spooled batch at most
    interval_s: Annotated[float, Meta(gt=0, le=3600)] = 1.0  # a batch closes at least this often
    to: str = ""  # central's ingest URL: http://host:port/_edgefn/samples
    ingest: bool = False  # this PoP (central) accepts batches at /_edgefn/samples


class UplinkPop(Struct, forbid_unknown_fields=True, frozen=True):
    """A PoP this PoP's forwarded model calls may reach."""

    pop: str
    tier: str = ""
    region: str = ""


class Uplink(Struct, forbid_unknown_fields=True, frozen=True):
    """``[residency.uplink]``: where this PoP's model calls go when it forwards them."""

    models: list[str] = []  # the models its worker forwards (an `openai` engine)
    pops: list[UplinkPop] = []  # every PoP they may reach, in failover order


class ResidencySettings(Struct, forbid_unknown_fields=True, frozen=True):
    tenants: dict[str, str] = {}  # tenant -> the region its data stays in
    secret: str = ""  # shared by a topology's PoPs: signs tenant headers and batches
    samples: SampleSettings = field(default_factory=SampleSettings)
    uplink: Uplink = field(default_factory=Uplink)
    # pinned tenants whose model calls may leave their region de-sensitised
    allow_desensitised: list[str] = []

    def leaving(self, home: str, model: str) -> UplinkPop | None:
        """The first PoP outside region `home` that a call for `model` may reach
        from here, or None when it is not forwarded or stays in `home`."""
        if model not in self.uplink.models:
            return None
        return next((p for p in self.uplink.pops if p.region != home), None)

    def problem(self) -> tuple[str, str] | None:
        """(field, reason) for what the schema cannot say, or None."""
        for tenant, region in self.tenants.items():
            if not tenant.strip():
                return "tenants", "a tenant name is empty"
            if not TENANT.match(tenant):
                return f"tenants.{tenant}", not_a_tenant(tenant)
            if not _REGION.match(region):
                return f"tenants.{tenant}", f"{region!r} is not a region name"
        if self.secret and len(self.secret) < MIN_SECRET:
            return "secret", f"at least {MIN_SECRET} characters"
        for i, tenant in enumerate(self.allow_desensitised):
            if tenant not in self.tenants:
                return f"allow_desensitised[{i}]", f"{tenant!r} is not a pinned tenant"
        if self.allow_desensitised and not self.secret:
            return "allow_desensitised", "identifiers are hashed with `secret`: set it"
        s = self.samples
        if (s.rate > 0 or s.ingest) and not self.secret:
            return "samples", "samples are hashed and authenticated with `secret`: set it"
        if s.rate > 0 and not s.to.startswith(("http://", "https://")):
            return "samples.to", f"expected central's http(s):// ingest URL, got {s.to!r}"
        return None


def not_a_tenant(name: str) -> str:
    """Why `name` can never be a request's tenant (it does not match `TENANT_PATTERN`)."""
    return (f"{name!r} is not a tenant name (API keys, JWTs and manifests name tenants as "
            f"{TENANT_PATTERN}: lower-case letters, digits, '-' and '_'): its pin would "
            "never apply")


def check(settings: ResidencySettings, label: str) -> None:
    """Raises `InvalidConfig` naming `residency.<field>`."""
    problem = settings.problem()
    if problem is not None:
        raise InvalidConfig(label, problem[1], f"residency.{problem[0]}")


def mac(secret: str, *parts: str) -> str:
    """HMAC-SHA256 of `parts` under `secret`, hex, cut to 32 characters."""
    msg = "\n".join(parts).encode()
    return hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()[:32]


def sign(secret: str, tenant: str, request_id: str, now: float | None = None) -> str:
    """The ``x-edgefn-tenant`` value for `tenant` on request `request_id`, signed
    at `now` (default: the clock's)."""
    issued = str(int(time.time() if now is None else now))
    return f"{tenant};{issued};{mac(secret, tenant, request_id, issued)}"


def verify(secret: str, value: str, request_id: str, now: float | None = None) -> str:
    """The tenant a signed header names. Raises `Rejected` (403) when it was not
    signed with `secret` for `request_id` (or this PoP has no secret), or not
    within `SIGNED_FOR_S` seconds of `now`."""
    tenant, issued, tag = _parts(value)
    if not secret or not tenant or not hmac.compare_digest(
            tag, mac(secret, tenant, request_id, issued)):
        raise Rejected("forbidden", 403, "x-edgefn-tenant is not signed with this topology's "
                       "secret for this request id")
    age = (time.time() if now is None else now) - int(issued)
    if abs(age) > SIGNED_FOR_S:
        raise Rejected("forbidden", 403, f"x-edgefn-tenant was signed {age:.0f} s from now; "
                       f"a signed tenant holds {SIGNED_FOR_S} s (are the PoPs' clocks apart?)")
    return tenant


def sign_client(secret: str, client: str, request_id: str, now: float | None = None) -> str:
    """The ``x-edgefn-client`` value for fair-share name `client` on request
    `request_id`: `sign`ed for ``client:<request id>``, so a signed tenant never
    passes for a signed client, nor the other way round."""
    return sign(secret, client, _CLIENT_SCOPE + request_id, now)


def verify_client(secret: str, value: str, request_id: str, now: float | None = None) -> str:
    """The fair-share name a signed ``x-edgefn-client`` names. Raises `Rejected`
    (403) as `verify` does (not signed with `secret` for `request_id`, or not lately)."""
    return verify(secret, value, _CLIENT_SCOPE + request_id, now)


def _parts(value: str) -> tuple[str, str, str]:
    """(tenant, issued, tag) of a signed value; blanks where it has no such shape."""
    tenant, _, rest = value.rpartition(";")
    tenant, _, issued = tenant.rpartition(";")
    if not issued.isascii() or not issued.isdigit() or len(issued) > 12:
        return "", "0", ""
    return tenant, issued, rest


def refusal(tenant: str, home: str, pop: str, region: str) -> Rejected:
    """The 451 a pinned tenant gets outside its region."""
    return Rejected("residency_violation", 451,
                    f"tenant {tenant!r} is pinned to region {home!r}; PoP {pop!r} is in "
                    f"region {region or '(none)'!r} and does not serve it",
                    detail={"tenant_region": home, "pop_region": region})


def before_hop(tenant: str, home: str, pop: str, away: UplinkPop, model: str) -> Rejected:
    """The 451 a pinned tenant gets where its model call would leave its region."""
    return Rejected("residency_violation", 451,
                    f"tenant {tenant!r} is pinned to region {home!r}: model {model!r} "
                    f"would need {away.tier or 'PoP'} {away.pop!r} in region "
                    f"{away.region or '(none)'!r}; not forwarded by PoP {pop!r}",
                    detail={"tenant_region": home, "needed_pop": away.pop,
                            "needed_tier": away.tier, "needed_region": away.region})


def hashed_id(secret: str, value: str) -> str:
    """An identifier as it may leave its region: keyed (only the topology can link
    it back), 16 hex characters."""
    return mac(secret, "id", value)[:16]


def tenant_of(forward: str | None) -> str | None:
    """The tenant a signed ``x-edgefn-tenant`` value names (unverified: for values
    this PoP made), or None."""
    return _parts(forward)[0] or None if forward else None


def mark_of(decisions: dict[str, Any] | None) -> str | None:
    """The ``x-edgefn-desensitised`` mark a request came with (what the `residency`
    stage recorded), which its hops carry on, or None."""
    record = decisions.get("residency") if decisions is not None else None
    if isinstance(record, dict) and record.get("result") == "desensitised":
        return str(record.get("tenant", ""))
    return None


def forward_of(decisions: dict[str, Any] | None) -> str | None:
    """The ``x-edgefn-tenant`` value the request's hops to other PoPs carry (what
    the `residency` stage recorded), or None."""
    record = decisions.get("residency") if decisions is not None else None
    return record.get("forward") if isinstance(record, dict) else None
