"""The http_cache stage, rule by rule (RFC 9111 sections), without sockets."""

from __future__ import annotations

import asyncio
from email.utils import formatdate
from typing import get_args

import msgspec
import pytest

from runtime.ai.openai_api import OpenAITarget
from runtime.cache.http.cache import _split_url, origin_host
from runtime.cache.settings import HttpCacheOverride, HttpCacheSettings
from runtime.net.message import Request, Response
from runtime.observe.event import Event
from runtime.observe.redact import Redactor
from runtime.observe.settings import Redactable
from runtime.observe.tracing import _decided
from runtime.pipeline.stage import Context
from runtime.pipeline.stages.http_cache import NOT_STORED
from runtime.security.principal import Principal
from tests.cache.http.helpers import Function, Harness, header, ok, outcome, request

LM = "Tue, 14 Nov 2023 22:00:00 GMT"


def test_miss_then_hit_with_age(h: Harness) -> None:
    r, ctx = h.call(request())
    assert (r.status, outcome(r), r.body) == (200, "MISS", b"hello")
    h.clock.now += 42
    r, ctx = h.call(request())
    assert (outcome(r), header(r, b"age"), r.body) == ("HIT", b"42", b"hello")
    assert h.origin.calls == 1
    # dated when it was stored (the front dates only what has no Date): Age counts from it
    assert header(r, b"date") == formatdate(h.clock.now - 42, usegmt=True).encode()
    assert ctx.decisions is not None
    d = ctx.decisions["http_cache"]
    assert (d["outcome"], d["key"], d["age"], d["bytes"]) == (
        "HIT", "shop@v1 example.com/shop/item", 42, 5)


def test_a_hit_is_synchronous_even_when_the_origin_is_not(h: Harness) -> None:
    h.origin.slow = True
    h.call(request())

    async def hit() -> object:
        return h.stage(request(), Context("192.0.2.7:1"), h.origin)

    result = asyncio.run(hit())
    assert isinstance(result, Response) and outcome(result) == "HIT"


def test_origin_age_counts_and_expiry_at_lifetime(h: Harness) -> None:  # 4.2.3
    h.origin.answer = lambda r: ok("max-age=60", age="50")
    h.call(request())
    h.clock.now += 9
    r, _ = h.call(request())
    assert (outcome(r), header(r, b"age")) == ("HIT", b"59")
    h.clock.now += 1
    r, _ = h.call(request())
    assert outcome(r) == "EXPIRED" and h.origin.calls == 2


def test_head_is_served_from_the_get_entry(h: Harness) -> None:
    h.call(request())
    r, _ = h.call(request(method=b"HEAD"))
    assert (outcome(r), r.body) == ("HIT", b"hello")  # the front sends no body for HEAD
    assert h.origin.calls == 1


def test_head_on_a_stale_entry_leaves_it_for_a_get_to_revalidate(h: Harness) -> None:
    h.origin.answer = lambda r: ok("max-age=10", etag='"v1"')
    h.call(request())
    h.clock.now += 11
    r, _ = h.call(request(method=b"HEAD"))
    assert outcome(r) == "MISS" and h.origin.seen[-1].method == b"HEAD"
    h.origin.answer = lambda r: Response(304, [(b"etag", b'"v1"'),
                                               (b"cache-control", b"max-age=10")])
    r, _ = h.call(request())
    assert (outcome(r), r.body) == ("EXPIRED", b"hello")  # the entry was still there


def test_head_miss_goes_to_the_origin_and_stores_nothing(h: Harness) -> None:
    r, _ = h.call(request(method=b"HEAD"))
    r, _ = h.call(request())
    assert outcome(r) == "MISS" and h.origin.calls == 2


@pytest.mark.parametrize("cond", [{"if_none_match": '"v1"'}, {"if_none_match": 'W/"v1"'},
                                  {"if_modified_since": LM}])
def test_304_from_the_cache(h: Harness, cond: dict[str, str]) -> None:
    h.origin.answer = lambda r: ok(etag='"v1"', last_modified=LM)
    h.call(request())
    r, _ = h.call(request(**cond))
    assert (r.status, outcome(r), r.body) == (304, "HIT", b"")
    assert header(r, b"etag") == b'"v1"' and header(r, b"content-type") is None


