"""The upstream engine's side of structured output and tools, without sockets:
what it forwards, and an upstream's streamed ``tool_calls`` and ``logprobs``
read back (`upstream._Progress`) into the markup the API reads."""

from __future__ import annotations

import json
from typing import Any

from gpu_worker.engines.upstream import _generate_body, _Progress
from gpu_worker.protocol import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, Generate
from runtime.ai.tool_calls import CallReader, message

TOOLS = [{"type": "function", "function": {"name": "get_weather"}}]


def test_shaping_fields_are_forwarded() -> None:
    req = Generate(1, "m", messages=[{"role": "user", "content": "x"}], tools=TOOLS,
                   tool_choice="required", parallel_tool_calls=False, logprobs=2,
                   presence_penalty=0.5, logit_bias={42: -100.0},
                   response_format={"type": "json_object"})
    body = json.loads(_generate_body(req)[1])
    assert body["tools"] == TOOLS and body["tool_choice"] == "required"
    assert body["parallel_tool_calls"] is False and body["response_format"] == {
        "type": "json_object"}
    assert (body["logprobs"], body["top_logprobs"]) == (True, 2)
    assert body["presence_penalty"] == 0.5 and body["logit_bias"] == {"42": -100.0}
    assert "frequency_penalty" not in body
    plain = json.loads(_generate_body(Generate(1, "m", prompt="p", logprobs=3))[1])
    assert plain["logprobs"] == 3 and "tools" not in plain and "top_logprobs" not in plain


def chunk(delta: dict[str, Any], finish: str | None = None, **choice: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish, **choice}]}


def test_streamed_upstream_tool_calls_read_back_as_calls() -> None:
    stream = [chunk({"role": "assistant", "content": None}),
              chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                     "function": {"name": "get_weather", "arguments": ""}}]}),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]}),
              chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                     "function": {"name": "now", "arguments": "{}"}}]}),
              chunk({}, "tool_calls")]
    progress, reader, pieces, text = _Progress(), CallReader(), [], ""
    for obj in stream:
        part = progress.read(obj)
        text += part
        pieces += reader.feed(part)
    assert text.endswith("}" + TOOL_CALL_CLOSE) and text.count(TOOL_CALL_OPEN) == 2
    msg = message(pieces + reader.end())
    assert progress.finish_reason == "tool_calls" and msg["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in msg["tool_calls"]] == [("get_weather", {"city": "Oslo"}), ("now", {})]


def test_upstream_logprobs_are_read_per_chunk() -> None:
    progress = _Progress()
    lp = {"content": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
                       "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105]},
                                        {"token": "Yo", "logprob": -1.5}]}]}
    assert progress.read(chunk({"content": "Hi"}, logprobs=lp)) == "Hi"
    taken = progress.take()
    assert taken is not None and len(taken) == 1
    assert (taken[0].token, taken[0].logprob, taken[0].top) == (
        b"Hi", -0.5, [(b"Hi", -0.5), (b"Yo", -1.5)])
    assert progress.take() is None
    legacy = {"choices": [{"index": 0, "text": " a", "logprobs": {
        "tokens": [" a"], "token_logprobs": [-0.25], "top_logprobs": [{" a": -0.25}]}}]}
    progress.read(legacy)
    assert [(e.token, e.logprob) for e in progress.take() or []] == [(b" a", -0.25)]
