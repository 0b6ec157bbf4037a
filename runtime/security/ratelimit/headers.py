"""The IETF rate limit header fields (draft-ietf-httpapi-ratelimit-headers-09):

    RateLimit-Policy: "by-ip";q=100;w=60
    RateLimit: "by-ip";r=42;t=17

Each is a Structured Field list of strings with parameters: the policy's name,
its quota `q` per window of `w` seconds; the remaining quota `r` and `t`, the
seconds until the quota resets. Several policies are one comma-separated list.
"""

from __future__ import annotations

import math

POLICY = b"ratelimit-policy"
STATE = b"ratelimit"
RETRY_AFTER = b"retry-after"


class Quota:
    """One policy's state for this request."""

    __slots__ = ("name", "quota", "remaining", "reset", "window")

    def __init__(self, name: str, quota: int, window: int, remaining: int, reset: float
                 ) -> None:
        self.name, self.quota, self.window = name, quota, window
        self.remaining = max(0, remaining)
        self.reset = max(0, math.ceil(reset))


def fields(quotas: list[Quota]) -> list[tuple[bytes, bytes]]:
    """The two header fields for `quotas` (names are sf-strings: no quotes or
    backslashes, which `limiter` names never contain)."""
    policy = ", ".join(f'"{q.name}";q={q.quota};w={q.window}' for q in quotas)
    state = ", ".join(f'"{q.name}";r={q.remaining};t={q.reset}' for q in quotas)
    return [(POLICY, policy.encode()), (STATE, state.encode())]


def retry_after(seconds: float) -> tuple[bytes, bytes]:
    """``Retry-After`` in whole seconds, at least 1."""
    return (RETRY_AFTER, str(max(1, math.ceil(seconds))).encode())