def test_stale_entry_revalidated_with_validators_and_refreshed_by_304(h: Harness) -> None:
    h.origin.answer = lambda r: ok("max-age=10", etag='"v1"', last_modified=LM)
    h.call(request())
    h.clock.now += 11
    h.origin.answer = lambda r: Response(304, [(b"cache-control", b"max-age=100"),
                                               (b"etag", b'"v1"')])
    r, _ = h.call(request())
    sent = h.origin.seen[-1]
    assert sent.header(b"if-none-match") == b'"v1"'
    assert sent.header(b"if-modified-since") == LM.encode()
    assert (r.status, outcome(r), r.body, header(r, b"cache-control")) == (
        200, "EXPIRED", b"hello", b"max-age=100")
    refreshed = h.clock.now
    h.clock.now += 99
    r, _ = h.call(request())
    assert outcome(r) == "HIT" and h.origin.calls == 2  # 304 restarted freshness
    # dated when refreshed, as its Age counts (it kept the first store's Date)
    assert (header(r, b"date"), header(r, b"age")) == (
        formatdate(refreshed, usegmt=True).encode(), b"99")


def test_a_304_that_makes_the_entry_unstorable_still_reaches_the_client(h: Harness) -> None:
    """Its Set-Cookie (and new Cache-Control) were dropped with the entry: the client got
    the stored response as it was."""
    h.origin.answer = lambda r: ok("max-age=1", etag='"r7"')
    h.call(request())
    h.clock.now += 2
    h.origin.answer = lambda r: Response(304, [(b"cache-control", b"max-age=60"),
                                               (b"etag", b'"r7"'), (b"set-cookie", b"sid=1")])
    r, _ = h.call(request())
    assert (r.status, outcome(r), r.body, header(r, b"cache-control"),
            header(r, b"set-cookie")) == (200, "EXPIRED", b"hello", b"max-age=60", b"sid=1")
    h.origin.answer = lambda r: ok("max-age=1", etag='"r7"')
    r, _ = h.call(request())
    assert outcome(r) == "MISS"  # dropped: not stored with the cookie


def test_stale_entry_replaced_by_a_new_response(h: Harness) -> None:
    h.origin.answer = lambda r: ok("max-age=10", etag='"v1"')
    h.call(request())
    h.clock.now += 11
    h.origin.answer = lambda r: ok("max-age=10", body=b"new", etag='"v2"')
    r, _ = h.call(request())
    assert (outcome(r), r.body) == ("EXPIRED", b"new")
    r, _ = h.call(request())
    assert (outcome(r), r.body) == ("HIT", b"new")


def test_client_conditionals_are_answered_after_revalidation(h: Harness) -> None:
    h.origin.answer = lambda r: ok("max-age=10", etag='"v1"')
    h.call(request())
    h.clock.now += 11
    h.origin.answer = lambda r: Response(304, [(b"etag", b'"v1"'),
                                               (b"cache-control", b"max-age=10")])
    r, _ = h.call(request(if_none_match='"v1"'))
    assert (r.status, outcome(r)) == (304, "EXPIRED")


@pytest.mark.parametrize("cc", ["private", "no-store", None])
def test_client_conditionals_are_answered_from_a_response_not_stored(
        h: Harness, cc: str | None) -> None:
    """A miss asks the origin for the full response (its validators are the
    cache's to answer), so when that response is not stored the client still
    gets its 304 (it got a 200 before: the function never saw If-None-Match)."""
    h.origin.answer = lambda r: ok(cc, etag='"v1"', last_modified=LM)
    for cond in ({"if_none_match": '"v1"'}, {"if_modified_since": LM}):
        r, _ = h.call(request(**cond))
        assert (r.status, outcome(r), r.body) == (304, "MISS", b"")
        assert header(r, b"etag") == b'"v1"' and header(r, b"content-type") is None
        assert h.origin.seen[-1].header(b"if-none-match") is None
    r, _ = h.call(request(if_none_match='"v2"'))
    assert (r.status, r.body) == (200, b"hello")
    r, _ = h.call(request(method=b"POST", if_none_match='"v1"'))
    assert r.status == 200  # a conditional POST is the function's to answer


def test_a_stored_miss_answers_the_clients_validators(h: Harness) -> None:
    h.origin.answer = lambda r: ok(etag='"v1"')
    r, _ = h.call(request(if_none_match='"v1"'))
    assert (r.status, outcome(r)) == (304, "MISS")
    r, _ = h.call(request())
    assert (r.status, outcome(r), r.body) == (200, "HIT", b"hello")


