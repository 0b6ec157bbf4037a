"""The OTLP protobuf the tracer writes by hand (`runtime.observe.otlp`) against
opentelemetry-proto's own classes: every message parses, holds what was given, and
is byte for byte what those classes serialize for it; and the exporter's thread
(`runtime.observe.otlp_export`) against a real receiver over loopback: batches,
retries, refusals, a full queue, an unreachable receiver, the flush at close."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from runtime.observe import otlp
from runtime.observe.otlp_export import Exporter
from tests.observe.tracing.receiver import otlp_receiver

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
SCALAR = st.one_of(st.text(), st.booleans(), INT64,
                   st.floats(allow_nan=False))  # NaN != NaN: compared apart below
VALUE = st.one_of(SCALAR, st.lists(st.text(), max_size=4), st.lists(INT64, max_size=4))
ATTRS = st.dictionaries(st.text(min_size=1, max_size=20), VALUE, max_size=8)


def pb_value(v: Any) -> AnyValue:
    """`v` as the SDK's encoder makes it (strings as UTF-8 would hold them)."""
    if isinstance(v, str):
        return AnyValue(string_value=v.encode("utf-8", "replace").decode())
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    return AnyValue(array_value=ArrayValue(values=[pb_value(x) for x in v]))


def pb_attrs(attrs: dict[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k.encode("utf-8", "replace").decode(), value=pb_value(v))
            for k, v in attrs.items()]


SPAN_ARGS = st.fixed_dictionaries({
    "trace_id": st.binary(min_size=16, max_size=16), "span_id": st.binary(min_size=8, max_size=8),
    "parent_id": st.one_of(st.just(b""), st.binary(min_size=8, max_size=8)),
    "trace_state": st.sampled_from(["", "a=1", "vendor=x,other=y-z"]),
    "name": st.text(max_size=300), "kind": st.sampled_from([1, 2, 3]),
    "start": st.integers(0, (1 << 64) - 1), "end": st.integers(0, (1 << 64) - 1),
    "status": st.sampled_from([0, 1, 2]), "message": st.text(max_size=200),
    "flags": st.sampled_from([otlp.HAS_IS_REMOTE, otlp.HAS_IS_REMOTE | otlp.IS_REMOTE]),
    "attrs": ATTRS, "first_token": st.one_of(st.none(), st.integers(0, (1 << 64) - 1))})


@settings(max_examples=300, deadline=None)
@given(SPAN_ARGS)
def test_a_span_is_the_bytes_opentelemetry_proto_serializes(a: dict[str, Any]) -> None:
    events = otlp.event("gen_ai.first_token", a["first_token"]) \
        if a["first_token"] is not None else b""
    ours = otlp.span(a["trace_id"], a["span_id"], a["parent_id"], a["trace_state"], a["name"],
                     a["kind"], a["start"], a["end"], otlp.attributes(b"\x4a", a["attrs"]),
                     events, a["status"], a["message"], a["flags"])
    want = Span(trace_id=a["trace_id"], span_id=a["span_id"], parent_span_id=a["parent_id"],
                trace_state=a["trace_state"], name=a["name"].encode("utf-8", "replace").decode(),
                kind=a["kind"], start_time_unix_nano=a["start"], end_time_unix_nano=a["end"],
                attributes=pb_attrs(a["attrs"]),
                events=[Span.Event(time_unix_nano=a["first_token"], name="gen_ai.first_token")]
                if a["first_token"] is not None else None,
                status=Status(code=a["status"],  # type: ignore[arg-type]
                              message=a["message"].encode("utf-8", "replace").decode()),
                flags=a["flags"])
    assert ours == want.SerializeToString()
    parsed = Span()
    parsed.ParseFromString(ours)
    assert parsed == want


def test_values_no_attribute_holds_are_left_out() -> None:
    """None, a dict, a mixed list, an int past int64: dropped, as the SDK drops them;
    a NaN stays a NaN."""
    attrs = {"none": None, "dict": {"a": 1}, "mixed": [1, "a"], "big": 1 << 63,
             "small": -(1 << 63) - 1, "nan": float("nan"), "kept": "yes"}
    parsed = Span()
    parsed.ParseFromString(otlp.span(b"t" * 16, b"s" * 8, b"", "", "n", 1, 0, 0,
                                     otlp.attributes(b"\x4a", attrs)))
    got = {kv.key: kv.value for kv in parsed.attributes}
    assert set(got) == {"nan", "kept"}
    assert got["nan"].double_value != got["nan"].double_value and got["kept"].string_value == "yes"


@settings(max_examples=50, deadline=None)
@given(ATTRS, st.lists(st.binary(min_size=8, max_size=8), min_size=1, max_size=5))
def test_a_request_is_the_bytes_opentelemetry_proto_serializes(
        resource: dict[str, Any], ids: list[bytes]) -> None:
    spans = [otlp.span(b"t" * 16, i, b"", "", "s", 1, 1, 2) for i in ids]
    ours = otlp.request(otlp.resource(resource), otlp.scope("edgefn"),
                        [otlp.entries(spans[:1]), otlp.entries(spans[1:])])
    want = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=Resource(attributes=pb_attrs(resource)),
        scope_spans=[ScopeSpans(scope=InstrumentationScope(name="edgefn"), spans=[
            Span(trace_id=b"t" * 16, span_id=i, name="s", kind=1, start_time_unix_nano=1,
                 end_time_unix_nano=2, status=Status(), flags=otlp.HAS_IS_REMOTE)
            for i in ids])])])
    assert ours == want.SerializeToString()


