"""Concurrent misses of one key make one origin call (a property over random
arrival schedules, origin delays and cacheability)."""

from __future__ import annotations

import asyncio
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.cache.http.cache import PASS_SECONDS
from runtime.cache.settings import HttpCacheOverride
from runtime.net.message import Request, Response
from runtime.pipeline.stage import Context
from tests.cache.http.helpers import Function, Harness, header, ok, request

PATHS = (b"/shop/a", b"/shop/b", b"/shop/c")


class SlowOrigin:
    """Answers after `ticks` loop turns; counts calls in flight per path."""

    def __init__(self, ticks: int, cacheable: dict[bytes, bool]) -> None:
        self.ticks = ticks
        self.cacheable = cacheable
        self.inflight: Counter[bytes] = Counter()
        self.calls: Counter[bytes] = Counter()
        self.overlaps: list[bytes] = []  # a call started while another one for its path flew

    async def __call__(self, r: Request, ctx: Context) -> Response:
        if self.inflight[r.path]:
            self.overlaps.append(r.path)
        self.inflight[r.path] += 1
        self.calls[r.path] += 1
        try:
            for _ in range(self.ticks):
                await asyncio.sleep(0)
            return ok("max-age=60" if self.cacheable[r.path] else "no-store", body=r.path)
        finally:
            self.inflight[r.path] -= 1


@settings(max_examples=150, deadline=None)
@given(arrivals=st.lists(st.tuples(st.sampled_from(PATHS), st.integers(0, 12)), min_size=1,
                         max_size=25),
       ticks=st.integers(1, 8), cacheable=st.lists(st.booleans(), min_size=3, max_size=3))
def test_one_origin_call_per_key_in_flight(arrivals: list[tuple[bytes, int]], ticks: int,
                                           cacheable: list[bool]) -> None:
    h = Harness()
    h.call(request(b"/shop/primer"))  # the function has stored a response: misses coalesce
    origin = SlowOrigin(ticks, dict(zip(PATHS, cacheable, strict=True)))

    async def one(path: bytes, delay: int) -> Response:
        for _ in range(delay):
            await asyncio.sleep(0)
        result = h.stage(request(path), Context("192.0.2.7:1"), origin)  # type: ignore[arg-type]
        return result if isinstance(result, Response) else await result

    async def everyone() -> list[Response]:
        return await asyncio.gather(*(one(p, d) for p, d in arrivals))

    try:
        responses = asyncio.run(everyone())
    finally:
        h.close()
    for (path, _), r in zip(arrivals, responses, strict=True):
        assert (r.status, r.body) == (200, path)
    for path, can in zip(PATHS, cacheable, strict=True):
        wanted = sum(1 for p, _ in arrivals if p == path)
        if can and wanted:
            assert origin.calls[path] == 1  # everyone else: a hit, or a follower's hit
            assert path not in origin.overlaps
    # uncacheable: the followers go to the origin themselves once the leader lands;
    # every request was either a hit or an origin call, never both or neither
    hits = sum(1 for r in responses if header(r, b"x-edgefn-cache") == b"HIT")
    assert hits == len(arrivals) - sum(origin.calls.values())


def test_concurrent_revalidations_of_one_key_make_one_origin_call() -> None:
    h = Harness()
    h.origin.answer = lambda r: (Response(304, [(b"etag", b'"v1"'),
                                                (b"cache-control", b"max-age=10")])
                                 if r.header(b"if-none-match") == b'"v1"'
                                 else ok("max-age=10", etag='"v1"'))
    h.call(request())
    h.clock.now += 11
    h.origin.slow = True

    async def burst() -> list[Response]:
        async def one() -> Response:
            result = h.stage(request(), Context("192.0.2.7:1"), h.origin)
            return result if isinstance(result, Response) else await result
        return await asyncio.gather(*(one() for _ in range(5)))

    try:
        responses = asyncio.run(burst())
    finally:
        h.close()
    assert h.origin.calls == 2 and h.origin.max_inflight == 1
    assert sorted(header(r, b"x-edgefn-cache") for r in responses) == [b"EXPIRED"] + [b"HIT"] * 4
    assert {r.body for r in responses} == {b"hello"}


def burst(h: Harness, n: int, path: bytes = b"/shop/item") -> list[Response]:
    """`n` concurrent requests for `path` through the stage to `h.origin`."""
    async def one() -> Response:
        result = h.stage(request(path), Context("192.0.2.7:1"), h.origin)
        return result if isinstance(result, Response) else await result

    async def everyone() -> list[Response]:
        return await asyncio.gather(*(one() for _ in range(n)))

    return asyncio.run(everyone())


def test_a_function_that_never_stored_a_response_is_not_queued_behind_one_call() -> None:
    h = Harness()
    h.origin.answer = lambda r: ok(None)  # no Cache-Control: never stored
    h.origin.slow = True
    try:
        responses = burst(h, 5)
    finally:
        h.close()
    assert h.origin.calls == 5 and h.origin.max_inflight == 5  # all at once, none waited
    assert {header(r, b"x-edgefn-cache") for r in responses} == {b"MISS"}


def test_a_function_that_stores_everything_coalesces_from_its_first_request() -> None:
    h = Harness(fn=Function(http=HttpCacheOverride(default_ttl=60)))
    h.origin.answer = lambda r: ok(None)
    h.origin.slow = True
    try:
        responses = burst(h, 5)
    finally:
        h.close()
    assert h.origin.calls == 1
    assert sorted(header(r, b"x-edgefn-cache") for r in responses) == [b"HIT"] * 4 + [b"MISS"]


def test_a_key_that_could_not_be_stored_passes_until_its_mark_expires() -> None:
    h = Harness()
    h.call(request(b"/shop/primer"))  # the function caches
    h.origin.answer = lambda r: ok("no-store")
    h.call(request())  # this key's response cannot be stored: hit-for-miss
    h.origin.slow = True
    try:
        burst(h, 4)
        assert h.origin.max_inflight == 4  # passed straight through, concurrently
        h.clock.now += PASS_SECONDS + 1  # the mark expires; the URL is cacheable now
        h.origin.answer = lambda r: ok("max-age=60")
        before = h.origin.calls
        responses = burst(h, 4)
    finally:
        h.close()
    assert h.origin.calls == before + 1  # coalesced again: one origin call for the burst
    assert sorted(header(r, b"x-edgefn-cache") for r in responses) == [b"HIT"] * 3 + [b"MISS"]
