"""`Tracer`: the OpenTelemetry spans of every request, made from its finished
`Event` (an `Observer`), exported over OTLP/HTTP by the official SDK.

Per sampled request (``event.decisions["trace"]``, recorded by the ``tracing``
stage):

    "GET /hello"              SERVER, the request; parent: the client's traceparent
    ├─ "stage request_id"     one INTERNAL child per stage, from the chain's marks
    ├─ ...                    (a stage's decisions as ``edgefn.<stage>.<key>`` attributes)
    └─ "stage openai"
       └─ "chat smollm2-135m" CLIENT, the model call (OpenTelemetry GenAI conventions)

Spans are made after the fact with explicit start/end times; the server span
keeps the id the response's ``traceparent`` already announced (`_Ids`). Each PoP
has its own `TracerProvider` (not the global one) with a `BatchSpanProcessor`:
`observe` only queues, the SDK's thread exports. `close` flushes and shuts it down.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, TraceState

from runtime.observe.event import Event
from runtime.observe.settings_tracing import TracingSettings

_SCALARS = (str, bool, int, float)


class _Ids(RandomIdGenerator):
    """Random ids, except the ones set for the next span (the server span's,
    chosen by the ``tracing`` stage before the request ran)."""

    def __init__(self) -> None:
        self.trace_id: int | None = None
        self.span_id: int | None = None

    def generate_span_id(self) -> int:
        if self.span_id is not None:
            span_id, self.span_id = self.span_id, None
            return span_id
        return super().generate_span_id()

    def generate_trace_id(self) -> int:
        if self.trace_id is not None:
            trace_id, self.trace_id = self.trace_id, None
            return trace_id
        return super().generate_trace_id()


class Tracer:
    def __init__(self, pop: str, tier: str, geo: str, settings: TracingSettings,
                 exporter: SpanExporter | None = None) -> None:
        """`exporter`: default OTLP/HTTP to `settings.endpoint`."""
        if exporter is None:
            exporter = OTLPSpanExporter(endpoint=settings.endpoint, headers=dict(settings.headers),
                                        timeout=settings.timeout)
        self.ids = _Ids()
        resource = Resource.create({"service.name": settings.service_name or pop,
                                    "edgefn.pop": pop, "edgefn.tier": tier, "edgefn.geo": geo})
        self.provider = TracerProvider(resource=resource, sampler=ALWAYS_ON, id_generator=self.ids)
        self.provider.add_span_processor(BatchSpanProcessor(
            exporter, max_queue_size=settings.max_queue,
            schedule_delay_millis=settings.batch_delay_ms))
        self.tracer = self.provider.get_tracer("edgefn")
        self.stage_spans = settings.stage_spans
        self.pop = {"edgefn.pop": pop, "edgefn.tier": tier, "edgefn.geo": geo}

    def observe(self, event: Event) -> None:
        record = event.decisions.get("trace")
        if not isinstance(record, dict) or not record.get("sampled"):
            return
        parent = None
        if "parent_id" in record:
            state = record.get("tracestate")
            remote = SpanContext(int(record["trace_id"], 16), int(record["parent_id"], 16),
                                 is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED),
                                 trace_state=_state(state))
            parent = trace.set_span_in_context(NonRecordingSpan(remote))
        else:
            self.ids.trace_id = int(record["trace_id"], 16)
        self.ids.span_id = int(record["span_id"], 16)
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
        server = self.tracer.start_span(f"{event.method} {where}" if where else event.method,
                                        context=parent, kind=SpanKind.SERVER,
                                        attributes=self._server(event), start_time=start)
        self.ids.trace_id = self.ids.span_id = None
        inside = trace.set_span_in_context(server)
        at = start
        for name, ms in event.stages_ms.items() if self.stage_spans else ():
            until = at + int(ms * 1e6)
            span = self.tracer.start_span(f"stage {name}", context=inside,
                                          kind=SpanKind.INTERNAL, start_time=at,
                                          attributes=_decided(name, event.decisions.get(name)))
            if name == "openai" and event.ai is not None:
                self._model(event, trace.set_span_in_context(span), at, until, start)
            span.end(end_time=until)
            at = until
        if event.ai is not None and not (self.stage_spans and "openai" in event.stages_ms):
            self._model(event, inside, *self._openai(event, start, end), start)
        if event.status >= 500:
            server.set_status(trace.StatusCode.ERROR, event.error or "")
        server.end(end_time=end)

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

    def _model(self, event: Event, context: Any, start: int, end: int, request_start: int
               ) -> None:
        """The model call's CLIENT span (GenAI semantic conventions)."""
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
        span = self.tracer.start_span(f"{ai.operation} {ai.model}", context=context,
                                      kind=SpanKind.CLIENT, attributes=a, start_time=start)
        if ai.ttft_ms is not None:  # measured from the request's start
            span.add_event("gen_ai.first_token",
                           timestamp=min(end, request_start + int(ai.ttft_ms * 1e6)))
        span.end(end_time=end)

    def flush(self, timeout_s: float = 5.0) -> bool:
        return self.provider.force_flush(int(timeout_s * 1000))

    def close(self) -> None:
        """Export what is queued, then stop the exporting thread."""
        self.provider.shutdown()


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


def _state(header: Any) -> TraceState | None:
    if not isinstance(header, str) or not header:
        return None
    try:
        return TraceState.from_header([header])
    except ValueError:
        return None
