"""`Tracer`: the OpenTelemetry spans of every sampled request, made from its
finished `Event` (an `Observer`), sent over OTLP/HTTP (`otlp_export.Exporter`).

Per sampled request (``event.decisions["trace"]``, recorded by the ``tracing``
stage):

    "GET /hello"              SERVER, the request; parent: the client's traceparent
    ├─ "stage request_id"     one INTERNAL child per stage, from the chain's marks
    ├─ ...                    (a stage's decisions as ``edgefn.<stage>.<key>`` attributes)
    └─ "stage openai"
       └─ "chat smollm2-135m" CLIENT, the model call (OpenTelemetry GenAI conventions)

The spans are made after the fact, with explicit start and end times, so they need
none of the SDK's live span machinery: `observe` writes them as OTLP protobuf at
once (`otlp`: ~30 us a span through the SDK's spans and encoder, a few us this way)
and queues the bytes; the exporter's thread sends them in batches. The server span
has the id the response's ``traceparent`` already announced; the others, random
ids. What they carry is what the SDK made of the same calls: the resource
(`Resource.create`: ``telemetry.sdk.*``, ``OTEL_RESOURCE_ATTRIBUTES`` and
``OTEL_SERVICE_NAME`` as the SDK reads them, under the PoP's own), the scope
``edgefn``, the parent's ``tracestate`` on every span of the request, the span
flags. `close` sends what is queued and stops the thread.
"""

from __future__ import annotations

import random
import re
from typing import Any

from opentelemetry.sdk.resources import Resource

from runtime.observe import otlp
from runtime.observe.event import Event
from runtime.observe.otlp_export import Exporter
from runtime.observe.settings_tracing import TracingSettings

# W3C trace-context's tracestate entry (the SDK's patterns) and the most it holds
MEMBER = re.compile(r"([a-z][_0-9a-z\-\*\/]{0,255}|[a-z0-9][_0-9a-z\-\*\/]{0,240}"
                    r"@[a-z][_0-9a-z\-\*\/]{0,13})"
                    r"=([\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e])")
MAX_MEMBERS = 32

_SCALARS = (str, bool, int, float)
SPAN_ATTRS = b"\x4a"  # Span.attributes' tag


def _span_id() -> bytes:
    """A random, valid (non-zero) span id, as the SDK's RandomIdGenerator draws one."""
    while True:
        n = random.getrandbits(64)
        if n:
            return n.to_bytes(8, "big")


