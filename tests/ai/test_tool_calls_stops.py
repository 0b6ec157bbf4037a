"""Stop sequences through a real PoP, its worker and the real 135M chat model, with
the official `openai` client: the earliest stop cuts the answer whatever the list's
order, stops never cut tool calls, and streamed calls carry their logprobs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support import pop_thread

CHAT = "smollm2-135m"
HELLO = [{"role": "user", "content": "Say hello world"}]
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    with pop_thread(tmp_path_factory.mktemp("stops-pop"), ai=True) as pop, \
            pop.openai(timeout=300) as c:
        yield c


def chat(client: openai.OpenAI, **kw: Any) -> Any:
    return client.chat.completions.create(model=CHAT, temperature=0, **kw)


def test_the_earliest_stop_cuts_whatever_the_list_order(client: openai.OpenAI) -> None:
    """The answer is "Hello, World!" ("Hello" one token): stop=["lo", "Hel"] gave
    "Hel", a stop sequence, where ["Hel", "lo"] gave ""."""
    full = chat(client, messages=HELLO, max_tokens=20).choices[0].message.content
    assert full.startswith("Hello")
    for stop in (["Hel", "lo"], ["lo", "Hel"]):
        r = chat(client, messages=HELLO, max_tokens=20, stop=stop).choices[0]
        assert (r.message.content, r.finish_reason) == ("", "stop"), stop
        streamed = "".join(c.choices[0].delta.content or "" for c in chat(
            client, messages=HELLO, max_tokens=20, stop=stop, stream=True) if c.choices)
        assert streamed == "", stop


@pytest.mark.parametrize("stop", [["\n"], ['"'], ["}"], ["\n", "<"]])
def test_stops_never_cut_a_tool_call(client: openai.OpenAI, stop: list[str]) -> None:
    """stop=["\\n"] matched the newline of the call's own markup: finish "stop",
    content "", no tool_calls, where without it the model calls get_weather."""
    kw: dict[str, Any] = {"messages": ASK, "tools": WEATHER, "tool_choice": "required",
                          "parallel_tool_calls": False, "max_tokens": 40, "seed": 1}
    want = chat(client, **kw).choices[0]
    assert want.finish_reason == "tool_calls"
    got = chat(client, stop=stop, **kw).choices[0]
    assert got.finish_reason == "tool_calls" and got.message.content is None
    calls = [(c.function.name, c.function.arguments) for c in got.message.tool_calls]
    assert calls == [(c.function.name, c.function.arguments) for c in want.message.tool_calls]
    assert calls[0][0] == "get_weather" and isinstance(json.loads(calls[0][1]), dict)
    args, finish = "", None
    for chunk in chat(client, stop=stop, stream=True, **kw):
        finish = chunk.choices[0].finish_reason or finish
        for d in chunk.choices[0].delta.tool_calls or []:
            args += d.function.arguments or ""
    assert (args, finish) == (calls[0][1], "tool_calls")


def test_streamed_tool_calls_carry_the_logprobs_the_whole_response_does(
        client: openai.OpenAI) -> None:
    kw: dict[str, Any] = {"messages": ASK, "tools": WEATHER, "tool_choice": "required",
                          "parallel_tool_calls": False, "max_tokens": 40, "seed": 1,
                          "logprobs": True, "top_logprobs": 2}
    whole = chat(client, **kw).choices[0]
    assert whole.message.tool_calls and whole.logprobs.content
    entries = [t for ch in chat(client, stream=True, **kw)
               if ch.choices and ch.choices[0].logprobs
               for t in ch.choices[0].logprobs.content]
    assert [(t.token, round(t.logprob, 4)) for t in entries] == [
        (t.token, round(t.logprob, 4)) for t in whole.logprobs.content]
