"""Traces from a real PoP over loopback, exported over OTLP/HTTP by the SDK to a
real receiver (tests.observe.tracing.receiver): the server span and its stage
children, a client's traceparent honoured or (invalid) ignored, and nothing at
all with tracing off."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.observe.traceparent import parse
from tests.observe.tracing.receiver import Receiver, otlp_receiver
from tests.support import Running, function_dir, pop_thread, python_function, reactor

SERVER, INTERNAL = 2, 1  # opentelemetry.proto SpanKind values
SEEN = ("from edgefn import Response\n\n\ndef handle(request, env):\n"
        "    return Response(request.headers.get('traceparent', 'none'))\n")


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Receiver]]:
    root = tmp_path_factory.mktemp("traced")
    with otlp_receiver() as receiver, pop_thread(
            root / "data", name="pop-t", geo="fra", **{
                "tracing.enabled": True, "tracing.endpoint": receiver.url,
                "tracing.headers": {"authorization": "Bearer otlp-secret"},
                "tracing.compression": "gzip"}) as pop:
        pop.deploy(function_dir(root, "hello", reactor("")))
        pop.deploy(python_function(root, "seen", SEEN))
        yield pop, receiver


def trace_of(pop: Running, receiver: Receiver, trace_id: str, n: int) -> list[dict[str, Any]]:
    assert pop.pop.tracer is not None
    spans = receiver.wait(lambda s: len([x for x in s if x["trace_id"] == trace_id]) >= n,
                          pop.pop.tracer.flush)
    return [s for s in spans if s["trace_id"] == trace_id]


def test_a_request_is_a_server_span_with_a_child_per_stage(traced: tuple[Running, Receiver]
                                                            ) -> None:
    pop, receiver = traced
    status, headers, _ = pop.get("/hello")
    assert status == 200
    back = parse(headers["traceparent"].encode())
    assert back is not None and back.sampled
    stages = pop.pop.pipeline.names
    spans = trace_of(pop, receiver, back.trace_id, 1 + len(stages))
    servers = [s for s in spans if s["kind"] == SERVER]
    assert len(servers) == 1
    server = servers[0]
    assert server["span_id"] == back.span_id and server["parent_id"] == ""
    assert server["name"] == "GET /hello"
    a = server["attributes"]
    assert (a["http.request.method"], a["url.path"], a["http.response.status_code"]) == (
        "GET", "/hello", 200)
    assert a["edgefn.function"].startswith("hello@") and a["client.address"] == "127.0.0.1"
    assert (a["edgefn.pop"], a["edgefn.geo"]) == ("pop-t", "fra")
    assert server["resource"]["service.name"] == "pop-t"
    children = [s for s in spans if s["kind"] == INTERNAL]
    # the stages that ran for /hello (health answers its own paths only: it passed it on)
    assert [c["name"] for c in sorted(children, key=lambda c: c["start"])] == [
        f"stage {n}" for n in stages]
    for c in children:
        assert c["parent_id"] == server["span_id"]
        assert server["start"] <= c["start"] <= c["end"] <= server["end"]
    assert receiver.posts[-1]["authorization"] == "Bearer otlp-secret"
    assert receiver.posts[-1]["content-encoding"] == "gzip"  # [tracing] compression


def test_stage_decisions_are_attributes_of_their_stage_spans(traced: tuple[Running, Receiver]
                                                             ) -> None:
    pop, receiver = traced
    _, headers, _ = pop.get("/hello", headers={"user-agent": "curl/8.5.0"})
    back = parse(headers["traceparent"].encode())
    assert back is not None
    spans = {s["name"]: s for s in trace_of(pop, receiver, back.trace_id,
                                            1 + len(pop.pop.pipeline.names))}
    event = next(e for e in pop.pop.ring.events.copy() if e.rid == headers["x-request-id"])
    assert {"bots", "http_cache"} <= set(event.decisions)  # what a GET of hello decides
    for stage in ("bots", "http_cache"):
        a = spans[f"stage {stage}"]["attributes"]
        for key, value in event.decisions[stage].items():
            if value is not None:
                want = list(value) if isinstance(value, tuple) else value
                assert a[f"edgefn.{stage}.{key}"] == want, (stage, key)
    assert spans["stage http_cache"]["attributes"]["edgefn.http_cache.outcome"] in (
        "MISS", "HIT", "STALE", "BYPASS")


def test_the_clients_traceparent_is_the_parent(traced: tuple[Running, Receiver]) -> None:
    pop, receiver = traced
    trace_id, caller = secrets.token_hex(16), "00f067aa0ba902b7"  # a trace of this test's own
    status, headers, _ = pop.get("/hello", headers={
        "traceparent": f"00-{trace_id}-{caller}-01", "tracestate": "vendor=abc"})
    assert status == 200
    back = parse(headers["traceparent"].encode())
    assert back is not None and back.trace_id == trace_id and back.span_id != caller
    spans = trace_of(pop, receiver, trace_id, 2)
    server = next(s for s in spans if s["kind"] == SERVER)
    assert (server["parent_id"], server["span_id"]) == (caller, back.span_id)
    assert server["trace_state"] == "vendor=abc"


def test_a_client_that_does_not_sample_is_not_traced(traced: tuple[Running, Receiver]) -> None:
    pop, receiver = traced
    trace_id = secrets.token_hex(16)
    _, headers, _ = pop.get("/hello", headers={
        "traceparent": f"00-{trace_id}-00f067aa0ba902b7-00"})
    assert headers["traceparent"].startswith(f"00-{trace_id}-")
    assert headers["traceparent"].endswith("-00")
    # a later sampled request flushed through the same exporter: the unsampled one is absent
    _, later, _ = pop.get("/hello")
    later_id = parse(later["traceparent"].encode())
    assert later_id is not None
    trace_of(pop, receiver, later_id.trace_id, 2)
    assert not [s for s in receiver.spans if s["trace_id"] == trace_id]


@pytest.mark.parametrize("header", [
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
    "garbage",
])
def test_an_invalid_traceparent_starts_a_new_trace(traced: tuple[Running, Receiver],
                                                   header: str) -> None:
    pop, receiver = traced
    _, headers, _ = pop.get("/hello", headers={"traceparent": header})
    back = parse(headers["traceparent"].encode())
    assert back is not None and back.trace_id not in header.lower()
    server = next(s for s in trace_of(pop, receiver, back.trace_id, 2) if s["kind"] == SERVER)
    assert server["parent_id"] == "" and server["span_id"] == back.span_id


def test_tracing_off_sends_nothing_and_no_traceparent(tmp_path: Path) -> None:
    with otlp_receiver() as receiver, pop_thread(
            tmp_path / "data", **{"tracing.endpoint": receiver.url}) as pop:
        pop.deploy(function_dir(tmp_path, "hello", reactor("")))
        for _ in range(3):
            status, headers, _ = pop.get("/hello", headers={
                "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
            assert status == 200 and "traceparent" not in headers
        assert pop.pop.tracer is None and "tracing" not in pop.pop.pipeline.names
    assert receiver.posts == [] and receiver.spans == []


def test_the_function_sees_the_traceparent_of_its_requests_span(
        traced: tuple[Running, Receiver]) -> None:
    pop, _ = traced
    for sent in ({}, {"traceparent": f"00-{secrets.token_hex(16)}-00f067aa0ba902b7-01"},
                 {"traceparent": "garbage"}):
        status, headers, body = pop.get("/seen", headers=sent)
        assert status == 200
        assert body.decode() == headers["traceparent"], sent


def test_a_request_nothing_serves_is_named_by_its_method_alone(
        traced: tuple[Running, Receiver]) -> None:
    """Its path as the name made as many span names as URLs (404s for random paths)."""
    pop, receiver = traced
    status, headers, _ = pop.get("/q19874/27232")
    assert status == 404
    back = parse(headers["traceparent"].encode())
    assert back is not None
    server = next(s for s in trace_of(pop, receiver, back.trace_id, 1) if s["kind"] == SERVER)
    assert server["name"] == "GET" and server["attributes"]["url.path"] == "/q19874/27232"
