"""Length-prefixed frames (`edgefn_core.frames`) and the isolate wire built on them,
fed bytes in every chunking a socket could deliver; no sockets."""

from __future__ import annotations

import asyncio
import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgefn_core.errors import ProtocolError
from edgefn_core.frames import Framing
from runtime.executors.python import wire

KINDS = st.sampled_from([wire.REQUEST, wire.RESPONSE, wire.CHUNK, wire.END, wire.CALL])
FRAMES = st.lists(st.tuples(KINDS, st.binary(max_size=300)), max_size=8)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@given(FRAMES, st.lists(st.integers(0, 10_000), max_size=20))
def test_wire_frames_survive_any_chunking(frames: list[tuple[bytes, bytes]],
                                          cuts: list[int]) -> None:
    data = b"".join(wire.frame(kind, payload) for kind, payload in frames)
    reader = wire.Reader()
    got = [f for chunk in chunked(data, cuts) for f in reader.feed(chunk)]
    assert got == frames
    assert reader.buf == bytearray()  # nothing left over, nothing lost


@given(FRAMES, st.lists(st.integers(0, 10_000), max_size=20))
def test_frames_fed_through_one_reused_buffer_survive_any_chunking(
        frames: list[tuple[bytes, bytes]], cuts: list[int]) -> None:
    """As the PoP's channel and the guest's `recv_frame` feed it: each read lands in
    the same buffer, overwritten by the next, so what a frame or a partial frame
    keeps of it must be a copy."""
    data = b"".join(wire.frame(kind, payload) for kind, payload in frames)
    reader = wire.Reader()
    inbox = bytearray(len(data) + 1)
    got = []
    for chunk in chunked(data, cuts):
        inbox[:len(chunk)] = chunk
        got += reader.feed(memoryview(inbox)[:len(chunk)])
        inbox[:] = b"\xff" * len(inbox)  # the next read overwrites it
    assert got == frames
    assert reader.buf == bytearray()


@given(st.lists(st.binary(max_size=200), max_size=8), st.lists(st.integers(0, 5000), max_size=12),
       st.sampled_from(["<", ">"]))
def test_any_framing_round_trips_bodies(bodies: list[bytes], cuts: list[int],
                                        order: str) -> None:
    framing = Framing(order, max_size=200)  # type: ignore[arg-type]
    reader = framing.reader()
    data = b"".join(framing.pack(b) for b in bodies)
    assert [f for chunk in chunked(data, cuts) for f in reader.feed(chunk)] == bodies


def test_a_partial_frame_waits_for_the_rest() -> None:
    reader = wire.Reader()
    data = wire.frame(wire.CHUNK, b"hello")
    assert reader.feed(data[:3]) == [] and reader.feed(data[3:-1]) == []
    assert reader.feed(data[-1:] + data[:2]) == [(wire.CHUNK, b"hello")]


@pytest.mark.parametrize(("length", "words"), [
    (0, "frame of 0 bytes is shorter than the 1 byte minimum"),
    (wire.MAX_FRAME + 1, f"frame of {wire.MAX_FRAME + 1} bytes exceeds the {wire.MAX_FRAME}"),
    (0xFFFFFFFF, "exceeds"),
])
def test_empty_and_oversized_wire_frames_are_protocol_errors(length: int, words: str) -> None:
    reader = wire.Reader()
    with pytest.raises(ProtocolError, match=words):
        reader.feed(wire.frame(wire.END) + struct.pack("<I", length) + b"Qx")


def test_a_frame_the_peer_would_refuse_is_not_sent() -> None:
    small = Framing("<", max_size=8, min_size=1)
    assert small.pack(b"12345678") == b"\x08\0\0\x0012345678"
    with pytest.raises(ProtocolError, match="frame of 9 bytes exceeds the 8 byte limit"):
        small.pack(b"123456789")
    with pytest.raises(ProtocolError, match="shorter than the 1 byte minimum"):
        small.pack(b"")


def test_read_from_an_asyncio_stream_big_endian() -> None:
    """The shape gpu_worker's protocol has (big-endian, msgpack bodies)."""
    framing = Framing(">", max_size=16)

    async def go() -> None:
        stream = asyncio.StreamReader()
        stream.feed_data(framing.pack(b"one") + framing.pack(b"") + b"\0\0")
        stream.feed_data(b"\0\x03two" + b"\0\0\0\x11" + b"x" * 17)
        stream.feed_eof()
        assert await framing.read(stream) == b"one"
        assert await framing.read(stream) == b""
        assert await framing.read(stream) == b"two"
        with pytest.raises(ProtocolError, match="17 bytes exceeds the 16 byte limit"):
            await framing.read(stream)
        cut = asyncio.StreamReader()
        cut.feed_data(framing.pack(b"one")[:-1])
        cut.feed_eof()
        with pytest.raises(asyncio.IncompleteReadError):
            await framing.read(cut)

    asyncio.run(go())


