"""A request's own wishes for the AI cache, from its headers:

- ``Cache-Control: no-cache`` or ``x-edgefn-cache: bypass``: no lookup; the
  answer is still stored (it is fresh), for exact hits;
- ``Cache-Control: no-store``: neither looked up nor stored;
- ``x-edgefn-cache-ttl: SECONDS``: the stored entry's TTL (0 < SECONDS <= 1 year).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edgefn_core.errors import ApiError
from runtime.net.message import Request

MAX_TTL = 365 * 86400.0


@dataclass(frozen=True, slots=True)
class Wishes:
    lookup: bool = True
    store: bool = True
    ttl: float | None = None


NONE = Wishes()


def wishes(request: Request) -> Wishes:
    """Raises `ApiError` (400) naming the header with a bad value."""
    lookup, store, ttl = True, True, None
    for name, value in request.headers:
        if name == b"cache-control":
            directives = {d.strip().split(b"=", 1)[0].lower() for d in value.split(b",")}
            lookup = lookup and not directives & {b"no-cache", b"no-store"}
            store = store and b"no-store" not in directives
        elif name == b"x-edgefn-cache":
            if value.strip().lower() != b"bypass":
                raise ApiError("invalid_header", 400, "header x-edgefn-cache: the only value a "
                               f"request may send is 'bypass', got {_show(value)}",
                               param="x-edgefn-cache")
            lookup = False
        elif name == b"x-edgefn-cache-ttl":
            ttl = _ttl(value)
    return Wishes(lookup, store, ttl) if (not lookup or not store or ttl) else NONE


def _ttl(value: bytes) -> float:
    try:
        ttl = float(value.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        ttl = math.nan
    if not 0 < ttl <= MAX_TTL:  # NaN fails too
        raise ApiError("invalid_header", 400, "header x-edgefn-cache-ttl: expected seconds, "
                       f"0 < SECONDS <= {MAX_TTL:.0f}, got {_show(value)}",
                       param="x-edgefn-cache-ttl")
    return ttl


def _show(value: bytes) -> str:
    return repr(value[:40].decode("latin-1"))