def test_no_cache_response_is_validated_every_time(h: Harness) -> None:  # 5.2.2.4
    h.origin.answer = lambda r: ok("no-cache", etag='"v1"')
    h.call(request())
    h.origin.answer = lambda r: Response(304, [(b"etag", b'"v1"'),
                                               (b"cache-control", b"no-cache")])
    for _ in range(2):
        r, _ = h.call(request())
        assert (outcome(r), r.body) == ("EXPIRED", b"hello")
    assert h.origin.calls == 3


def test_request_no_cache_goes_to_the_origin(h: Harness) -> None:  # 5.2.1.4
    h.call(request())
    r, _ = h.call(request(cache_control="no-cache"))
    assert outcome(r) != "HIT" and h.origin.calls == 2


def test_request_no_store_is_not_stored(h: Harness) -> None:  # 5.2.1.5
    h.call(request(cache_control="no-store"))
    r, _ = h.call(request())
    assert outcome(r) == "MISS"


def test_stale_while_revalidate_serves_at_once_and_revalidates_once(h: Harness) -> None:
    h.origin.answer = lambda r: ok("max-age=10, stale-while-revalidate=30", etag='"v1"')
    h.call(request())
    h.clock.now += 15
    h.origin.slow = True
    h.origin.answer = lambda r: ok("max-age=10, stale-while-revalidate=30", body=b"new")

    async def burst() -> list[Response]:
        out = []
        for _ in range(5):
            result = h.stage(request(), Context("192.0.2.7:1"), h.origin)
            assert isinstance(result, Response)  # served at once
            out.append(result)
        while h.stage.tasks:
            await asyncio.sleep(0)
        return out

    served = asyncio.run(burst())
    assert [outcome(r) for r in served] == ["STALE"] * 5
    assert h.origin.calls == 2 and h.origin.seen[1].header(b"if-none-match") == b'"v1"'
    r, _ = h.call(request())
    assert (outcome(r), r.body) == ("HIT", b"new")


def test_stale_while_revalidate_window_ends(h: Harness) -> None:
    h.origin.answer = lambda r: ok("max-age=10, stale-while-revalidate=30")
    h.call(request())
    h.clock.now += 40
    r, _ = h.call(request())
    assert outcome(r) == "EXPIRED"


@pytest.mark.parametrize(("elapsed", "expect"), [(25, (200, "STALE")), (31, (500, "EXPIRED"))])
def test_stale_if_error(h: Harness, elapsed: int, expect: tuple[int, str]) -> None:
    h.origin.answer = lambda r: ok("max-age=10, stale-if-error=20")
    h.call(request())
    h.clock.now += elapsed
    h.origin.answer = lambda r: Response(500, [], b"boom")
    r, _ = h.call(request())
    assert (r.status, outcome(r)) == expect


def test_must_revalidate_never_serves_stale(h: Harness) -> None:  # 5.2.2.2
    h.origin.answer = lambda r: ok("max-age=10, stale-if-error=60, must-revalidate")
    h.call(request())
    h.clock.now += 11
    h.origin.answer = lambda r: Response(502, [], b"down")
    r, _ = h.call(request())
    assert (r.status, outcome(r)) == (502, "EXPIRED")


def test_vary_selects_variants(h: Harness) -> None:  # 4.1
    h.origin.answer = lambda r: ok(vary="Accept-Language",
                                   body=r.header(b"accept-language") or b"none")
    h.call(request(accept_language="fr"))
    h.call(request(accept_language="de"))
    r, _ = h.call(request(accept_language="fr"))
    assert (outcome(r), r.body) == ("HIT", b"fr")
    r, _ = h.call(request())
    assert (outcome(r), r.body) == ("MISS", b"none")
    r, _ = h.call(request(accept_language="de"))
    assert (outcome(r), r.body) == ("HIT", b"de")


def test_vary_star_is_never_served(h: Harness) -> None:
    h.origin.answer = lambda r: ok(vary="*")
    h.call(request())
    r, _ = h.call(request())
    assert outcome(r) == "MISS" and h.origin.calls == 2


def test_a_vary_over_16_fields_is_not_stored(h: Harness) -> None:
    """Each lookup compares every field Vary lists: a Vary of 100k names against 3000
    request headers held the loop 6-10 s a hit, every other request with it."""
    for n, stored in ((16, True), (17, False)):
        h.origin.answer = lambda r, n=n: ok(vary=", ".join(f"h{i}" for i in range(n)),
                                            body=b"%d" % n)
        query = b"n=%d" % n
        h.call(request(query=query, h3="a", h4="b"))
        r, _ = h.call(request(query=query, h3="a", h4="b"))
        assert (outcome(r), r.body) == (("HIT" if stored else "MISS"), b"%d" % n)


