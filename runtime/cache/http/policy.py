"""RFC 9111 rules of a shared cache, as pure functions of headers and a clock
reading: what may be stored and for how long, whether a stored response is
fresh, may be served stale, and answers a conditional request with 304.

Written here rather than taken from hishel 2.0's sans-IO controller
(``hishel._core._spec``, read for this): it reads ``time.time()`` itself (no
clock to inject into the property tests), computes ``Age`` from ``Date`` only
(not the time the entry spent here), has no ``stale-while-revalidate`` or
``stale-if-error``, and each request would be copied into its own
Request/Response/Headers objects and state objects, which a hit path of a few
microseconds cannot afford.

Interpretations, where the RFCs leave room:
- ``Age``: the origin runs in this PoP, so the apparent age from ``Date`` is 0;
  an entry's age is the origin's ``Age`` header plus the time it has spent here.
- ``s-maxage`` implies ``proxy-revalidate`` (RFC 9111 5.2.2.10) except where the
  response also names ``stale-while-revalidate``/``stale-if-error`` (RFC 5861):
  the explicit directive wins, as CDNs do. ``must-revalidate`` and
  ``proxy-revalidate`` always forbid serving stale.
- A response without explicit freshness is stored only when the function sets
  a ``default_ttl`` (heuristic freshness, RFC 9111 4.2.2, status permitting).
"""

from __future__ import annotations

import re
import time
from email.utils import parsedate_to_datetime
from typing import NamedTuple, Protocol

Directives = dict[str, str | None]
EMPTY: Directives = {}

# status codes this cache understands and stores given explicit freshness (never 206)
STORABLE = frozenset({200, 203, 204, 300, 301, 302, 307, 308, 404, 405, 410, 414, 501})
# of those, the heuristically cacheable ones (RFC 9110 15.1): a default_ttl applies
HEURISTIC = frozenset({200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501})
# authorized requests' responses a shared cache may store (RFC 9111 3.5)
AUTH_OK = ("public", "s-maxage", "must-revalidate")


class Freshness(NamedTuple):
    """How long a stored response is fresh and what may be done once stale (seconds)."""

    lifetime: float
    swr: float  # stale-while-revalidate window
    sie: float  # stale-if-error window
    revalidate: bool  # must-revalidate / proxy-revalidate: never served stale
    no_cache: bool  # validated with the origin before every use
    public: bool  # `public`: may be shared across callers (tenants)


class Stored(Protocol):
    """What freshness checks read of a stored entry (a `Freshness` or an entry)."""

    @property
    def lifetime(self) -> float: ...
    @property
    def revalidate(self) -> bool: ...
    @property
    def no_cache(self) -> bool: ...


def directives(value: bytes | None) -> Directives:
    """A Cache-Control value as {directive: argument or None}; names lower-cased,
    quotes removed. A malformed member is kept by name (its argument unusable)."""
    if not value:
        return EMPTY
    out: Directives = {}
    for part in value.decode("latin-1").split(","):
        name, eq, arg = part.partition("=")
        name = name.strip().lower()
        if name and name not in out:  # RFC 9111 4.2.1: the first one counts
            out[name] = arg.strip().strip('"') if eq else None
    return out


def delta(d: Directives, name: str) -> int | None:
    """`name`'s delta-seconds; None when absent. An invalid value reads as 0
    (RFC 9111 1.2.2: treat as stale); one past 2^31 as 2^31 (1.2.2's cap)."""
    if name not in d:
        return None
    return delta_seconds(d[name])


MAX_DELTA = 2**31


def delta_seconds(arg: str | bytes | None) -> int:
    """RFC 9111's delta-seconds: ASCII digits ("²" passed `isdigit` and failed
    `int`, a client's 502), capped at 2^31 (5000 digits passed it too); 0 if invalid."""
    if not arg or not arg.isascii() or not arg.isdigit():
        return 0
    return MAX_DELTA if len(arg) > 10 else min(int(arg), MAX_DELTA)


def http_date(value: bytes | None) -> float | None:
    """An HTTP-date as a POSIX time; None if absent or invalid."""
    if not value:
        return None
    try:
        return parsedate_to_datetime(value.decode("latin-1")).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


def freshness(status: int, cc: Directives, expires: bytes | None, date: bytes | None,
              now: float, authorized: bool, default_ttl: int | None) -> Freshness | str:
    """How a response may be stored by a shared cache, or why it may not be (a
    short reason: ``no-store``, ``private``, ``status``, ``authorization``,
    ``no freshness``, ``stale on arrival``)."""
    if "no-store" in cc:
        return "no-store"
    if "private" in cc:
        return "private"
    if status not in STORABLE:
        return "status"
    if authorized and not any(d in cc for d in AUTH_OK):
        return "authorization"
    lifetime = _lifetime(cc, expires, date, now)
    if lifetime is None:
        if default_ttl is None or status not in HEURISTIC:
            return "no freshness"
        lifetime = float(default_ttl)
    swr = float(delta(cc, "stale-while-revalidate") or 0)
    sie = float(delta(cc, "stale-if-error") or 0)
    revalidate = "must-revalidate" in cc or "proxy-revalidate" in cc or (
        "s-maxage" in cc and not swr and not sie)
    no_cache = "no-cache" in cc
    if lifetime <= 0 and not swr and not sie and not no_cache:
        return "stale on arrival"
    return Freshness(lifetime, swr, sie, revalidate, no_cache, "public" in cc)