class Tracer:
    def __init__(self, pop: str, tier: str, geo: str, settings: TracingSettings,
                 exporter: Exporter | None = None) -> None:
        """`exporter`: default, OTLP/HTTP to `settings.endpoint` with its headers,
        timeout, batch delay, queue bound and compression."""
        self.pop = {"edgefn.pop": pop, "edgefn.tier": tier, "edgefn.geo": geo}
        resource = Resource.create({"service.name": settings.service_name or pop, **self.pop})
        self.exporter = exporter if exporter is not None else Exporter(
            settings.endpoint, settings.headers, settings.timeout, settings.batch_delay_ms,
            settings.max_queue, otlp.resource(dict(resource.attributes)), otlp.scope("edgefn"),
            settings.compression)
        self.stage_spans = settings.stage_spans

    def observe(self, event: Event) -> None:
        record = event.decisions.get("trace")
        if not isinstance(record, dict) or not record.get("sampled"):
            return
        trace_id = bytes.fromhex(record["trace_id"])
        span_id = bytes.fromhex(record["span_id"])
        if "parent_id" in record:
            parent, flags = bytes.fromhex(record["parent_id"]), otlp.HAS_IS_REMOTE | otlp.IS_REMOTE
            state = _state(record.get("tracestate"))
        else:
            parent, flags, state = b"", otlp.HAS_IS_REMOTE, ""
        # the stages before `events` ran before its clock read `event.ts`
        before = 0.0
        for name, ms in event.stages_ms.items():
            if name == "events":
                break
            before += ms
        start = int((event.ts - before / 1000) * 1e9)
        # in whole ns as the stage spans add them up, so the last one ends within the request
        end = start + max(int(event.duration_ms * 1e6),
                          sum(int(ms * 1e6) for ms in event.stages_ms.values()))
        # the route; a built-in target's own path (/v1/chat/completions); else, nothing
        # served it (a 404), the method alone, as OpenTelemetry's HTTP conventions say:
        # span names stay few (the path is in url.path)
        where = event.route or (event.path if event.target else "")
        error = event.status >= 500
        spans = [otlp.span(trace_id, span_id, parent, state,
                           f"{event.method} {where}" if where else event.method,
                           otlp.SPAN_SERVER, start, end,
                           otlp.attributes(SPAN_ATTRS, self._server(event)),
                           status=otlp.STATUS_ERROR if error else otlp.STATUS_UNSET,
                           message=(event.error or "") if error else "", flags=flags)]
        at = start
        for name, ms in event.stages_ms.items() if self.stage_spans else ():
            until = at + int(ms * 1e6)
            stage_id = _span_id()
            if name == "openai" and event.ai is not None:
                spans.append(self._model(event, trace_id, stage_id, state, at, until, start))
            spans.append(otlp.span(trace_id, stage_id, span_id, state, f"stage {name}",
                                   otlp.SPAN_INTERNAL, at, until,
                                   otlp.attributes(SPAN_ATTRS,
                                                   _decided(name, event.decisions.get(name)))))
            at = until
        if event.ai is not None and not (self.stage_spans and "openai" in event.stages_ms):
            spans.append(self._model(event, trace_id, span_id, state,
                                     *self._openai(event, start, end), start))
        self.exporter.add(len(spans), otlp.entries(spans))

    @staticmethod
    def _openai(event: Event, start: int, end: int) -> tuple[int, int]:
        """When the ``openai`` stage ran (from the stage timings), else the request's."""
        at = start
        for name, ms in event.stages_ms.items():
            if name == "openai":
                return at, at + int(ms * 1e6)
            at += int(ms * 1e6)
        return start, end

    def _server(self, event: Event) -> dict[str, Any]:
        a: dict[str, Any] = {"http.request.method": event.method, "url.path": event.path,
                             "http.response.status_code": event.status,
                             "server.address": event.host, "client.address": event.client,
                             "edgefn.request_id": event.rid, **self.pop}
        if event.query:
            a["url.query"] = event.query
        if event.route:
            a["http.route"] = event.route
        if event.target is not None:
            a["edgefn.function"] = event.target
        if event.tenant is not None:
            a["edgefn.tenant"] = event.tenant
        if event.key_id is not None:
            a["edgefn.key_id"] = event.key_id
        if event.bot is not None:
            a["edgefn.bot"] = event.bot
        if event.error is not None:
            a["error.type"] = event.error
        return a

    def _model(self, event: Event, trace_id: bytes, parent: bytes, state: str, start: int,
               end: int, request_start: int) -> bytes:
        """The model call's CLIENT span (GenAI semantic conventions), a child of
        `parent`."""
        ai = event.ai
        assert ai is not None
        a: dict[str, Any] = {"gen_ai.operation.name": ai.operation, "gen_ai.system": "edgefn",
                             "gen_ai.request.model": ai.model, "gen_ai.response.model": ai.model,
                             "gen_ai.usage.input_tokens": ai.prompt_tokens,
                             "gen_ai.usage.output_tokens": ai.completion_tokens,
                             "gen_ai.request.stream": ai.stream}
        if ai.adapter is not None:
            a["edgefn.ai.adapter"] = ai.adapter
        if ai.cached_tokens:
            a["edgefn.ai.cached_tokens"] = ai.cached_tokens
        if ai.finish_reason is not None:
            a["gen_ai.response.finish_reasons"] = [ai.finish_reason]
        if ai.temperature is not None:
            a["gen_ai.request.temperature"] = ai.temperature
        if ai.max_tokens is not None:
            a["gen_ai.request.max_tokens"] = ai.max_tokens
        if ai.ttft_ms is not None:
            a["gen_ai.server.time_to_first_token"] = ai.ttft_ms / 1000
        if ai.tokens_per_s is not None:
            a["edgefn.ai.tokens_per_s"] = ai.tokens_per_s
        events = b""
        if ai.ttft_ms is not None:  # measured from the request's start
            events = otlp.event("gen_ai.first_token",
                                min(end, request_start + int(ai.ttft_ms * 1e6)))
        return otlp.span(trace_id, _span_id(), parent, state, f"{ai.operation} {ai.model}",
                         otlp.SPAN_CLIENT, start, end, otlp.attributes(SPAN_ATTRS, a), events)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Send what is queued; whether it all went (or was dropped) in time."""
        return self.exporter.flush(timeout_s)

    def close(self) -> None:
        """Send what is queued, then stop the exporting thread."""
        self.exporter.close()


def _decided(stage: str, record: Any) -> dict[str, Any]:
    """A stage's decision as span attributes: its scalar (and list-of-scalar) values."""
    if isinstance(record, _SCALARS):
        return {f"edgefn.{stage}": record}
    if not isinstance(record, dict):
        return {}
    out: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, _SCALARS):
            out[f"edgefn.{stage}.{key}"] = value
        elif isinstance(value, list | tuple) and (
                all(isinstance(v, str) for v in value)
                or all(type(v) is int for v in value)):  # WAF rule ids
            out[f"edgefn.{stage}.{key}"] = list(value)
    return out


def _state(header: Any) -> str:
    """A ``tracestate`` as the SDK writes a span's (its entries, validated, joined by
    commas; "" when none, or when one entry is invalid or a key repeats, as the SDK's
    `TraceState.from_header` drops it). Checked here: the SDK logs a warning for each
    bad entry, a PoP log line any client could add to each request."""
    if not isinstance(header, str) or not header:
        return ""
    pairs: dict[str, str] = {}
    for member in header.split(","):
        member = member.strip(" \t")
        if not member:
            continue
        found = MEMBER.fullmatch(member)
        if found is None or found.group(1) in pairs:
            return ""
        pairs[found.group(1)] = found.group(2)
    if len(pairs) > MAX_MEMBERS:
        return ""
    return ",".join(f"{k}={v}" for k, v in pairs.items())
