"""Streamed tool calls carry the logprobs of their tokens, as the whole (non-streamed)
response does: `runtime.ai.shaping.ChoiceStream` against `shaping.choice`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_worker.protocol import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, TokenLogprob
from runtime.ai.shaping import ChoiceStream, choice
from runtime.net.openai_sse import Chunks

WEATHER = [{"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = TOOL_CALL_OPEN + '{"name": "get_weather", "arguments": {"city": "Paris"}}' + TOOL_CALL_CLOSE
PARAMS = {"tools": WEATHER, "tool_choice": "required", "logprobs": 2}


class Gen:
    """What `ChoiceStream.events` reads of a `gpu_worker.client.Generation`."""

    def __init__(self) -> None:
        self.logprobs: list[TokenLogprob] = []


def tokens(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def entry(token: str, i: int) -> TokenLogprob:
    return TokenLogprob(token.encode(), -0.01 * i, [(token.encode(), -0.01 * i)])


def streamed(texts: list[str], params: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks' choices when each of `texts` is one chunk of one token."""
    shape, gen, out = ChoiceStream(Chunks("r", "m", chat=True), params), Gen(), []
    for i, text in enumerate(texts):
        gen.logprobs.append(entry(text, i))
        out += shape.events(text, gen)  # type: ignore[arg-type]
    out += shape.end()
    return [json.loads(e.removeprefix(b"data: "))["choices"][0] for e in out]


@pytest.mark.parametrize("size", [1, 3, 7, len(CALL)])
@pytest.mark.parametrize("text", [CALL, "Sunny in Paris, 21 C.", CALL + "\n" + CALL],
                         ids=["call", "content", "two-calls"])
def test_streamed_logprobs_list_what_the_whole_response_does(text: str, size: int) -> None:
    """A call's pieces had ``"logprobs": None`` and the tokens of its markup were lost:
    the stream listed none of a call's tokens, the whole response all of them."""
    parts = tokens(text, size)
    whole = choice(True, PARAMS, text, "stop", [entry(t, i) for i, t in enumerate(parts)])
    chunks = streamed(parts, PARAMS)
    listed = [t for c in chunks for t in c["logprobs"]["content"]]
    assert listed == whole["logprobs"]["content"]
    assert "".join(t["token"] for t in listed) == text
    for c in chunks:  # every chunk of the stream has logprobs, a call's as content's
        assert c["logprobs"] is not None
    if text.startswith(TOOL_CALL_OPEN):
        assert whole["message"]["tool_calls"] and any(c["delta"].get("tool_calls")
                                                      for c in chunks)


def test_without_logprobs_asked_chunks_have_none() -> None:
    params = {k: v for k, v in PARAMS.items() if k != "logprobs"}
    chunks = streamed(tokens(CALL, 4), params)
    assert chunks and all("logprobs" not in c for c in chunks)
