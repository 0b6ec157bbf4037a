"""`StopText`: where stop strings end a generation's text, however the text arrives in
tokens, and that they never cut tool-call markup (`Seq` with a tools request)."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.engines.batching import Seq
from gpu_worker.protocol import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, Generate
from gpu_worker.stops import StopText

WEATHER = [{"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = TOOL_CALL_OPEN + '{"name": "get_weather", "arguments": {"city": "Paris"}}' + TOOL_CALL_CLOSE


def cut(text: str, stops: list[str]) -> str:
    """`text` before the earliest occurrence of any of `stops`."""
    found = [at for at in (text.find(s) for s in stops if s) if at >= 0]
    return text[:min(found)] if found else text


def run(stop: StopText, chunks: list[bytes]) -> str:
    """What the worker sends for `chunks` (tokens' bytes): fed in order, then flushed."""
    out = ""
    for chunk in chunks:
        out += stop.feed(chunk)
        if stop.stopped:
            break
    return out + stop.flush()


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in pairwise(bounds)]


@pytest.mark.parametrize("stops", [["Hel", "lo"], ["lo", "Hel"]])
def test_the_earliest_stop_wins_whatever_the_list_order(stops: list[str]) -> None:
    """smollm2-135m answers "Hello, World!" ("Hello" one token): stop=["lo", "Hel"]
    sent "Hel", a stop string, because "lo" was looked for first."""
    stop = StopText(stops)
    assert stop.feed(b"Hello") == "" and stop.stopped
    assert StopText(stops).feed(b"Say Hello") == "Say "


def test_a_stop_found_waits_for_a_longer_one_that_may_begin_before_it() -> None:
    """Stops "abcd" and "c": "abc" holds "c" but "abcd" may still begin at 0, so
    nothing is sent yet; "d" settles it (cut at 0), "x" too (cut at "c")."""
    stop = StopText(["abcd", "c"])
    assert stop.feed(b"abc") == "" and not stop.stopped
    assert stop.feed(b"d") == "" and stop.stopped
    stop = StopText(["abcd", "c"])
    assert stop.feed(b"abc") == "" and stop.feed(b"x") == "ab" and stop.stopped
    stop = StopText(["abcd", "c"])
    assert stop.feed(b"abc") == "" and stop.flush() == "ab" and stop.stopped


ALPHABET = "ab\n<\"}é"


@settings(max_examples=400, deadline=None)
@given(text=st.text(ALPHABET, max_size=24),
       stops=st.lists(st.text(ALPHABET, max_size=4), max_size=4),
       cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_output_is_the_text_cut_before_its_earliest_stop_in_any_chunking(
        text: str, stops: list[str], cuts: list[int]) -> None:
    """Whatever the stops (their order, overlaps, one inside another) and however the
    text's bytes arrive (a token may end inside a stop string or a UTF-8 character),
    the text sent is the text before its earliest stop string, and holds none."""
    stop = StopText(stops)
    out = run(stop, split(text.encode(), cuts))
    assert out == cut(text, stops)
    assert not any(s and s in out for s in stops)
    assert stop.stopped == any(s and s in text for s in stops)


@settings(max_examples=400, deadline=None)
@given(lead=st.sampled_from(["", "\n", "\n\n"]),
       body=st.text(ALPHABET, max_size=16),
       opens=st.booleans(),
       stops=st.lists(st.text(ALPHABET + "_lt", min_size=1, max_size=4), min_size=1, max_size=4),
       cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=12))
def test_with_tools_stops_cut_an_answer_but_never_tool_calls(
        lead: str, body: str, opens: bool, stops: list[str], cuts: list[int]) -> None:
    """With tools, an output that opens with the call markup (what the API reads as
    calls) is sent whole whatever the stops; any other output is an answer, cut as
    without tools."""
    text = lead + (TOOL_CALL_OPEN + body + TOOL_CALL_CLOSE if opens else body)
    stop = StopText(stops, calls=True)
    out = run(stop, split(text.encode(), cuts))
    assert out == (text if opens else cut(text, stops))


@pytest.mark.parametrize("stop", ["\n", '"', "}", "<", "tool", "Paris", "</tool_call>"])
def test_stops_never_cut_a_tool_call(stop: str) -> None:
    """tools + tool_choice "required" + stop ["\\n"]: the stop matched the markup's
    own newline and the API got "<tool_call>", no call (finish "stop", content "")."""
    tokens = [TOOL_CALL_OPEN[:5], TOOL_CALL_OPEN[5:], CALL[len(TOOL_CALL_OPEN):][:9],
              CALL[len(TOOL_CALL_OPEN) + 9:]]
    assert "".join(tokens) == CALL
    for calls, want in ((True, CALL), (False, cut(CALL, [stop]))):
        st_ = StopText([stop], calls=calls)
        assert run(st_, [t.encode() for t in tokens]) == want, calls


def test_stops_still_cut_an_answer_and_text_before_markup() -> None:
    stop = StopText(["\n"], calls=True)
    assert stop.feed(b"Sure.") == "Sure." and stop.feed(b"\n" + TOOL_CALL_OPEN.encode()) == ""
    assert stop.stopped
    stop = StopText(["\n"], calls=True)
    assert stop.feed(b"\n") == ""  # may still open a call
    assert stop.feed(b"Hi") == "" and stop.stopped  # an answer, cut at its first newline
    stop = StopText(["<"], calls=True)
    assert stop.feed(b"<tool") == "" and stop.feed(b"box") == "" and stop.stopped


def seq(**params: Any) -> Seq:
    return Seq(Generate(id=1, model="m", messages=[], **params), sink=None, prompt=[1, 2])  # type: ignore[arg-type]


def advance(s: Seq, pieces: list[bytes | None]) -> tuple[str, str | None]:
    text, reason = "", None
    for token, piece in enumerate(pieces):
        sent, reason = s.advance(token, piece)
        text += sent
        if reason is not None:
            break
    return text, reason


@pytest.mark.parametrize("choice", ["required", "auto", None,
                                    {"type": "function", "function": {"name": "get_weather"}}])
def test_seq_with_tools_sends_a_call_whole_whatever_the_stops(choice: Any) -> None:
    s = seq(tools=WEATHER, tool_choice=choice, parallel_tool_calls=False, max_tokens=200,
            stop=["\n", '"', "}"])
    pieces: list[bytes | None] = [c.encode() for c in CALL]
    assert advance(s, [*pieces, None]) == (CALL, "stop")


def test_seq_without_tools_or_with_choice_none_cuts_markup_like_any_text() -> None:
    for params in ({}, {"tools": WEATHER, "tool_choice": "none"}):
        s = seq(max_tokens=40, stop=["\n"], **params)
        assert advance(s, [c.encode() for c in CALL]) == ("<tool_call>", "stop")


def test_seq_ends_with_stop_where_a_held_back_stop_string_ends_the_text() -> None:
    """A stop string found but held back (a longer one might begin before it) cuts
    the text when the generation ends: at max_tokens that is "stop", not "length"."""
    assert advance(seq(max_tokens=3, stop=["abcd", "c"]), [b"a", b"b", b"c"]) == ("ab", "stop")
    assert advance(seq(max_tokens=9, stop=["abcd", "c"]), [b"ab", b"c", None]) == ("ab", "stop")
    assert advance(seq(max_tokens=2, stop=["abcd"]), [b"a", b"b"]) == ("ab", "length")
