"""Canaries: a new version serving a share of a function's requests beside the live one.

A request's key is hashed to one of `BUCKETS` buckets; buckets below the canary's
threshold get the canary. The key is, first found: the ``x-edgefn-canary-key``
header, the client's address (without its port), the request id. The hash
(BLAKE2b) has no per-process seed, so a key gets the same version on every PoP and
after restarts: sticky by key (F7).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from edgefn_core.errors import InvalidConfig
from runtime.net.message import Request

if TYPE_CHECKING:
    from runtime.functions.registry import Deployment
    from runtime.pipeline.stage import Context

BUCKETS = 10_000  # a share is kept to 0.01 %
HEADER = b"x-edgefn-canary-key"


class Split:
    """A function's canary: `fn` serves keys whose bucket is below `threshold`."""

    __slots__ = ("fn", "percent", "threshold")

    def __init__(self, fn: Deployment, percent: float) -> None:
        self.fn = fn
        self.percent = percent
        self.threshold = threshold(percent)


def threshold(percent: float) -> int:
    """The buckets a share of `percent` takes: below it, a key gets the canary."""
    return round(percent * BUCKETS / 100)


def bucket(key: bytes) -> int:
    """The key's bucket in [0, BUCKETS): the same on every PoP."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest()) % BUCKETS


def key_of(request: Request, ctx: Context) -> bytes:
    """The header ``x-edgefn-canary-key``, else the client address, else the request id."""
    return request.header(HEADER) or ctx.ip.encode() or ctx.request_id


def choose(split: Split, live: Deployment, request: Request, ctx: Context) -> Deployment:
    """The version that serves this request: the canary for keys under its threshold."""
    return split.fn if bucket(key_of(request, ctx)) < split.threshold else live


def check_percent(percent: float, where: str = "canary") -> float:
    """`percent` if 0 < percent < 100 and it takes some of the `BUCKETS` buckets but
    not all (a share is kept to 0.01 %). Raises `InvalidConfig` (naming `where`)."""
    if not 0 < percent < 100:
        raise InvalidConfig(where, f"expected a share strictly between 0% and 100% (promote "
                            f"the canary to serve it everywhere), got {percent:g}%", "canary")
    if not 0 < threshold(percent) < BUCKETS:
        to, who = (0, "no") if threshold(percent) == 0 else (100, "every")
        step = 100 / BUCKETS
        raise InvalidConfig(where, f"expected a share of {step:g}% to {100 - step:g}% (a share "
                            f"is kept to {step:g}%), got {percent:g}%, which rounds to {to}%: "
                            f"{who} request key would get the canary", "canary")
    return percent


def parse_percent(text: str) -> float:
    """``"10%"`` or ``"10"`` as 10.0. Raises `InvalidConfig` for anything but a number
    strictly between 0 and 100, with or without ``%``."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise InvalidConfig("--canary", f"expected a percentage such as 10%, got {text!r}",
                            "canary") from None
    if value != value:  # NaN
        raise InvalidConfig("--canary", f"expected a percentage such as 10%, got {text!r}",
                            "canary")
    return check_percent(value, "--canary")
