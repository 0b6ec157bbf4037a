"""The events stage without sockets: Requests through a Chain with the real
request_id, events and (where it matters) security stages."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.functions.router import Router
from runtime.net.message import Request, Response
from runtime.observe.event import AIUsage, Event
from runtime.pipeline.stage import Context, Next, Result
from runtime.pipeline.stages.events import _ms
from runtime.pipeline.stages.ratelimit import RateLimit
from runtime.pipeline.targets import Targets
from runtime.security.principal import Principal
from runtime.security.settings import RateLimitSettings, RateRule
from tests.observe.events.helpers import Answer, Decide, events_chain, request, run
from tests.support import own_records


class Boom:
    name = "boom"

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        raise RuntimeError("a stage that breaks")


class Who:
    name = "who"

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        ctx.principal = Principal(kind="key", tenant="acme", key_id="k_123", subject="user-9")
        ctx.bot = "browser"
        return call_next(request, ctx)


class Stream:
    name = "stream"

    def __init__(self) -> None:
        self.closed = False

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        async def body() -> AsyncIterator[bytes]:
            try:
                for part in (b"abc", b"defg", b"hi"):
                    yield part
            finally:
                self.closed = True
        return Response(200, [], body())


def test_one_event_per_request_with_what_the_request_was() -> None:
    app, seen, _ = events_chain(Who(), Answer(201, b"hello!"))
    req = request(b"/hello", b"a=1", b"POST", b"12345")
    response = run(app(req))
    assert isinstance(app(request()), Response), "the events stage keeps the chain synchronous"
    first = seen.events[0]
    assert len(seen.events) == 2
    rid = dict(response.headers)[b"x-request-id"].decode()
    assert (first.rid, first.ts, first.pop, first.tier, first.geo) == (rid, 1000.0, "pop-a",
                                                                       "regional", "fra")
    assert (first.method, first.host, first.path, first.query, first.status) == (
        "POST", "example.com", "/hello", "a=1", 201)
    assert (first.client, first.bot, first.tenant, first.key_id, first.subject) == (
        "192.0.2.7", "browser", "acme", "k_123", "user-9")
    assert (first.bytes_in, first.bytes_out) == (5, 6)
    assert set(first.stages_ms) == {"request_id", "events", "who", "answer"}
    assert 0 <= first.duration_ms < 1000
    assert first.duration_ms == round(first.duration_ms, 3), "milliseconds to the microsecond"
    assert seen.events[1].rid != rid


def test_a_contained_error_and_a_404_are_events_too() -> None:
    app, seen, _ = events_chain(Boom())
    assert run(app(request())).status == 500
    app404, seen404, _ = events_chain()
    assert run(app404(request(b"/nowhere"))).status == 404
    (crashed,), (missing,) = seen.events, seen404.events
    assert (crashed.status, crashed.error) == (500, "internal_error")
    assert (missing.status, missing.path) == (404, "/nowhere")


def test_a_rate_limit_refusal_is_an_event_with_its_decision() -> None:
    targets = Targets(SimpleNamespace(router=Router(), canaries={}), {})  # type: ignore[arg-type]
    limit = RateLimit(RateLimitSettings(rules=[RateRule("ip", "1/minute")]), targets)
    try:
        app, seen, _ = events_chain(limit, Answer())
        statuses = [run(app(request())).status for _ in range(2)]
    finally:
        limit.close()
    assert statuses == [200, 429]
    assert [e.status for e in seen.events] == [200, 429]
    assert seen.events[0].decisions["ratelimit"] == {"limited": None}
    assert seen.events[1].decisions["ratelimit"]["limited"] is not None
    assert seen.events[1].error == "rate_limited"


def test_a_stream_is_an_event_when_it_ends_with_the_bytes_sent() -> None:
    stream = Stream()
    app, seen, _ = events_chain(stream)
    response = run(app(request()))
    assert seen.events == []  # not before the body went

    async def read() -> bytes:
        assert not isinstance(response.body, bytes)
        return b"".join([c async for c in response.body])
    assert asyncio.run(read()) == b"abcdefghi"
    (event,) = seen.events
    assert (event.status, event.bytes_out) == (200, 9)


def test_a_client_going_away_mid_stream_is_one_event_with_what_was_sent() -> None:
    stream = Stream()
    app, seen, _ = events_chain(stream)
    response = run(app(request()))

    async def read_one_then_leave() -> None:
        body = response.body
        assert not isinstance(body, bytes)
        it = aiter(body)
        assert await anext(it) == b"abc"
        await it.aclose()  # type: ignore[attr-defined]
    asyncio.run(read_one_then_leave())
    (event,) = seen.events
    assert event.bytes_out == 3 and stream.closed


def test_a_head_of_a_stream_sent_nothing_whatever_its_first_chunk_held() -> None:
    """The front takes a HEAD's first chunk (to start the stream's wrappers) and
    sends none: its event says 0 bytes out, not that chunk's size (which is 0 or not
    by the isolate's timing: a flaky event)."""
    stream = Stream()
    app, seen, _ = events_chain(stream)
    response = run(app(request(method=b"HEAD")))

    async def take_one_and_stop() -> None:
        body = response.body
        assert not isinstance(body, bytes)
        it = aiter(body)
        assert await anext(it) == b"abc"
        await it.aclose()  # type: ignore[attr-defined]
    asyncio.run(take_one_and_stop())
    (event,) = seen.events
    assert (event.method, event.bytes_out) == ("HEAD", 0) and stream.closed


