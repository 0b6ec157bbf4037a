"""Reading tool calls out of a generation's text (`runtime.ai.tool_calls`), whole
and streamed in every possible split, without a model."""

from __future__ import annotations

import json
import random

import pytest

from gpu_worker.engines.tool_prompt import call_text, with_tools
from gpu_worker.protocol import TOOL_CALL_OPEN
from runtime.ai.tool_calls import TAIL, CallReader, Piece, delta, message

TWO = "\n".join([call_text({"name": "get_weather", "arguments": '{"city": "Paris"} '}),
                 call_text({"name": "now", "arguments": "{}"})])


def read(parts: list[str]) -> list[Piece]:
    reader = CallReader()
    return [p for part in parts for p in reader.feed(part)] + reader.end()


def split(text: str, rand: random.Random) -> list[str]:
    cuts = sorted(rand.sample(range(1, len(text)), rand.randint(1, len(text) // 3)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def test_calls_in_one_piece_become_tool_calls() -> None:
    msg = message(read([TWO]))
    assert msg["content"] is None and [c["function"]["name"] for c in msg["tool_calls"]] == [
        "get_weather", "now"]
    assert [json.loads(c["function"]["arguments"]) for c in msg["tool_calls"]] == [
        {"city": "Paris"}, {}]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in msg["tool_calls"])
    assert msg["tool_calls"][0]["id"] != msg["tool_calls"][1]["id"]


@pytest.mark.parametrize("text", [TWO, "Plain answer < with a bracket", "<b>html</b>", ""])
def test_any_split_of_the_stream_reads_the_same(text: str, rand: random.Random) -> None:
    whole = message(read([text]))
    for _ in range(50):
        parts = split(text, rand) if len(text) > 3 else [text]
        streamed = message(read(parts))
        for m in (whole, streamed):
            for c in m.get("tool_calls", []):
                c["id"] = "-"
        assert streamed == whole


def test_plain_text_is_content_as_soon_as_it_cannot_be_a_call() -> None:
    reader = CallReader()
    assert reader.feed("<tool") == []  # may still open a call: held back
    assert reader.feed("s are") == [Piece("content", "<tools are")]
    assert reader.feed(" fun") == [Piece("content", " fun")]


def test_arguments_stream_before_the_call_ends() -> None:
    reader = CallReader()
    pieces = reader.feed(TOOL_CALL_OPEN + '{"name": "f", "arguments": {"a": "xxxxxxxxxxxxxxxxxxx')
    assert [p.kind for p in pieces] == ["call", "args"] and pieces[0].text == "f"
    assert pieces[1].text.startswith('{"a": "x')


@pytest.mark.parametrize("cut", [1, 5, len(TOOL_CALL_OPEN), len(TOOL_CALL_OPEN) + 12])
def test_a_generation_cut_inside_the_opening_markup_has_no_content_and_no_call(
        cut: int, rand: random.Random) -> None:
    """max_tokens ended it before a call's name was whole: "<tool" was the answer."""
    text = (TOOL_CALL_OPEN + '{"name": "get_weather", "arguments": {}}')[:cut]
    for parts in ([text], split(text, rand) if len(text) > 3 else [text]):
        assert read(parts) == [] and message(read(parts)) == {"role": "assistant",
                                                              "content": ""}
    # after a whole call, a second one cut short the same way: the first call only
    first = call_text({"name": "now", "arguments": "{}"})
    msg = message(read([first + "\n" + text]))
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["now"]


def test_a_call_cut_after_its_name_is_a_call_without_arguments(rand: random.Random) -> None:
    text = TOOL_CALL_OPEN + '{"name": "get_weather", "argu'
    for parts in ([text], split(text, rand)):
        msg = message(read(parts))
        assert msg["content"] is None and [(c["function"]["name"], c["function"]["arguments"])
                                           for c in msg["tool_calls"]] == [("get_weather", "")]


def test_a_call_cut_short_keeps_its_partial_arguments() -> None:
    msg = message(read([TOOL_CALL_OPEN + '{"name": "f", "arguments": {"a": 1, "b"']))
    assert msg["tool_calls"][0]["function"]["arguments"] == '{"a": 1, "b"'


@pytest.mark.parametrize(("cut", "args"), [
    (1, '{ "city": "Paris" }'),  # cut right after the wrapper's "}": its close never came
    (4, '{ "city": "Paris" }'),
    (len(TAIL) - 1, '{ "city": "Paris" }'),  # "}\n</tool_call": the markup went out as args
    (0, '{ "city": "Paris" }'),
])
def test_a_call_cut_inside_its_closing_markup_gives_its_arguments_only(
        cut: int, args: str, rand: random.Random) -> None:
    text = TOOL_CALL_OPEN + '{"name": "f", "arguments": ' + args + TAIL[:cut]
    for parts in ([text], split(text, rand), split(text, rand)):
        msg = message(read(parts))
        assert msg["tool_calls"][0]["function"]["arguments"] == args, parts


def test_a_cut_that_may_close_the_arguments_json_keeps_the_brace() -> None:
    """``{"a": {"b": 1}`` + ``}``: that brace completes the arguments, not the wrapper."""
    msg = message(read([TOOL_CALL_OPEN + '{"name": "f", "arguments": {"a": {"b": 1}}']))
    assert msg["tool_calls"][0]["function"]["arguments"] == '{"a": {"b": 1}}'


def test_deltas_have_openai_streaming_shape() -> None:
    start, frag = delta(Piece("call", "f", 1, "call_x")), delta(Piece("args", '{"a"', 1))
    assert start == {"tool_calls": [{"index": 1, "id": "call_x", "type": "function",
                                     "function": {"name": "f", "arguments": ""}}]}
    assert frag == {"tool_calls": [{"index": 1, "function": {"arguments": '{"a"'}}]}
    assert delta(Piece("content", "hi")) == {"content": "hi"}


def test_history_renders_tools_calls_and_results_as_text() -> None:
    tools = [{"type": "function", "function": {"name": "now", "description": "the time"}}]
    history = [{"role": "system", "content": "Be brief."},
               {"role": "user", "content": "time?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "now", "arguments": "{}"}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    out = with_tools(history, tools)
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Be brief.\n\n")
    assert "- now: the time" in out[0]["content"]
    assert out[2] == {"role": "assistant", "content": call_text({"name": "now",
                                                                   "arguments": "{}"})}
    assert out[3] == {"role": "tool", "content": "(result of call call_1) 12:00"}
    assert with_tools(history[1:2], None) == history[1:2]
