"""RFC 9111 storage and freshness rules, case by case (`runtime.cache.http.policy`)."""

from __future__ import annotations

import pytest

from runtime.cache.http import policy
from runtime.cache.http.policy import EMPTY, Freshness

NOW = 1_700_000_000.0
DATE = b"Tue, 14 Nov 2023 22:13:20 GMT"  # == NOW
IN_90S = b"Tue, 14 Nov 2023 22:14:50 GMT"


def fresh(cc: bytes | None, status: int = 200, expires: bytes | None = None,
          date: bytes | None = None, authorized: bool = False,
          default_ttl: int | None = None) -> Freshness | str:
    return policy.freshness(status, policy.directives(cc), expires, date, NOW, authorized,
                            default_ttl)


@pytest.mark.parametrize(("section", "cc", "kw", "lifetime"), [
    ("5.2.2.1 max-age", b"max-age=60", {}, 60.0),
    ("5.2.2.10 s-maxage wins in a shared cache", b"max-age=60, s-maxage=5", {}, 5.0),
    ("4.2.1 first directive counts", b"max-age=60, max-age=1", {}, 60.0),
    ("5.3 Expires - Date", None, {"expires": IN_90S, "date": DATE}, 90.0),
    ("5.3 Expires without Date: against now", None, {"expires": IN_90S}, 90.0),
    ("5.2.2.1 max-age wins over Expires", b"max-age=7", {"expires": IN_90S}, 7.0),
    ("1.2.2 invalid max-age is stale, kept for no-cache", b"max-age=x, no-cache", {}, 0.0),
    ("4.2.2 heuristic: the function's default_ttl", None, {"default_ttl": 30}, 30.0),
    ("quoted argument", b'max-age="12"', {}, 12.0),
])
def test_freshness_lifetime(section: str, cc: bytes | None, kw: dict, lifetime: float) -> None:
    f = fresh(cc, **kw)
    assert isinstance(f, Freshness), section
    assert f.lifetime == lifetime, section


@pytest.mark.parametrize(("section", "cc", "kw", "reason"), [
    ("5.2.2.5 no-store", b"no-store, max-age=60", {}, "no-store"),
    ("5.2.2.7 private", b"private, max-age=60", {}, "private"),
    ("3 206 is never stored", b"max-age=60", {"status": 206}, "status"),
    ("3 500 is not understood as storable", b"max-age=60", {"status": 500}, "status"),
    ("3.5 authorization without public/s-maxage", b"max-age=60", {"authorized": True},
     "authorization"),
    ("4.2.2 no heuristics by default", None, {}, "no freshness"),
    ("4.2.2 heuristics only for heuristically cacheable statuses", None,
     {"status": 302, "default_ttl": 30}, "no freshness"),
    ("5.3 invalid Expires is expired", None, {"expires": b"0"}, "stale on arrival"),
    ("max-age=0 without validator or stale window", b"max-age=0", {}, "stale on arrival"),
])
def test_not_stored(section: str, cc: bytes | None, kw: dict, reason: str) -> None:
    assert fresh(cc, **kw) == reason, section


@pytest.mark.parametrize(("cc", "revalidate", "swr", "sie", "public"), [
    (b"max-age=1, must-revalidate", True, 0, 0, False),
    (b"max-age=1, proxy-revalidate", True, 0, 0, False),
    (b"s-maxage=1", True, 0, 0, False),  # 5.2.2.10: s-maxage implies proxy-revalidate
    (b"s-maxage=1, stale-while-revalidate=9", False, 9, 0, False),  # RFC 5861 named: wins
    (b"max-age=1, stale-while-revalidate=9, stale-if-error=20", False, 9, 20, False),
    (b"public, max-age=1", False, 0, 0, True),
])
def test_what_may_be_done_once_stale(cc: bytes, revalidate: bool, swr: float, sie: float,
                                     public: bool) -> None:
    f = fresh(cc)
    assert isinstance(f, Freshness)
    assert (f.revalidate, f.swr, f.sie, f.public) == (revalidate, swr, sie, public)


@pytest.mark.parametrize("cc", [b"public, max-age=5", b"s-maxage=5", b"max-age=5, must-revalidate"])
def test_authorized_responses_stored_when_the_response_allows(cc: bytes) -> None:
    assert isinstance(fresh(cc, authorized=True), Freshness)  # 3.5


@pytest.mark.parametrize(("age", "req", "fresh_"), [
    (59.0, EMPTY, True),
    (60.0, EMPTY, False),  # 4.2: fresh while age < lifetime
    (10.0, {"no-cache": None}, False),  # 5.2.1.4
    (10.0, {"max-age": "5"}, False),  # 5.2.1.1
    (5.0, {"max-age": "5"}, True),
    (50.0, {"min-fresh": "20"}, False),  # 5.2.1.3
    (40.0, {"min-fresh": "20"}, True),
])
def test_fresh_enough(age: float, req: policy.Directives, fresh_: bool) -> None:
    f = fresh(b"max-age=60")
    assert isinstance(f, Freshness)
    assert policy.fresh_enough(age, f, req) is fresh_