def test_vary_compares_every_value_of_a_repeated_field(h: Harness) -> None:
    h.origin.answer = lambda r: ok(vary="Accept, X-A")
    first = request()
    first.headers += [(b"accept", b"text/a"), (b"x-a", b"1"), (b"accept", b" text/b")]
    h.call(first)
    same = request()
    same.headers += [(b"accept", b"text/a"), (b"accept", b"text/b"), (b"x-a", b"1")]
    other = request()
    other.headers += [(b"accept", b"text/a"), (b"x-a", b"1")]
    assert outcome(h.call(same)[0]) == "HIT"
    assert outcome(h.call(other)[0]) == "MISS"


def test_vary_authorization_tells_keys_apart_however_they_are_sent(h: Harness) -> None:
    """auth takes an API key from ``x-api-key`` as from ``Authorization``: acme's public
    answer with `Vary: Authorization` was bob's, and an anonymous caller's, as a HIT."""
    h.origin.answer = lambda r: ok("public, max-age=60", vary="Authorization",
                                   body=r.header(b"x-api-key") or b"none")
    h.call(request(x_api_key="efn_acme"))
    assert [(outcome(r), r.body) for r, _ in (
        h.call(request(x_api_key="efn_acme")), h.call(request(x_api_key="efn_bob")),
        h.call(request()), h.call(request(authorization="efn_acme")))] == [
        ("HIT", b"efn_acme"), ("MISS", b"efn_bob"), ("MISS", b"none"), ("MISS", b"none")]


@pytest.mark.parametrize(("cc", "other_caller_hits"), [
    ("max-age=60", None), ("s-maxage=60", False), ("public, max-age=60", True)])
def test_authorization(h: Harness, cc: str, other_caller_hits: bool | None) -> None:  # 3.5
    h.origin.answer = lambda r: ok(cc)
    h.call(request(authorization="Bearer alice"))
    r, _ = h.call(request(authorization="Bearer alice"))
    if other_caller_hits is None:
        assert outcome(r) == "MISS"  # never stored
        return
    assert outcome(r) == "HIT"
    r, _ = h.call(request(authorization="Bearer bob"))
    assert (outcome(r) == "HIT") is other_caller_hits
    r, _ = h.call(request())
    assert (outcome(r) == "HIT") is other_caller_hits


def test_tenants_never_share_a_non_public_response(h: Harness) -> None:
    a, b = (Principal("key", t, ("*",), key_id=t) for t in ("acme", "globex"))
    h.origin.answer = lambda r: ok("s-maxage=60")
    h.call(request(x_api_key="ka"), a)
    assert outcome(h.call(request(x_api_key="ka"), a)[0]) == "HIT"
    assert outcome(h.call(request(x_api_key="kb"), b)[0]) == "MISS"
    assert outcome(h.call(request())[0]) == "MISS"
    rows = {r["tenant"]: r["outcomes"] for r in h.stats.snapshot()}
    assert rows == {"acme": {"MISS": 1, "HIT": 1}, "globex": {"MISS": 1}, "": {"MISS": 1}}


def test_a_new_version_never_serves_the_old_ones_entries(h: Harness) -> None:
    h.call(request())
    h.deploy(Function("v2"))
    r, ctx = h.call(request())
    assert outcome(r) == "MISS" and ctx.decisions["http_cache"]["key"].startswith("shop@v2")


@pytest.mark.parametrize(("method", "status", "invalidated"), [
    (b"POST", 200, True), (b"PUT", 204, True), (b"DELETE", 200, True), (b"PATCH", 302, True),
    (b"POST", 500, False), (b"POST", 404, False),
    (b"PURGE", 200, True), (b"MKCOL", 201, True),  # "methods whose safety is unknown"
    (b"OPTIONS", 200, False)])
def test_unsafe_methods_invalidate(h: Harness, method: bytes, status: int,
                                   invalidated: bool) -> None:  # 4.4
    h.call(request())
    h.origin.answer = lambda r: Response(status, [], b"")
    r, _ = h.call(request(method=method))
    assert outcome(r) == "BYPASS"
    h.origin.answer = lambda r: ok()
    r, _ = h.call(request())
    assert (outcome(r) == "MISS") is invalidated