def _lifetime(cc: Directives, expires: bytes | None, date: bytes | None,
              now: float) -> float | None:
    """Explicit freshness lifetime (RFC 9111 4.2.1): s-maxage, max-age, Expires."""
    for name in ("s-maxage", "max-age"):
        value = delta(cc, name)
        if value is not None:
            return float(value)
    if expires is not None:
        when = http_date(expires)
        if when is None:
            return 0.0  # an invalid Expires means already expired (5.3)
        return max(0.0, when - (http_date(date) or now))
    if "no-cache" in cc:
        return 0.0
    return None


def fresh_enough(age: float, f: Stored, req: Directives) -> bool:
    """Whether an entry of `age` may be served without asking the origin."""
    if f.no_cache or "no-cache" in req or age >= f.lifetime:
        return False
    if req is EMPTY:
        return True
    max_age = delta(req, "max-age")
    if max_age is not None and age > max_age:
        return False
    min_fresh = delta(req, "min-fresh")
    return min_fresh is None or f.lifetime - age >= min_fresh


def stale_accepted(age: float, f: Stored, req: Directives) -> bool:
    """Whether the request's ``max-stale`` (RFC 9111 5.2.1.2: any staleness without
    an argument, else at most that many seconds) accepts an entry of `age` that is
    past its lifetime; never one the origin said must be revalidated or not used
    unchecked (4.2.4), nor past the request's own ``max-age``."""
    if "max-stale" not in req or f.revalidate or f.no_cache or "no-cache" in req:
        return False
    max_age = delta(req, "max-age")
    if max_age is not None and age > max_age:
        return False
    arg = req["max-stale"]
    return arg is None or age - f.lifetime <= delta_seconds(arg)


def may_serve_stale(age: float, f: Stored, req: Directives, window: float) -> bool:
    """Whether a stale entry may still be served within `window` seconds of
    staleness (its swr or sie)."""
    if f.revalidate or f.no_cache or "no-cache" in req or window <= 0:
        return False  # no swr/sie: an entry the request found too old is never served
    return age - f.lifetime < window


ENTITY_TAG = re.compile(rb'(?:W/)?"[^"]*"')  # RFC 9110 8.8.3: a tag may hold a comma


def etag_matches(if_none_match: bytes, etag: bytes | None) -> bool:
    """If-None-Match's weak comparison (RFC 9110 13.1.2): ``*`` (a stored response
    exists: it matches with or without an ETag) or a listed tag equal to `etag`
    once ``W/`` is dropped."""
    if if_none_match.strip() == b"*":
        return True
    if etag is None:
        return False
    want = etag.strip().removeprefix(b"W/")
    return any(t.removeprefix(b"W/") == want for t in ENTITY_TAG.findall(if_none_match))


def wants_fresh(req: Directives) -> bool:
    """Whether the request asks for a response of some freshness (``max-age``,
    ``min-fresh``: a browser's reload sends max-age=0): no stale-while-revalidate
    answer then (RFC 9111 5.2.1.1, 5.2.1.3; RFC 5861 3)."""
    return "max-age" in req or "min-fresh" in req


def validates(headers: list[tuple[bytes, bytes]], stored_etag: bytes | None) -> bool:
    """Whether a 304 with `headers` may update a stored response whose ETag is
    `stored_etag` (RFC 9111 4.3.4): a strong ETag must be the stored one; a weak
    one, or none, selects it."""
    etag = next((v for k, v in headers if k == b"etag"), None)
    if etag is None or etag.strip().startswith(b"W/"):
        return True
    return stored_etag is not None and stored_etag.strip() == etag.strip()


def not_modified(if_none_match: bytes | None, if_modified_since: bytes | None,
                 etag: bytes | None, last_modified: bytes | None) -> bool:
    """Whether a conditional GET is answered 304 from the stored response (RFC
    9110 13.2.2: If-None-Match first; If-Modified-Since only without it, and only a
    date not later than now: a later one is invalid, RFC 9110 13.1.3)."""
    if if_none_match is not None:
        return etag_matches(if_none_match, etag)
    if if_modified_since is not None and last_modified is not None:
        since, modified = http_date(if_modified_since), http_date(last_modified)
        return since is not None and modified is not None and modified <= since <= time.time()
    return False