# -- the exporter ----------------------------------------------------------------------------
def exporter(url: str, **kw: Any) -> Exporter:
    args: dict[str, Any] = {"headers": {"x-key": "k"}, "timeout": 2.0, "batch_delay_ms": 60_000,
                            "max_queue": 1024, "compression": "none", **kw}
    return Exporter(url, args["headers"], args["timeout"], args["batch_delay_ms"],
                    args["max_queue"], otlp.resource({"service.name": "t"}),
                    otlp.scope("edgefn"), args["compression"])


def spans(n: int, first: int = 0) -> bytes:
    return otlp.entries(otlp.span(b"t" * 16, (first + i + 1).to_bytes(8, "big"), b"", "", "s",
                                  1, 1, 2) for i in range(n))


def test_queued_spans_go_at_flush_in_one_export_with_the_headers() -> None:
    with otlp_receiver() as receiver:
        e = exporter(receiver.url)
        try:
            e.add(3, spans(3))
            e.add(2, spans(2, 3))
            assert e.flush(5.0)
            assert [s["span_id"] for s in receiver.spans] == [f"{i:016x}" for i in range(1, 6)]
            assert len(receiver.posts) == 1 and receiver.posts[0]["x-key"] == "k"
            assert receiver.spans[0]["resource"] == {"service.name": "t"}
            assert e.sent == 5
        finally:
            e.close()


def test_gzip_compresses_each_export() -> None:
    with otlp_receiver() as receiver:
        e = exporter(receiver.url, compression="gzip")
        try:
            e.add(3, spans(3))
            assert e.flush(5.0)
            assert len(receiver.spans) == 3 and receiver.posts[0]["content-encoding"] == "gzip"
        finally:
            e.close()
    with otlp_receiver() as receiver:
        e = exporter(receiver.url)
        try:
            e.add(1, spans(1))
            assert e.flush(5.0)
            assert len(receiver.spans) == 1 and "content-encoding" not in receiver.posts[0]
        finally:
            e.close()


def test_a_batch_delay_sends_without_a_flush() -> None:
    with otlp_receiver() as receiver:
        e = exporter(receiver.url, batch_delay_ms=50)
        try:
            e.add(1, spans(1))
            deadline = time.monotonic() + 5
            while not receiver.spans and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(receiver.spans) == 1
        finally:
            e.close()


def test_a_busy_receiver_is_tried_again_and_a_refusal_is_not(
        caplog: pytest.LogCaptureFixture) -> None:
    """503 twice, then 200: the batch arrives once (backing off 0.25 s, then 0.5 s);
    400: dropped at once, logged with the spans it lost."""
    with otlp_receiver() as receiver:
        e = exporter(receiver.url)
        try:
            receiver.refuse = [503, 503]
            e.add(4, spans(4))
            started = time.monotonic()
            assert e.flush(5.0)
            assert 0.7 <= time.monotonic() - started < 3.0
            assert len(receiver.spans) == 4 and receiver.refuse == []
            receiver.refuse = [400]
            with caplog.at_level(logging.WARNING, "edgefn.tracing"):
                e.add(2, spans(2, 4))
                started = time.monotonic()
                assert e.flush(5.0)
            assert time.monotonic() - started < 0.5
            assert len(receiver.spans) == 4 and e.sent == 4
            assert "2 spans dropped" in caplog.text and "HTTP 400" in caplog.text
        finally:
            e.close()


def test_past_max_queue_spans_are_dropped_and_said(caplog: pytest.LogCaptureFixture) -> None:
    with otlp_receiver() as receiver:
        e = exporter(receiver.url, max_queue=16)
        try:
            with caplog.at_level(logging.WARNING, "edgefn.tracing"):
                for i in range(3):
                    e.add(8, spans(8, 8 * i))
            assert e.lost == 8 and "8 spans dropped (the queue is full" in caplog.text
            assert e.flush(5.0)
            assert len(receiver.spans) == 16 and e.sent == 16
        finally:
            e.close()


def test_an_unreachable_receiver_costs_at_most_the_timeout(
        caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1/traces"
    e = exporter(url, timeout=0.6)
    try:
        with caplog.at_level(logging.WARNING, "edgefn.tracing"):
            e.add(3, spans(3))
            started = time.monotonic()
            assert e.flush(5.0)
            took = time.monotonic() - started
        assert 0.2 <= took < 1.0  # retried (0.25 s), then dropped within the timeout
        assert "3 spans dropped" in caplog.text and e.sent == 0
    finally:
        e.close()


def test_close_sends_what_is_queued() -> None:
    with otlp_receiver() as receiver:
        e = exporter(receiver.url)
        e.add(5, spans(5))
        e.close()
        assert len(receiver.spans) == 5 and not e.thread.is_alive()


def test_close_with_the_receiver_gone_tries_each_batch_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """A PoP stopping (its SIGTERM grace) does not back off and retry for `timeout`."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1/traces"
    e = exporter(url, timeout=5.0)
    e.add(2, spans(2))
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, "edgefn.tracing"):
        e.close()
    assert time.monotonic() - started < 0.5 and not e.thread.is_alive()
    assert e.lost == 2 and "2 spans dropped" in caplog.text