def test_cache_tag_is_stripped_from_what_clients_see(h: Harness) -> None:
    h.origin.answer = lambda r: ok(cache_tag="a, b")
    for _ in range(2):
        r, _ = h.call(request())
        assert header(r, b"cache-tag") is None
    assert h.cache.store.index  # stored with its tags
    h.origin.answer = lambda r: ok("no-store", cache_tag="a")  # answered, not stored
    r, _ = h.call(request(b"/shop/other"))
    assert outcome(r) == "MISS" and header(r, b"cache-tag") is None
    r, _ = h.call(request(b"/shop/other", method=b"POST"))
    assert outcome(r) == "BYPASS" and header(r, b"cache-tag") is None


@pytest.mark.parametrize(("purge", "gone"), [
    ({"tag": "red"}, {b"/shop/a"}), ({"tag": "blue"}, {b"/shop/a", b"/shop/sub/b"}),
    ({"prefix": "/shop/sub/"}, {b"/shop/sub/b"}), ({"key": "http://example.com/shop/a"}, {b"/shop/a"}),
    ({"key": "/shop/c?x=1"}, {b"/shop/c"}), ({"key": "/shop/c"}, set()),
    ({"key": "http://other.com/shop/a"}, set()), ({"function": "shop"}, {b"/shop/a", b"/shop/sub/b", b"/shop/c"}),
    ({"function": "sho"}, set())])
def test_purge(h: Harness, purge: dict[str, str], gone: set[bytes]) -> None:
    tags = {b"/shop/a": "red, blue", b"/shop/sub/b": "blue", b"/shop/c": "green"}
    h.origin.answer = lambda r: ok(cache_tag=tags[r.path])
    paths = [(b"/shop/a", b""), (b"/shop/sub/b", b""), (b"/shop/c", b"x=1")]
    for p, q in paths:
        h.call(request(p, query=q))
    assert h.cache.purge(**purge) == len(gone)
    for p, q in paths:
        r, _ = h.call(request(p, query=q))
        assert (outcome(r) == "MISS") is (p in gone), p


def at(host: bytes) -> Request:
    r = request()
    r.host = host
    return r


def test_one_origin_is_one_entry_however_its_host_is_spelled(h: Harness) -> None:
    """Host is case-insensitive, :80 is http's default port and a trailing dot names
    the same name: four spellings were four entries, and a purge by URL left three."""
    calls = []
    h.origin.answer = lambda r: calls.append(r.host) or ok()
    for host in (b"example.com", b"EXAMPLE.com", b"example.com:80", b"example.com."):
        r, _ = h.call(at(host))
        assert outcome(r) == ("MISS" if host == b"example.com" else "HIT"), host
    assert calls == [b"example.com"]
    assert h.cache.purge(key="http://Example.com:80/shop/item") == 1
    r, _ = h.call(at(b"example.com."))
    assert outcome(r) == "MISS"
    r, _ = h.call(at(b"example.com:8080"))
    assert outcome(r) == "MISS"  # another port: another origin


@pytest.mark.parametrize(("response", "why"), [
    (lambda r: ok(body=b"x" * 1025), "too large"),
    (lambda r: ok(status=206), "status"),
    (lambda r: ok(set_cookie="s=1"), "set-cookie"),
    (lambda r: Response(200, [(b"cache-control", b"max-age=60")], _stream()), "streamed"),
    (lambda r: ok(None), "no freshness"),
])
def test_not_stored(response, why: str) -> None:  # type: ignore[no-untyped-def]
    h = Harness(HttpCacheSettings(disk_bytes=0, max_entry_bytes=1024))
    h.origin.answer = response
    _, ctx = h.call(request())
    assert ctx.decisions["http_cache"]["stored"] == why
    _, ctx = h.call(request())
    assert ctx.decisions["http_cache"]["outcome"] == "MISS"


async def _stream():  # type: ignore[no-untyped-def]
    yield b"chunk"


def test_range_requests_bypass(h: Harness) -> None:
    h.call(request())
    r, _ = h.call(request(range="bytes=0-1"))
    assert outcome(r) == "BYPASS" and h.origin.calls == 2


def test_default_ttl_of_a_function() -> None:
    h = Harness(fn=Function(http=HttpCacheOverride(default_ttl=30)))
    h.origin.answer = lambda r: ok(None)
    h.call(request())
    h.clock.now += 29
    assert outcome(h.call(request())[0]) == "HIT"
    h.clock.now += 1
    assert outcome(h.call(request())[0]) == "EXPIRED"  # no validator: refetched
    assert h.origin.calls == 2