def test_a_head_sends_no_body_bytes_whatever_its_length() -> None:
    """A HEAD's answer carries its body's length, not the body: it counted as sent
    (`bytes_out`, and so `edgefn_response_bytes_total`)."""
    app, seen, _ = events_chain(Answer(200, b"twenty-six bytes of a body"))
    run(app(request(method=b"HEAD")))
    run(app(request(method=b"GET")))
    assert [(e.method, e.bytes_out) for e in seen.events] == [("HEAD", 0), ("GET", 26)]


def test_hosts_are_decoded_once_but_long_or_many_are_not_kept() -> None:
    """1,024 distinct 30 KB Hosts were kept for good (~80 MB a worker), and every
    real host after them decoded on each request."""
    from runtime.pipeline.stages import events

    events._texts.clear()
    app, seen, _ = events_chain(Answer())
    for i in range(events.MAX_TEXTS + 5):
        req = request()
        req.host = b"h%05d" % i + b"a" * (events.MAX_TEXT_BYTES if i % 2 else 10)
        run(app(req))
    assert len(seen.events) == events.MAX_TEXTS + 5
    assert all(len(raw) <= events.MAX_TEXT_BYTES for raw in events._texts)
    assert 0 < len(events._texts) <= events.MAX_TEXTS
    req = request()
    req.host = b"real.example"
    run(app(req))
    assert seen.events[-1].host == "real.example" and b"real.example" in events._texts


