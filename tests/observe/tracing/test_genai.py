"""The model call's span with the OpenTelemetry GenAI semantic conventions, from a
real PoP with the packaged chat model, exported to a real OTLP receiver."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.observe.traceparent import parse
from tests.observe.tracing.receiver import otlp_receiver
from tests.support import pop_thread

CHAT = "smollm2-135m"
CLIENT = 3  # opentelemetry.proto SpanKind.SPAN_KIND_CLIENT


@pytest.mark.parametrize("stage_spans", [True, False])
def test_a_chat_completion_is_a_genai_span_under_the_openai_stage(tmp_path: Path,
                                                                  stage_spans: bool) -> None:
    """With `stage_spans = false` the model span hangs from the request's span,
    over the openai stage's time, and there are no stage spans."""
    with otlp_receiver() as receiver, pop_thread(
            tmp_path / "data", ai=True, **{"ai_cache.enabled": False, "tracing.enabled": True,
                                          "tracing.endpoint": receiver.url,
                                          "tracing.stage_spans": stage_spans}) as pop:
        body = {"model": CHAT, "max_tokens": 6, "temperature": 0.5,
                "messages": [{"role": "user", "content": "Say hello"}]}
        status, headers, data = pop.request(
            "POST", "/v1/chat/completions", json.dumps(body).encode(),
            {"content-type": "application/json"}, timeout=60)
        assert status == 200
        usage = json.loads(data)["usage"]
        back = parse(headers["traceparent"].encode())
        assert back is not None and pop.pop.tracer is not None
        spans = receiver.wait(
            lambda s: any(x["trace_id"] == back.trace_id and x["kind"] == CLIENT for x in s),
            pop.pop.tracer.flush)
    spans = [s for s in spans if s["trace_id"] == back.trace_id]
    model = next(s for s in spans if s["kind"] == CLIENT)
    if stage_spans:
        openai = next(s for s in spans if s["name"] == "stage openai")
        assert model["parent_id"] == openai["span_id"]
        assert openai["parent_id"] == back.span_id
    else:
        assert [s["name"] for s in spans if s["name"].startswith("stage ")] == []
        assert model["parent_id"] == back.span_id
        openai = next(s for s in spans if s["span_id"] == back.span_id)  # the server span
        assert model["start"] > openai["start"]  # from the openai stage's start, not the request's
    assert model["name"] == f"chat {CHAT}"
    a = model["attributes"]
    assert (a["gen_ai.operation.name"], a["gen_ai.system"]) == ("chat", "edgefn")
    assert a["gen_ai.request.model"] == a["gen_ai.response.model"] == CHAT
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (
        usage["prompt_tokens"], usage["completion_tokens"])
    assert a["gen_ai.response.finish_reasons"] in (["stop"], ["length"])
    assert (a["gen_ai.request.temperature"], a["gen_ai.request.max_tokens"]) == (0.5, 6)
    duration_s = (model["end"] - model["start"]) / 1e9
    assert 0 < a["gen_ai.server.time_to_first_token"] <= duration_s + 0.01
    assert model["events"] == ["gen_ai.first_token"]
    assert openai["start"] <= model["start"] <= model["end"] <= openai["end"]