@pytest.mark.parametrize(("cc", "age", "may"), [
    (b"max-age=10, stale-while-revalidate=5", 14.0, True),
    (b"max-age=10, stale-while-revalidate=5", 15.0, False),
    (b"max-age=10, stale-while-revalidate=5, must-revalidate", 11.0, False),
    (b"max-age=10", 10.0, False),
])
def test_stale_windows(cc: bytes, age: float, may: bool) -> None:
    f = fresh(cc)
    assert isinstance(f, Freshness)
    assert policy.may_serve_stale(age, f, EMPTY, f.swr) is may


@pytest.mark.parametrize("req", [{"max-age": "0"}, {"min-fresh": "120"}])
def test_a_request_that_wants_fresher_is_not_served_the_entry_without_a_window(
        req: policy.Directives) -> None:
    """A browser's reload (max-age=0) got the old copy as STALE: a fresh entry failed
    the request's limit, and its negative staleness passed the empty window."""
    f = fresh(b"max-age=60")
    assert isinstance(f, Freshness)
    assert not policy.fresh_enough(5.0, f, req)
    assert not policy.may_serve_stale(5.0, f, req, f.swr)
    assert not policy.may_serve_stale(5.0, f, req, f.sie)


@pytest.mark.parametrize(("arg", "seconds"), [
    ("60", 60), ("0", 0), ("²", 0), ("٣", 0), ("-1", 0), ("1.5", 0), ("", 0), (None, 0),
    ("9" * 5000, 2**31), ("2147483649", 2**31), ("2147483647", 2**31 - 1)])
def test_delta_seconds_are_ascii_digits_capped_at_2_31(arg: str | None, seconds: int) -> None:
    """"²" passed `isdigit` and failed `int`, 5000 digits passed Python's digit limit:
    each was a 502 crash a client's Cache-Control caused on any cached URL."""
    assert policy.delta_seconds(arg) == seconds
    assert policy.delta({"max-age": arg}, "max-age") == seconds


@pytest.mark.parametrize(("inm", "ims", "etag", "modified", "answer"), [
    (b'"a"', None, b'"a"', None, True),
    (b'W/"a"', None, b'"a"', None, True),  # weak comparison
    (b'"x", "a"', None, b'W/"a"', None, True),
    (b'"b"', None, b'"a"', None, False),
    (b"*", None, b'"a"', None, True),
    (b'"b"', DATE, b'"a"', DATE, False),  # If-None-Match first: IMS ignored
    (None, DATE, None, DATE, True),
    (None, DATE, None, IN_90S, False),  # modified after
    (None, b"garbage", None, DATE, False),
    (None, b"Fri, 31 Dec 9999 23:59:59 GMT", None, DATE, False),  # later than now: invalid
])
def test_conditional_requests(inm: bytes | None, ims: bytes | None, etag: bytes | None,
                              modified: bytes | None, answer: bool) -> None:
    assert policy.not_modified(inm, ims, etag, modified) is answer


# -- what mutation testing found unchecked (`make mutate`) -------------------------------------
def test_a_condition_on_a_validator_the_entry_lacks_is_no_304() -> None:
    """A client's If-None-Match (or If-Modified-Since) against a stored response with no
    ETag (or Last-Modified) must not keep content that may be wrong."""
    assert policy.not_modified(b'"a"', None, None, None) is False
    assert policy.not_modified(None, DATE, b'"a"', None) is False


def test_max_stale_never_overrides_revalidation() -> None:
    for cc in (b"max-age=10, no-cache", b"max-age=10, must-revalidate"):
        f = fresh(cc)
        assert isinstance(f, Freshness)
        assert policy.stale_accepted(15.0, f, policy.directives(b"max-stale")) is False
    f = fresh(b"max-age=10")
    assert isinstance(f, Freshness)
    assert policy.stale_accepted(15.0, f, policy.directives(b"max-stale, no-cache")) is False
    assert policy.stale_accepted(14.0, f, policy.directives(b"max-stale, max-age=14")) is True
    assert policy.stale_accepted(14.5, f, policy.directives(b"max-stale, max-age=14")) is False


def test_a_304_without_a_strong_etag_updates_the_entry() -> None:
    assert policy.validates([(b"cache-control", b"max-age=60")], b'"a"') is True
    assert policy.validates([(b"etag", b'W/"a"')], b'"a"') is True
    assert policy.validates([(b"etag", b'"b"')], b'"a"') is False
    assert policy.validates([(b"etag", b'"a"')], b'"a"') is True


def test_expires_is_read_against_the_responses_date_not_the_clock() -> None:
    earlier = b"Tue, 14 Nov 2023 22:12:50 GMT"  # 30 s before NOW
    f = fresh(None, expires=IN_90S, date=earlier)
    assert isinstance(f, Freshness) and f.lifetime == 120.0
    assert fresh(None, expires=earlier, date=DATE) == "stale on arrival"


def test_stale_while_revalidate_of_one_second_and_a_requests_no_cache() -> None:
    f = fresh(b"max-age=10, stale-while-revalidate=1")
    assert isinstance(f, Freshness)
    assert policy.may_serve_stale(10.5, f, EMPTY, f.swr) is True
    assert policy.may_serve_stale(10.5, f, policy.directives(b"no-cache"), f.swr) is False
    assert policy.may_serve_stale(11.0, f, EMPTY, f.swr) is False