def test_a_function_turns_it_off() -> None:
    h = Harness(fn=Function(http=HttpCacheOverride(enabled=False)))
    h.origin.answer = lambda r: ok(cache_tag="secret-tag")
    h.call(request())
    r, ctx = h.call(request())
    assert header(r, b"x-edgefn-cache") is None and ctx.decisions is None
    assert h.origin.calls == 2
    assert header(r, b"cache-tag") is None  # the cache's, stripped as when it is on


def test_the_openai_api_is_not_cached(h: Harness) -> None:
    h.targets.builtin = {b"/v1/embeddings": OpenAITarget()}
    for _ in range(2):
        r, ctx = h.call(request(b"/v1/embeddings"))
        assert header(r, b"x-edgefn-cache") is None and ctx.decisions is None


def test_stats_count_outcomes_bytes_and_saved_time(h: Harness) -> None:
    h.call(request())
    h.call(request())
    h.call(request())
    row, = h.stats.snapshot()
    assert (row["cache"], row["function"], row["requests"], row["hits"], row["bytes_served"]) \
        == ("http", "shop", 3, 2, 10)
    assert row["outcomes"] == {"HIT": 2, "MISS": 1}


def test_stored_entries_outlive_a_restart_on_the_disk_tier(tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings = HttpCacheSettings(memory_bytes=1 << 20, disk_bytes=1 << 20)
    h = Harness(settings, tmp_path)
    h.call(request())
    h.close()
    h2 = Harness(settings, tmp_path)
    h2.clock.now += 5
    r, _ = h2.call(request())
    assert (outcome(r), header(r, b"age"), r.body) == ("HIT", b"5", b"hello")
    h2.close()



# -- RFC 9111 cases an exploratory review found ------------------------------------------------
@pytest.mark.parametrize("status", [301, 404])
def test_a_stale_non_200_is_refreshed_by_a_304_not_answered_with_it(
        h: Harness, status: int) -> None:  # 4.3.3, 4.3.4
    """A client that sent no validator got the origin's 304 (no body) and the entry
    was dropped: refreshing was for 200s only."""
    h.origin.answer = lambda r: ok("max-age=1", status=status, body=b"moved", etag='"z"',
                                   location="/x")
    h.call(request())
    h.clock.now += 2
    h.origin.answer = lambda r: Response(304, [(b"cache-control", b"max-age=60"),
                                               (b"etag", b'"z"')])
    r, _ = h.call(request())
    assert (r.status, r.body, outcome(r)) == (status, b"moved", "EXPIRED")
    r, _ = h.call(request())
    assert (r.status, outcome(r), h.origin.calls) == (status, "HIT", 2)


def test_a_304_does_not_retype_the_stored_body(h: Harness) -> None:  # 3.2
    h.origin.answer = lambda r: Response(200, [(b"content-type", b"application/json"),
                                               (b"cache-control", b"max-age=1"),
                                               (b"etag", b'"j"')], b"{}")
    h.call(request())
    h.clock.now += 2
    h.origin.answer = lambda r: Response(304, [(b"cache-control", b"max-age=60"),
                                               (b"etag", b'"j"'),
                                               (b"content-type", b"text/plain")])
    for _ in range(2):
        r, _ = h.call(request())
        assert header(r, b"content-type") == b"application/json"


def test_a_304_for_another_strong_etag_does_not_update_the_entry(h: Harness) -> None:  # 4.3.4
    """The old body went out under the 304's new ETag (and clients' If-None-Match
    of it got 304s for the wrong content)."""
    h.origin.answer = lambda r: ok("max-age=1", body=b"old", etag='"a"')
    h.call(request())
    h.clock.now += 2
    h.origin.answer = lambda r: (Response(304, [(b"etag", b'"b"')]) if r.header(b"if-none-match")
                                 else ok("max-age=60", body=b"new", etag='"b"'))
    r, _ = h.call(request())
    assert (r.status, r.body, header(r, b"etag")) == (200, b"new", b'"b"')
    assert h.origin.seen[-1].header(b"if-none-match") is None  # asked again, whole
    r, _ = h.call(request())
    assert (r.body, outcome(r)) == (b"new", "HIT")


def test_only_if_cached_is_answered_from_storage_or_504(h: Harness) -> None:  # 5.2.1.7
    r, _ = h.call(request(cache_control="only-if-cached"))
    assert (r.status, outcome(r), h.origin.calls) == (504, "MISS", 0)
    h.origin.answer = lambda r: ok("max-age=10")
    h.call(request())
    r, _ = h.call(request(cache_control="only-if-cached"))
    assert (r.status, outcome(r)) == (200, "HIT")
    h.clock.now += 11
    r, _ = h.call(request(cache_control="only-if-cached"))
    assert (r.status, h.origin.calls) == (504, 1)  # stale: not served, not refetched


@pytest.mark.parametrize("cc", ["max-age=0", "min-fresh=700"])
def test_a_client_asking_for_freshness_gets_no_stale_while_revalidate_answer(
        h: Harness, cc: str) -> None:  # 5.2.1.1, 5.2.1.3; RFC 5861 3
    """A reload (max-age=0) got the entry at once as STALE, fresh or not."""
    h.origin.answer = lambda r: ok("max-age=600, stale-while-revalidate=600", body=b"v1")
    h.call(request())
    h.clock.now += 1
    h.origin.answer = lambda r: ok("max-age=600, stale-while-revalidate=600", body=b"v2")
    r, _ = h.call(request(cache_control=cc))
    assert (r.body, outcome(r)) == (b"v2", "EXPIRED")


def test_every_waiter_on_a_failing_origin_gets_its_stale_if_error_answer(h: Harness) -> None:
    """Only the first of concurrent requests got the stale entry; the others got the
    503 (each calling the origin in turn)."""
    h.origin.answer = lambda r: ok("max-age=1, stale-if-error=600", body=b"kept")
    h.call(request())
    h.clock.now += 2
    h.origin.slow = True
    h.origin.answer = lambda r: Response(503, [], b"down")

    async def four() -> list[Response]:
        async def one() -> Response:
            result = h.stage(request(), Context("192.0.2.7:50000"), h.origin)
            return result if isinstance(result, Response) else await result
        return list(await asyncio.gather(*(one() for _ in range(4))))

    got = asyncio.run(four())
    assert [(r.status, r.body, outcome(r)) for r in got] == [(200, b"kept", "STALE")] * 4


@pytest.mark.parametrize(("inm", "etag", "matches"), [
    (b"*", None, True),  # RFC 9110 13.1.2: any current representation
    (b'"x,y"', b'"x,y"', True), (b'"a", "x,y"', b'"x,y"', True), (b'"x"', b'"x,y"', False),
    (b'W/"a", "b"', b'"a"', True)])
def test_if_none_match_lists_are_read_as_entity_tags(inm: bytes, etag: bytes | None,
                                                     matches: bool) -> None:
    from runtime.cache.http.policy import etag_matches

    assert etag_matches(inm, etag) is matches


@pytest.mark.parametrize("status", [204, 304])
def test_the_sdk_types_no_body_of_a_204_or_304(status: int) -> None:
    """`Response("", 304)` got `content-type: text/plain`, which then replaced the
    stored response's type when it refreshed an entry."""
    from edgefn import Response as GuestResponse

    assert "content-type" not in GuestResponse("", status).headers
    assert GuestResponse("hi").headers["content-type"] == "text/plain; charset=utf-8"


def test_max_stale_accepts_a_stale_entry_within_its_bound(h: Harness) -> None:  # 5.2.1.2
    h.origin.answer = lambda r: ok("max-age=10")
    h.call(request())
    h.clock.now += 15  # 5 s past its lifetime
    for cc in ("max-stale=5", "max-stale", "max-stale=60, only-if-cached"):
        r, _ = h.call(request(cache_control=cc))
        assert (outcome(r), header(r, b"age"), r.body) == ("STALE", b"15", b"hello"), cc
    assert h.origin.calls == 1
    for cc in ("max-stale=4", "max-stale, max-age=14"):  # past its bound, or the max-age
        r, _ = h.call(request(cache_control=cc))
        assert outcome(r) != "STALE" and h.origin.calls > 1, cc
        h.clock.now += 15  # stale again for the next one


def test_max_stale_never_serves_what_must_be_revalidated(h: Harness) -> None:  # 4.2.4
    for n, cc in enumerate(("max-age=10, must-revalidate", "max-age=10, proxy-revalidate")):
        h.origin.answer = lambda r, cc=cc: ok(cc)  # type: ignore[misc]
        path = b"/mr%d" % n
        h.call(request(path))
        h.clock.now += 15
        r, _ = h.call(request(path, cache_control="max-stale"))
        assert outcome(r) != "STALE" and h.origin.calls == 2 * (n + 1), cc


def test_the_shared_not_stored_decision_is_never_changed_downstream() -> None:
    """A miss saying nothing of freshness records one shared dict (`NOT_STORED`,
    cd13996): what reads the decisions (redaction, the ring, tracing, the dashboard)
    must copy, never change it, or every later request's event would say so."""
    h = Harness()
    h.origin.answer = lambda r: ok(None)
    decided = [h.call(request(query=b"q=secret"))[1].decisions for _ in range(2)]
    assert decided[0]["http_cache"] is decided[1]["http_cache"] is NOT_STORED
    event = Event(ts=1.0, rid="r", pop="p", tier="edge", client="c", method="GET", host="h",
                  path="/shop", query="q=secret", status=200, decisions=dict(decided[0]))
    redacted = Redactor(get_args(Redactable))(msgspec.structs.replace(event))
    Redactor(["query", "path", "host"])(msgspec.structs.replace(event))
    _decided("http_cache", event.decisions["http_cache"])
    msgspec.json.encode(redacted)
    assert NOT_STORED == {"outcome": "MISS", "stored": "no freshness"}


# -- what mutation testing found unchecked in this stop's changes (`make mutate`) --------------
def test_a_304_keeps_the_stored_tags_unless_it_names_others(h: Harness) -> None:
    h.origin.answer = lambda r: ok("max-age=1", etag='"t"', cache_tag="a, b")
    h.call(request())
    h.clock.now += 2
    h.origin.answer = lambda r: Response(304, [(b"cache-control", b"max-age=1"),
                                               (b"etag", b'"t"')])
    assert outcome(h.call(request())[0]) == "EXPIRED"
    assert header(h.call(request())[0], b"cache-tag") is None  # still the cache's only
    assert h.cache.purge(tag="b") == 1  # kept, each of them
    h.origin.answer = lambda r: ok("max-age=1", etag='"t"', cache_tag="a, b")
    h.call(request())
    h.clock.now += 2
    h.origin.answer = lambda r: Response(304, [(b"cache-control", b"max-age=60"),
                                               (b"etag", b'"t"'), (b"cache-tag", b"c")])
    h.call(request())
    assert h.cache.purge(tag="a") == 0 and h.cache.purge(tag="c") == 1


def test_a_304_refreshes_the_variant_it_validated_under_the_default_ttl() -> None:
    h = Harness(fn=Function(http=HttpCacheOverride(default_ttl=30)))
    h.origin.answer = lambda r: ok(None, etag='"v"', vary="Accept-Language",
                                   body=r.header(b"accept-language") or b"none")
    h.call(request(accept_language="fr"))
    h.clock.now += 31
    h.origin.answer = lambda r: Response(304, [(b"etag", b'"v"'),
                                               (b"vary", b"Accept-Language")])
    r, _ = h.call(request(accept_language="fr"))
    assert (outcome(r), r.body) == ("EXPIRED", b"fr")
    h.clock.now += 29  # fresh again for the default TTL, as the variant it was
    r, _ = h.call(request(accept_language="fr"))
    assert (outcome(r), r.body) == ("HIT", b"fr")
    assert outcome(h.call(request(accept_language="de"))[0]) == "MISS"


def test_vary_authorization_reads_no_other_header_as_a_credential(h: Harness) -> None:
    h.origin.answer = lambda r: ok("public, max-age=60", vary="Authorization")
    h.call(request(x_api_key="efn_acme", user_agent="a"))
    assert outcome(h.call(request(x_api_key="efn_acme", user_agent="b"))[0]) == "HIT"


def test_a_repeated_field_is_one_value_joined_with_a_comma(h: Harness) -> None:
    """RFC 9110 5.3: two Accept lines are the one ``Accept: a, b``."""
    h.origin.answer = lambda r: ok(vary="Accept")
    two = request()
    two.headers += [(b"accept", b"text/a"), (b"accept", b"text/b")]
    h.call(two)
    one = request()
    one.headers.append((b"accept", b"text/a, text/b"))
    assert outcome(h.call(one)[0]) == "HIT"


def test_a_purge_by_url_splits_at_its_first_scheme_separator(h: Harness) -> None:
    h.origin.answer = lambda r: ok()
    h.call(request(query=b"u=http://x.com"))
    assert h.cache.purge(key="http://example.com/shop/item?u=http://x.com") == 1


def test_a_url_without_a_path_names_the_root_and_dots_alone_stay_a_host() -> None:
    assert _split_url("http://Example.com:80") == (b"example.com", b"/")
    assert [origin_host(h) for h in (b".", b"..:80", b"A.:80")] == [b".", b".", b"a"]
