"""The IETF rate limit header fields (draft-ietf-httpapi-ratelimit-headers-09):

    RateLimit-Policy: "by-ip";q=100;w=60
    RateLimit: "by-ip";r=42;t=17

Each is a Structured Field list of strings with parameters: the policy's name,
its quota `q` per window of `w` seconds; the remaining quota `r` and `t`, the
seconds until the quota resets. Several policies are one comma-separated list.
"""

from __future__ import annotations

import math
from typing import NamedTuple

POLICY = b"ratelimit-policy"
STATE = b"ratelimit"
RETRY_AFTER = b"retry-after"


class Quota(NamedTuple):
    """One policy's state for this request: `remaining` may be below 0 and `reset`
    (seconds from now) fractional; the fields show them clamped and rounded up."""

    name: str
    quota: int
    window: int
    remaining: int
    reset: float


_policies: dict[tuple[tuple[str, int, int], ...], tuple[bytes, bytes]] = {}


def fields(quotas: list[Quota]) -> list[tuple[bytes, bytes]]:
    """The two header fields for `quotas` (names are sf-strings: no quotes or
    backslashes, which `limiter` names never contain)."""
    shape = tuple([q[:3] for q in quotas])
    policy = _policies.get(shape)
    if policy is None:
        if len(_policies) >= 1024:
            _policies.clear()
        policy = _policies[shape] = (POLICY, ", ".join(
            [f'"{q[0]}";q={q[1]};w={q[2]}' for q in quotas]).encode())
    state = ", ".join([f'"{q[0]}";r={max(0, q[3])};t={max(0, math.ceil(q[4]))}'
                       for q in quotas])
    return [policy, (STATE, state.encode())]


def retry_after(seconds: float) -> tuple[bytes, bytes]:
    """``Retry-After`` in whole seconds, at least 1."""
    return (RETRY_AFTER, str(max(1, math.ceil(seconds))).encode())