def test_an_observer_that_raises_is_logged_once_and_the_rest_still_get_events(
        caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def observe(self, event: Event) -> None:
            raise ValueError("observer bug")

    app, seen, ring = events_chain(Answer())
    app.stages[1].observers.observers = (Broken(), *app.stages[1].observers.observers)  # type: ignore[attr-defined]
    with caplog.at_level(logging.ERROR, "edgefn.events"):
        statuses = [run(app(request())).status for _ in range(3)]
    assert statuses == [200] * 3 and len(seen.events) == 3 and len(ring) == 3
    assert [r.getMessage().count("failed") for r in own_records(caplog, "edgefn.events")] == [1]


def test_the_openai_apis_record_becomes_the_events_ai_and_leaves_decisions() -> None:
    usage = AIUsage(operation="chat", model="smollm2-135m", prompt_tokens=12,
                    completion_tokens=30, ttft_ms=40.0, tokens_per_s=90.0,
                    finish_reason="stop", prompt="mail me at bob@example.com")
    app, seen, _ = events_chain(Decide("ai", usage), Answer())
    run(app(request(b"/v1/chat/completions", method=b"POST")))
    (event,) = seen.events
    assert event.ai is usage and "ai" not in event.decisions
    assert event.ai.prompt is None  # [events] prompts = false: never recorded
    app, seen, _ = events_chain(Decide("ai", AIUsage(operation="chat", model="m",
                                                     prompt="mail me at bob@example.com")),
                                Answer(), prompts=True)
    run(app(request(b"/v1/chat/completions", method=b"POST")))
    assert seen.events[0].ai is not None and seen.events[0].ai.prompt == "mail me at [email]"


def test_an_ai_cache_hit_says_its_prompt_tokens_were_cached() -> None:
    hit = {"outcome": "hit-semantic", "similarity": 0.97, "cached_tokens": 21}
    app, seen, _ = events_chain(Decide("ai_cache", hit), Answer())
    run(app(request(b"/v1/chat/completions", method=b"POST",
                    body=b'{"model": "smollm2-135m", "stream": true, "messages": []}')))
    (event,) = seen.events
    assert event.ai == AIUsage(operation="chat", model="smollm2-135m", prompt_tokens=21,
                               cached_tokens=21, stream=True)
    assert event.decisions["ai_cache"] is hit
    # what a miss's event says of the request, a hit's says too (user, sampling, cap)
    app, seen, _ = events_chain(Decide("ai_cache", hit), Answer())
    run(app(request(b"/v1/chat/completions", method=b"POST", body=(
        b'{"model": "m", "user": "alice@example.com", "temperature": 0.2, '
        b'"max_completion_tokens": 9, "stream": null}'))))
    assert seen.events[0].ai == AIUsage(operation="chat", model="m", prompt_tokens=21,
                                        cached_tokens=21, user="alice@example.com",
                                        temperature=0.2, max_tokens=9)
    app, seen, _ = events_chain(Decide("ai_cache", {"outcome": "miss"}), Answer())
    run(app(request(b"/v1/chat/completions", method=b"POST", body=b"{}")))
    assert seen.events[0].ai is None


def test_sampling_keeps_the_share_asked_for_and_every_error() -> None:
    draws = iter([0.2, 0.7, 0.9])
    app, seen, ring = events_chain(Answer(), rand=lambda: next(draws), sample=0.5)
    run(app(request()))
    run(app(request()))
    app500, seen500, ring500 = events_chain(Boom(), rand=lambda: next(draws), sample=0.5)
    run(app500(request()))
    assert [e.sampled for e in seen.events] == [True, False]  # observers still see both
    assert len(ring) == 1 and len(ring500) == 1 and seen500.events[0].sampled


def test_redacted_fields_are_blanked_before_any_observer_sees_them() -> None:
    app, seen, _ = events_chain(Who(), Answer(), redact=["query", "client", "tenant", "path"])
    run(app(request(b"/secret/place", b"token=abc")))
    (e,) = seen.events
    assert (e.query, e.client, e.tenant, e.path) == ("[redacted]", "[redacted]", None,
                                                     "[redacted]")
    assert e.key_id == "k_123"  # not asked for


def test_redaction_reaches_the_decisions_that_repeat_a_field_and_leaves_empty_ones() -> None:
    """The HTTP cache's key (``fn@v host/path?query``) carried a redacted query into
    events, the JSONL file and trace spans; auth's record a redacted tenant."""
    cache = {"outcome": "MISS", "key": "f@1 h/secret?api_key=SECRET"}
    auth = {"mode": "key", "result": "ok", "key_id": "k_1", "tenant": "acme"}
    app, seen, _ = events_chain(Decide("http_cache", cache), Decide("auth", auth), Answer(),
                                redact=["query", "tenant"])
    run(app(request(b"/secret", b"api_key=SECRET")))
    run(app(request(b"/plain", b"")))
    (e, plain) = seen.events
    assert e.decisions["http_cache"] == {"outcome": "MISS", "key": "[redacted]"}
    assert e.decisions["auth"] == {**auth, "tenant": "[redacted]"}
    assert cache["key"] == "f@1 h/secret?api_key=SECRET"  # the stage's own record kept
    assert (e.query, plain.query) == ("[redacted]", "")  # no query: none to hide
    app, seen, _ = events_chain(Decide("http_cache", cache), Answer(), redact=["client"])
    run(app(request()))
    assert seen.events[0].decisions["http_cache"] == cache  # the key holds no client


def test_redaction_leaves_the_requests_own_decisions_alone() -> None:
    """The event gets a masked copy of the decisions; the dict the stages wrote (the
    request's, read by later stages and traces) keeps what they recorded."""
    from runtime.observe.redact import MASK, Redactor

    decisions = {"http_cache": {"outcome": "MISS", "key": "f@1 h/p?q=SECRET"},
                 "auth": {"tenant": "acme"}}
    e = Event(ts=1.0, rid="r", pop="p", tier="edge", client="c", method="GET", host="h",
              path="/p", status=200, query="q=SECRET", decisions=decisions)
    redacted = Redactor(["query", "tenant"])(e)
    assert redacted.decisions == {"http_cache": {"outcome": "MISS", "key": MASK},
                                  "auth": {"tenant": MASK}}
    assert decisions == {"http_cache": {"outcome": "MISS", "key": "f@1 h/p?q=SECRET"},
                         "auth": {"tenant": "acme"}}


@pytest.mark.parametrize("path, body, operation, model", [
    (b"/v1/completions", b'{"model": "m"}', "text_completion", "m"),
    (b"/v1/embeddings", b"", "embeddings", ""),  # a body that is no JSON: no model named
    (b"/v1/other", b"{}", "chat", ""),  # a path of no operation: a chat's
])
def test_an_ai_cache_hit_names_its_operation_and_counts_no_tokens_it_did_not_say(
        path: bytes, body: bytes, operation: str, model: str) -> None:
    app, seen, _ = events_chain(Decide("ai_cache", {"outcome": "hit"}), Answer())
    run(app(request(path, method=b"POST", body=body)))
    assert seen.events[0].ai == AIUsage(operation=operation, model=model, prompt_tokens=0,
                                        cached_tokens=0)


def test_a_waf_refusal_is_an_event_with_the_rules_that_matched() -> None:
    from runtime.security.settings import WafSettings
    from tests.security.test_waf_stage import SQLI
    from tests.security.test_waf_stage import stage as waf_stage

    app, seen, _ = events_chain(waf_stage(WafSettings(mode="block")), Answer())
    req = request(b"/shop", SQLI)
    assert run(app(req)).status == 403
    (event,) = seen.events
    assert (event.status, event.error, event.query) == (403, "waf_blocked", SQLI.decode())
    assert event.decisions["waf"]["blocked"] is True
    assert event.decisions["waf"]["rules"] == [942100, 949110]


def test_the_signed_tenant_a_hop_carries_is_never_in_an_event() -> None:
    """It admits the call at the tier above (in place of a key): an event, which a
    tenant's key may read, held it for replay (review of the forwarded-tenant fix)."""
    record = {"result": "ok", "tenant_region": "emea", "forward": "acme-eu;0123abcd"}
    app, seen, _ = events_chain(Decide("residency", record), Answer())
    assert run(app(request())).status == 200
    assert seen.events[0].decisions["residency"] == {"result": "ok", "tenant_region": "emea"}
    assert record["forward"] == "acme-eu;0123abcd"  # the hops still read it


class Agent:
    name = "agent"

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        ctx.agent = "crawler.example"
        return call_next(request, ctx)


def test_redacted_identities_are_absent_and_redacted_decisions_are_empty() -> None:
    """Who called is blanked to null (never "[redacted]", which reads as a value);
    `decisions` to none at all."""
    auth = {"mode": "key", "result": "ok", "key_id": "k_123", "tenant": "acme"}
    app, seen, _ = events_chain(Who(), Agent(), Decide("auth", auth), Answer(),
                                redact=["key_id", "subject", "agent", "decisions"])
    run(app(request()))
    (e,) = seen.events
    assert (e.key_id, e.subject, e.agent, e.decisions) == (None, None, None, {})
    assert (e.tenant, e.bot) == ("acme", "browser")  # not asked for


def test_a_redacted_prompt_is_masked_and_only_when_asked() -> None:
    usage = lambda: AIUsage(operation="chat", model="m", user="alice",  # noqa: E731
                            prompt="mail me at bob@example.com")
    app, seen, _ = events_chain(Decide("ai", usage()), Answer(), prompts=True,
                                redact=["prompt"])
    run(app(request(b"/v1/chat/completions", method=b"POST")))
    assert seen.events[0].ai is not None
    assert (seen.events[0].ai.prompt, seen.events[0].ai.user) == ("[redacted]", "alice")
    app, seen, _ = events_chain(Decide("ai", usage()), Answer(), prompts=True,
                                redact=["user"])
    run(app(request(b"/v1/chat/completions", method=b"POST")))
    assert seen.events[0].ai is not None
    assert (seen.events[0].ai.prompt, seen.events[0].ai.user) == ("mail me at [email]",
                                                                  "[redacted]")
    app, seen, _ = events_chain(Decide("ai", usage()), Answer(), redact=["prompt"])
    run(app(request(b"/v1/chat/completions", method=b"POST")))
    assert seen.events[0].ai is not None and seen.events[0].ai.prompt is None  # none kept


def test_a_decision_that_repeats_a_redacted_field_empty_stays_empty() -> None:
    auth = {"mode": "key", "result": "ok", "key_id": "k_1", "tenant": ""}
    app, seen, _ = events_chain(Decide("auth", auth), Answer(), redact=["tenant"])
    run(app(request()))
    assert seen.events[0].decisions["auth"] == auth


@settings(max_examples=500)
@given(st.floats(0, 3600, allow_nan=False) | st.integers(0, 10**7).map(lambda us: (us + .5) / 1e6))
def test_a_duration_rounds_as_round_ms_3_did_but_at_a_half_microsecond(seconds: float) -> None:
    """`_ms` (0f9b1c9) against ``round(ms, 3)``: the same float, except at a duration
    a half microsecond from two (5e-7 s: 0.0 ms, was 0.001), where the two
    multiplications round apart and the results are neighbours, a microsecond apart."""
    new, old = _ms(seconds), round(seconds * 1000, 3)
    assert new == round(new, 3)  # to the microsecond, as it prints
    if abs(seconds * 1e6 % 1 - 0.5) > 1e-6:
        assert new == old
    else:
        assert abs(new - old) <= 0.001 + 1e-9 * old
