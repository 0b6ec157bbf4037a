"""A small real OTLP/HTTP trace receiver for the tests: an `http.server` thread on
a free loopback port that accepts ``POST /v1/traces`` (protobuf
``ExportTraceServiceRequest``, decoded with opentelemetry-proto's classes) and
keeps the spans, as dicts with hex ids and plain attribute values."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def value_of(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value_of(x) for x in v.array_value.values]
    return getattr(v, kind) if kind is not None else None


class Receiver:
    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.posts: list[dict[str, str]] = []  # each export's headers
        self.refuse: list[int] = []  # statuses to answer the next exports with, in order
        self.lock = threading.Lock()
        self.url = ""

    def take(self, body: bytes, headers: dict[str, str]) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = []
        for rs in request.resource_spans:
            resource = {a.key: value_of(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append({
                        "name": s.name, "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                        "parent_id": s.parent_span_id.hex(), "kind": s.kind,
                        "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                        "attributes": {a.key: value_of(a.value) for a in s.attributes},
                        "events": [e.name for e in s.events], "resource": resource,
                        "trace_state": s.trace_state})
        with self.lock:
            self.posts.append(headers)
            self.spans.extend(spans)

    def wait(self, check: Callable[[list[dict[str, Any]]], bool], flush: Callable[[], Any],
             timeout: float = 10.0) -> list[dict[str, Any]]:
        """The spans once `check` holds of them (calling `flush` first: the PoP's
        exporter is asked to send what it has, no sleeping on a batch timer)."""
        flush()
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                spans = list(self.spans)
            if check(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"spans not as expected within {timeout} s: {spans}")
            time.sleep(0.01)


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces" or \
                    self.headers.get("content-type") != "application/x-protobuf":
                self.send_response(404)
                self.end_headers()
                return
            with receiver.lock:
                refused = receiver.refuse.pop(0) if receiver.refuse else None
            if refused is not None:
                self.send_response(refused)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            receiver.take(body, {k.lower(): v for k, v in self.headers.items()})
            out = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
