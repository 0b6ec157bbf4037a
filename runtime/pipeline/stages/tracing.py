"""`tracing`: the request's place in a trace (W3C Trace Context).

A valid ``traceparent`` from the client makes its span the parent (its sampled
flag decides, unless ``trust_sampled = false``: then `sample` does, so a client
cannot have all its requests traced, or none); an absent or invalid one starts a
new trace, kept with probability `[tracing] sample`. The request's trace id and its server span's id
are recorded as ``ctx.decisions["trace"]`` (so the `Event` carries them to the
tracing observer, which makes the spans once the response is done) and sent back
to the client as ``traceparent``; the request's own ``traceparent`` header is
replaced by the same value, so a function sees the span it runs in (and may
pass it on in its ``fetch`` calls). Only in the pipeline when tracing is on.

Tracing times the chain (its spans are the stages' timings); a request that is not
sampled is not timed, unless the events or the access log want every request's
stage timings (`keep_timings`).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from runtime.net.message import Request, Response
from runtime.observe.settings_tracing import TracingSettings
from runtime.observe.traceparent import format_parent, new_span_id, new_trace_id, parse
from runtime.pipeline.stage import Context, Next, Result, then

TRACEPARENT, TRACESTATE = b"traceparent", b"tracestate"


class Tracing:
    name = "tracing"

    def __init__(self, settings: TracingSettings,
                 rand: Callable[[], float] = random.random, keep_timings: bool = False) -> None:
        self.sample = settings.sample
        self.trust_sampled = settings.trust_sampled
        self.rand = rand
        self.keep_timings = keep_timings

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        parent = parse(request.header(TRACEPARENT))
        span_id = new_span_id()
        record: dict[str, object]
        if parent is not None:
            record = {"trace_id": parent.trace_id, "span_id": span_id,
                      "parent_id": parent.span_id,
                      "sampled": parent.sampled if self.trust_sampled else self._draw()}
            state = tracestate(request)
            if state:
                record["tracestate"] = state
        else:
            record = {"trace_id": new_trace_id(), "span_id": span_id, "sampled": self._draw()}
        ctx.decide("trace", record)
        if not record["sampled"] and not self.keep_timings:
            ctx.timing = False  # no span will be made of them
            ctx.marks.clear()
        header = format_parent(str(record["trace_id"]), span_id, bool(record["sampled"]))
        # the function sees (and may pass on in its own calls) this request's span
        if parent is not None or request.header(TRACEPARENT) is not None:
            request.headers = [h for h in request.headers if h[0] != TRACEPARENT]
        request.headers.append((TRACEPARENT, header))
        result = call_next(request, ctx)
        if isinstance(result, Response):
            result.headers.append((TRACEPARENT, header))
            return result
        return then(result, _tag, header)

    def _draw(self) -> bool:
        return self.sample >= 1.0 or self.rand() < self.sample


def _tag(response: Response, header: bytes) -> Response:
    response.headers.append((TRACEPARENT, header))
    return response


MAX_STATE = 512  # characters of tracestate kept (W3C trace-context 3.3.1.5: at least 512)
MAX_ENTRY = 128  # past MAX_STATE, entries longer than this go first (ibid.)


def tracestate(request: Request) -> str | None:
    """The request's ``tracestate`` (its headers joined by commas, as W3C trace-context
    says several are one list), at most `MAX_STATE` characters of whole entries: past
    it, entries over `MAX_ENTRY` go, then those at the end (it was cut at 512
    characters, mid-entry, and only the first header was read). None when there is none."""
    values = [v for k, v in request.headers if k == TRACESTATE]
    if not values:
        return None
    joined = b",".join(values).decode("latin-1")
    if len(joined) <= MAX_STATE:
        return joined
    entries = [e for e in (e.strip(" \t") for e in joined.split(",")) if e]
    kept: list[str] = []
    size = -1  # the commas between them
    for entry in (e for e in entries if len(e) <= MAX_ENTRY):
        if size + 1 + len(entry) > MAX_STATE:
            break
        kept.append(entry)
        size += 1 + len(entry)
    return ",".join(kept)