@given(st.sampled_from([wire.CALL_VALUE, wire.REPLY_VALUE]), st.binary(max_size=300),
       st.binary(max_size=600), st.lists(st.integers(0, 5000), max_size=12))
def test_value_frames_carry_the_value_raw_after_their_head(kind: bytes, head: bytes,
                                                             value: bytes,
                                                             cuts: list[int]) -> None:
    first, rest = wire.value_frame(kind, head, value)
    assert rest is value  # sent as it is: never copied into the frame
    reader = wire.Reader()
    ((got_kind, payload),) = [f for chunk in chunked(first + rest, cuts)
                              for f in reader.feed(chunk)]
    got_head, got_value = wire.split_value(payload)
    assert (got_kind, got_head, bytes(got_value)) == (kind, head, value)


@pytest.mark.parametrize(("payload", "words"), [
    (b"", "a value frame of 0 bytes has no head length"),
    (b"\x05\0\0", "a value frame of 3 bytes has no head length"),
    (struct.pack("<I", 5) + b"1234", "head of 5 bytes is longer than the 4 bytes after"),
    (struct.pack("<I", 0xFFFFFFFF) + b"{}", "head of 4294967295 bytes is longer than the 2"),
])
def test_a_value_frame_whose_head_length_lies_is_a_protocol_error(payload: bytes,
                                                                  words: str) -> None:
    with pytest.raises(ProtocolError, match=words):
        wire.split_value(payload)
    assert wire.split_value(struct.pack("<I", 2) + b"{}") == (b"{}", memoryview(b""))


class OldFrameReader:
    """`FrameReader.feed` before it cut frames from the bytes fed (02fa51d): every
    byte went through its own buffer. The reference the reader must still match."""

    def __init__(self, framing: Framing) -> None:
        self.framing = framing
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self.buf += data
        buf, size, out, pos = self.buf, self.framing.length.size, [], 0
        while len(buf) - pos >= size:
            (n,) = self.framing.length.unpack_from(buf, pos)
            end = pos + size + self.framing.check(n)
            if len(buf) < end:
                break
            out.append(bytes(buf[pos + size:end]))
            pos = end
        if pos:
            del buf[:pos]
        return out


def outcomes(reader: object, chunks: list[bytes], reuse: bool) -> list[object]:
    """What each feed returned, or the message of what it raised; `reuse`: each
    chunk lands in one buffer, overwritten after the feed."""
    inbox = bytearray(max(map(len, chunks), default=0))
    got: list[object] = []
    for chunk in chunks:
        data: bytes | memoryview = chunk
        if reuse:
            inbox[:len(chunk)] = chunk
            data = memoryview(inbox)[:len(chunk)]
        try:
            got.append(reader.feed(data))  # type: ignore[attr-defined]
        except ProtocolError as e:
            got.append(str(e))
        finally:
            inbox[:] = b"\xff" * len(inbox)
    return got


# a body, or a bare length prefix that may be out of bounds (what a broken peer sends)
PIECES = st.lists(st.binary(max_size=40).map(lambda b: ("body", b))
                  | st.integers(0, 70).map(lambda n: ("length", n)), max_size=10)


@given(PIECES, st.lists(st.integers(0, 2000), max_size=16), st.booleans(),
       st.sampled_from(["<", ">"]))
def test_the_reader_cuts_what_the_buffering_reader_did(pieces: list[tuple[str, object]],
                                                      cuts: list[int], reuse: bool,
                                                      order: str) -> None:
    """Same frames from each feed, the same error at the same feed, in any chunking,
    whether a feed's bytes are its own or a reused buffer's; and after an error,
    the same error at every feed (the stream cannot be resynchronised: the reader
    must not go on cutting frames at whatever offset the next bytes start)."""
    framing = Framing(order, max_size=40, min_size=1)  # type: ignore[arg-type]
    data = b"".join(framing.length.pack(p) if kind == "length" else  # type: ignore[arg-type]
                    framing.length.pack(len(p)) + p for kind, p in pieces)  # type: ignore[arg-type]
    chunks = chunked(data, cuts)
    assert outcomes(framing.reader(), chunks, reuse) == outcomes(OldFrameReader(framing),
                                                                 chunks, reuse)
