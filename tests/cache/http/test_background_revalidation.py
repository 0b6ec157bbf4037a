"""The background revalidation of stale-while-revalidate (the stage's `_background`):
the stale entry goes out at once and the origin is asked after it, and what the
origin answers there decides the entry as a revalidation in the foreground would:

- a 304 whose strong ETag is not the stored one may not update it (RFC 9111
  4.3.4): the entry is not refreshed (it is dropped, the next request asks again);
- a full answer that may not be stored (``no-store``) drops the entry: the next
  request goes to the origin;
- the origin is called for the same caller as the request that found the entry
  stale (its principal), since its answer is stored under that caller's scope.
"""

from __future__ import annotations

from collections.abc import Awaitable

from runtime.net.message import Request, Response
from runtime.pipeline.stage import Context
from runtime.security.principal import Principal
from tests.cache.http.helpers import Harness, Origin, ok, outcome, request

SWR = "max-age=10, stale-while-revalidate=30"


class SeeingOrigin(Origin):
    """`Origin`, and the principal each call it had was made for."""

    def __init__(self) -> None:
        super().__init__()
        self.principals: list[Principal | None] = []

    def __call__(self, request: Request, ctx: Context) -> Response | Awaitable[Response]:
        self.principals.append(ctx.principal)
        return super().__call__(request, ctx)


def stale(h: Harness, principal: Principal | None = None, cc: str = SWR) -> None:
    """Store an entry (ETag "v1", fresh 10 s, then 30 s stale-while-revalidate) and
    let it go stale."""
    h.origin.answer = lambda r: ok(cc, body=b"v1", etag='"v1"')
    r, _ = h.call(request(), principal)
    assert outcome(r) == "MISS"
    h.clock.now += 15


def test_a_background_304_with_another_etag_does_not_refresh_the_entry(h: Harness) -> None:
    stale(h)
    h.origin.answer = lambda r: Response(304, [(b"etag", b'"v2"'),
                                               (b"cache-control", b"max-age=60")], b"")
    r, _ = h.call(request())
    assert (outcome(r), r.body) == ("STALE", b"v1")  # served at once
    assert h.origin.calls == 2 and h.origin.seen[1].header(b"if-none-match") == b'"v1"'
    h.origin.answer = lambda r: ok(SWR, body=b"v2", etag='"v2"')
    r, _ = h.call(request())
    # not made fresh by a 304 about another response: dropped, asked again
    assert (outcome(r), r.body) == ("MISS", b"v2") and h.origin.calls == 3


def test_a_background_304_with_the_stored_etag_refreshes_it(h: Harness) -> None:
    """The counterpart: the same 304 with the stored ETag makes the entry fresh."""
    stale(h)
    h.origin.answer = lambda r: Response(304, [(b"etag", b'"v1"'),
                                               (b"cache-control", b"max-age=60")], b"")
    h.call(request())
    r, _ = h.call(request())
    assert (outcome(r), r.body) == ("HIT", b"v1") and h.origin.calls == 2


def test_a_background_no_store_answer_drops_the_entry(h: Harness) -> None:
    stale(h)
    h.origin.answer = lambda r: ok("no-store", body=b"secret")
    r, _ = h.call(request())
    assert (outcome(r), r.body) == ("STALE", b"v1")
    assert h.origin.calls == 2
    r, _ = h.call(request())
    assert outcome(r) == "MISS" and r.body == b"secret" and h.origin.calls == 3


def test_the_background_call_is_made_for_the_caller(h: Harness) -> None:
    acme = Principal("key", "acme", ("*",), key_id="acme")
    h.origin = origin = SeeingOrigin()
    shared = "s-maxage=10, stale-while-revalidate=30"  # a caller's: stored per tenant
    stale(h, acme, shared)
    h.origin.answer = lambda r: ok(shared, body=b"new")
    r, _ = h.call(request(), acme)
    assert outcome(r) == "STALE" and origin.calls == 2
    assert origin.principals == [acme, acme]
    r, _ = h.call(request(), acme)
    assert (outcome(r), r.body) == ("HIT", b"new")  # stored under acme's scope
