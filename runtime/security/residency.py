"""Data residency: tenants pinned to a region (``[residency]`` in pop.toml).

A pinned tenant is served only by PoPs of its region; the `residency` stage
refuses it anywhere else. Between the PoPs of a topology the tenant travels as
the ``x-edgefn-tenant`` header, signed with the topology's shared ``secret``
(HMAC-SHA256 over the tenant and the request id, so a token does not outlive its
request), and the receiving PoP enforces the pin again.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Annotated, Any

from msgspec import Meta, Struct, field

from edgefn_core.errors import InvalidConfig, Rejected

TENANT_HEADER = b"x-edgefn-tenant"
_REGION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
MIN_SECRET = 16


class SampleSettings(Struct, forbid_unknown_fields=True, frozen=True):
    """``[residency.samples]``: de-sensitised event samples shipped to central."""

    rate: Annotated[float, Meta(ge=0, le=1)] = 0.0  # share of events sampled; 0 = off
    batch: Annotated[int, Meta(ge=1, le=100_000)] = 200  # events per spooled batch at most
    interval_s: Annotated[float, Meta(gt=0, le=3600)] = 1.0  # a batch closes at least this often
    to: str = ""  # central's ingest URL: http://host:port/_edgefn/samples
    ingest: bool = False  # this PoP (central) accepts batches at /_edgefn/samples


class ResidencySettings(Struct, forbid_unknown_fields=True, frozen=True):
    tenants: dict[str, str] = {}  # tenant -> the region its data stays in
    secret: str = ""  # shared by a topology's PoPs: signs tenant headers and batches
    samples: SampleSettings = field(default_factory=SampleSettings)

    def problem(self) -> tuple[str, str] | None:
        """(field, reason) for what the schema cannot say, or None."""
        for tenant, region in self.tenants.items():
            if not tenant.strip():
                return "tenants", "a tenant name is empty"
            if not _REGION.match(region):
                return f"tenants.{tenant}", f"{region!r} is not a region name"
        if self.secret and len(self.secret) < MIN_SECRET:
            return "secret", f"at least {MIN_SECRET} characters"
        s = self.samples
        if (s.rate > 0 or s.ingest) and not self.secret:
            return "samples", "samples are hashed and authenticated with `secret`: set it"
        if s.rate > 0 and not s.to.startswith(("http://", "https://")):
            return "samples.to", f"expected central's http(s):// ingest URL, got {s.to!r}"
        return None


def check(settings: ResidencySettings, label: str) -> None:
    """Raises `InvalidConfig` naming `residency.<field>`."""
    problem = settings.problem()
    if problem is not None:
        raise InvalidConfig(label, problem[1], f"residency.{problem[0]}")


def mac(secret: str, *parts: str) -> str:
    """HMAC-SHA256 of `parts` under `secret`, hex, cut to 32 characters."""
    msg = "\n".join(parts).encode()
    return hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()[:32]


def sign(secret: str, tenant: str, request_id: str) -> str:
    """The ``x-edgefn-tenant`` value for `tenant` on request `request_id`."""
    return f"{tenant};{mac(secret, tenant, request_id)}"


def verify(secret: str, value: str, request_id: str) -> str:
    """The tenant a signed header names. Raises `Rejected` (403) when it was not
    signed with `secret` for `request_id` (or this PoP has no secret)."""
    tenant, _, tag = value.rpartition(";")
    if not secret or not tenant or not hmac.compare_digest(tag, mac(secret, tenant, request_id)):
        raise Rejected("forbidden", 403, "x-edgefn-tenant is not signed with this topology's "
                       "secret for this request id")
    return tenant


def refusal(tenant: str, home: str, pop: str, region: str) -> Rejected:
    """The 451 a pinned tenant gets outside its region."""
    return Rejected("residency_violation", 451,
                    f"tenant {tenant!r} is pinned to region {home!r}; PoP {pop!r} is in "
                    f"region {region or '(none)'!r} and does not serve it",
                    detail={"tenant_region": home, "pop_region": region})


def forward_of(decisions: dict[str, Any] | None) -> str | None:
    """The ``x-edgefn-tenant`` value the request's hops to other PoPs carry (what
    the `residency` stage recorded), or None."""
    record = decisions.get("residency") if decisions is not None else None
    return record.get("forward") if isinstance(record, dict) else None
