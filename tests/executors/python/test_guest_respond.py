"""What an isolate sends for a handler's `Response` (`guest.Session.respond`), in
this process over a socketpair: a body of bytes or str, or of a subclass of either
(markupsafe's `Markup` is a str), goes whole in one RESPONSE frame; an iterable
body is streamed (HEAD, CHUNKs, END); a body that is neither is refused before
anything is sent. The frame the C makes for the common response (`wire.response_framer`)
is byte for byte the Python path's, and the C leaves everything else to Python."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import edgefn
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgefn_core import abi
from edgefn_core.abi import decode_response
from runtime.executors.python import guest, wire


class Text(str):
    """A str subclass, as markupsafe's `Markup` is."""


class Blob(bytes):
    pass


@pytest.fixture
def session() -> Iterator[tuple[guest.Session, socket.socket]]:
    ours, theirs = socket.socketpair()
    s = guest.Session(theirs, None, 50, 2000, edgefn)
    try:
        yield s, ours
    finally:
        s.dog.stop()
        ours.close()
        theirs.close()


def sent(ours: socket.socket, frames: int) -> list[tuple[bytes, bytes]]:
    reader, pending, got = wire.Reader(), [], []  # type: ignore[var-annotated]
    for _ in range(frames):
        frame = wire.recv_frame(ours, reader, pending)
        assert frame is not None
        got.append(frame)
    ours.setblocking(False)
    with pytest.raises(BlockingIOError):  # nothing more was sent
        ours.recv(1)
    return got


@pytest.mark.parametrize("body", [b"hi", "hi", bytearray(b"hi"), memoryview(b"hi"),
                                  Text("hi"), Blob(b"hi")],
                         ids=["bytes", "str", "bytearray", "memoryview", "str-subclass",
                              "bytes-subclass"])
def test_a_whole_body_goes_in_one_response_frame(
        session: tuple[guest.Session, socket.socket], body: Any) -> None:
    s, ours = session
    s.respond(edgefn.Response(body, 201, {"x-a": "1"}))
    [(kind, payload)] = sent(ours, 1)
    assert kind == wire.RESPONSE
    status, headers, data = decode_response(payload)
    assert (status, data) == (201, b"hi") and (b"x-a", b"1") in headers


def test_an_iterable_body_is_streamed(session: tuple[guest.Session, socket.socket]) -> None:
    s, ours = session
    s.respond(edgefn.Response(iter([b"a", "b"]), 200))
    frames = sent(ours, 4)
    assert [k for k, _ in frames] == [wire.HEAD, wire.CHUNK, wire.CHUNK, wire.END]
    assert [p for _, p in frames[1:3]] == [b"a", b"b"]


@pytest.mark.parametrize("body", [42, {"a": 1}], ids=["int", "dict"])
def test_a_body_neither_whole_nor_iterable_is_refused_sending_nothing(
        session: tuple[guest.Session, socket.socket], body: Any) -> None:
    s, ours = session
    with pytest.raises(guest.BadResponse, match=type(body).__name__):
        s.respond(edgefn.Response(body))
    sent(ours, 0)


# -- the C frame (`wire.response_framer`) against the Python path --------------------------
FRAMER = wire.response_framer(edgefn.Response, edgefn.Headers)
needs_c = pytest.mark.skipif(abi.NATIVE is None, reason="the C codec did not build here")
TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=8)  # surrogates too
STATUSES = st.one_of(st.integers(100, 700), st.booleans(), st.just(200.0), st.just("200"))
BODIES = st.one_of(st.binary(max_size=40), TEXT, st.binary(max_size=8).map(bytearray),
                   st.builds(Text, TEXT), st.lists(st.binary(max_size=3), max_size=2).map(iter))
PAIR = st.tuples(st.one_of(TEXT, st.just("x-\u00e9"), st.just("x-\u0101"), st.just(b"x-b")),
                 st.one_of(TEXT, st.just("\ud800"), st.just(1)))


def python_answer(result: Any, max_body: int) -> tuple[str, bytes]:
    """What the Python path does with `result`: the bytes it sends, or what it raises."""
    ours, theirs = socket.socketpair()
    s = guest.Session(theirs, None, 50, 2000, edgefn)
    s.framer = wire._no_frame
    s.max_response = max_body
    try:
        try:
            s.respond(result)
        except (guest.BadResponse, TypeError, AttributeError) as e:
            return type(e).__name__, b""
        ours.setblocking(False)
        got = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := ours.recv(1 << 16):
                got += chunk
        return "sent", got
    finally:
        s.dog.stop()
        ours.close()
        theirs.close()


@needs_c
@settings(max_examples=400, deadline=None)
@given(STATUSES, BODIES, st.lists(PAIR, max_size=3), st.integers(0, 48), st.booleans())
def test_the_c_frame_is_the_python_paths_frame(status: Any, body: Any, pairs: Any,
                                               max_body: int, as_dict: bool) -> None:
    result = edgefn.Response.__new__(edgefn.Response)  # any parts, unchecked (a handler's
    result.status, result.body = status, body  # attributes are its own to set)
    result.headers = dict(pairs) if as_dict else edgefn.Headers.__new__(edgefn.Headers)
    if not as_dict:
        result.headers._items = list(pairs)
    frame = FRAMER(result, max_body)
    if frame is None:
        return  # Python's answer, whatever it is (the property below holds the rest)
    assert python_answer(result, max_body) == ("sent", frame)


@needs_c
@pytest.mark.parametrize("response", [
    edgefn.Response("Hello, world, from a Python isolate!"),
    edgefn.Response(b"", 204, {"x-warm": "GET"}),
    edgefn.Response("h\u00e9", 201, [("x-a", "\u2603"), ("set-cookie", "a"), ("set-cookie", "b")]),
    edgefn.Response(b"x" * 48, 599),
], ids=["hello", "warm", "unicode-and-repeats", "at-the-limits"])
def test_the_common_response_is_framed_in_c(response: Any) -> None:
    frame = FRAMER(response, 48)
    assert frame is not None
    assert python_answer(response, 48) == ("sent", frame)


@needs_c
@pytest.mark.parametrize("change", [
    ("status", 199), ("status", 600), ("status", True), ("status", 200.0),
    ("body", bytearray(b"x")), ("body", Text("x")), ("body", iter([b"x"])), ("body", b"x" * 49),
    ("body", "\ud800"), ("headers", {"x-a": "1"}), ("headers", [("x-a", "1")]),
    ("pairs", [("x-\u0101", "1")]), ("pairs", [("x-a", "\ud800")]), ("pairs", [("x-a", 1)]),
    ("pairs", [(b"x-a", "1")]), ("pairs", [("x-a", "1", "2")]), ("pairs", ("x-a", "1")),
], ids=repr)
def test_the_c_leaves_every_other_response_to_python(change: tuple[str, Any]) -> None:
    result = edgefn.Response("ok", 200, {"x-a": "1"})
    name, value = change
    if name == "pairs":
        result.headers._items = value
    else:
        setattr(result, name, value)
    assert FRAMER(result, 48) is None
    assert FRAMER(Sub("ok"), 48) is None  # a subclass of Response: Python's too


@needs_c
@pytest.mark.parametrize("missing", ["status", "body", "headers"])
def test_a_response_missing_an_attribute_is_pythons_to_refuse(missing: str) -> None:
    result = edgefn.Response("ok", 999)  # Python reads status and body, then refuses 999
    delattr(result, missing)
    assert FRAMER(result, 48) is None
    expected = "BadResponse" if missing == "headers" else "AttributeError"
    assert python_answer(result, 48) == (expected, b"")


class Sub(edgefn.Response):
    pass
