"""What an isolate sends for a handler's `Response` (`guest.Session.respond`), in
this process over a socketpair: a body of bytes or str, or of a subclass of either
(markupsafe's `Markup` is a str), goes whole in one RESPONSE frame; an iterable
body is streamed (HEAD, CHUNKs, END); a body that is neither is refused before
anything is sent."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import edgefn
import pytest

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
