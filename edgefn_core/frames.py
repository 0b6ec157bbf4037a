"""Length-prefixed frames: one framing for edgefn's byte-stream IPC.

A frame is a ``u32`` length followed by that many bytes. A `Framing` fixes the
byte order and the size limits of one channel; both ends build it from the
same values, write with `Framing.pack` (or `Framing.prefix` + the parts, which
saves a copy of a large payload) and read with a `FrameReader`, which takes
bytes in whatever chunks the socket delivers, or with `Framing.read` from an
asyncio stream.

The isolate wire (`runtime.executors.python.wire`) is ``Framing("<", 64 MiB,
min_size=1)``: every frame carries at least its kind byte. Stdlib-only and
importing nothing of edgefn but `edgefn_core.errors` (and the C codec,
`edgefn_core.fastcodec`, which cuts frames for the two cuts below where it loads), so
isolated subinterpreters import it too.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from edgefn_core import fastcodec
from edgefn_core.errors import ProtocolError

if TYPE_CHECKING:  # not imported: a fresh isolate's interpreter spent ~50 ms on asyncio
    import asyncio

MAX_FRAME = 64 << 20
_native = fastcodec.module()


class Framing:
    """The framing of one channel: byte order of the length, and the smallest and
    largest frame body it accepts."""

    def __init__(self, order: Literal["<", ">"] = "<", max_size: int = MAX_FRAME,
                 min_size: int = 0) -> None:
        self.length = struct.Struct(order + "I")
        self.max_size = max_size
        self.min_size = min_size

    def check(self, n: int) -> int:
        """`n` if it is an acceptable body size. Raises `ProtocolError` if not."""
        if n < self.min_size:
            raise ProtocolError(f"frame of {n} bytes is shorter than the {self.min_size} "
                                "byte minimum")
        if n > self.max_size:
            raise ProtocolError(f"frame of {n} bytes exceeds the {self.max_size} byte limit")
        return n

    def prefix(self, n: int) -> bytes:
        """The length prefix of a frame whose body is `n` bytes. Raises `ProtocolError`
        if the peer would refuse that size."""
        return self.length.pack(self.check(n))

    def pack(self, body: bytes) -> bytes:
        """A whole frame. Raises `ProtocolError` if `body`'s size is out of bounds."""
        return self.prefix(len(body)) + body

    def reader(self) -> FrameReader[bytes]:
        """A reader whose `feed` returns frame bodies."""
        return FrameReader(self, body)

    async def read(self, stream: asyncio.StreamReader) -> bytes:
        """The next frame's body from an asyncio stream. Raises
        `asyncio.IncompleteReadError` at EOF and `ProtocolError` for a bad length."""
        (n,) = self.length.unpack(await stream.readexactly(self.length.size))
        return await stream.readexactly(self.check(n))


def body(buf: bytes | bytearray | memoryview, start: int, end: int) -> bytes:
    """The default cut of a `FrameReader`: the frame's body as bytes."""
    return bytes(buf[start:end])


# every kind byte as bytes, made once: a frame's kind is looked up, not built
KINDS = [bytes((i,)) for i in range(256)]


def kind_and_payload(buf: bytes | bytearray | memoryview, start: int,
                     end: int) -> tuple[bytes, bytes]:
    """The cut of a framing whose body is a kind byte and a payload (the isolate wire;
    its `min_size` must be 1). One copy out of `buf`, through a view: ``bytes(buf[a:b])``
    copied twice, and for a 16 MiB frame paid the page faults of two fresh 16 MiB
    buffers (~35 ms here)."""
    with memoryview(buf) as view:
        return KINDS[view[start]], bytes(view[start + 1:end])


class FrameReader[T]:
    """Accumulates bytes and returns each complete frame, as `cut(buf, start, end)`
    makes it from the body at ``buf[start:end]`` (cutting there saves a copy); `buf`
    is the reader's own buffer or the data fed, which the caller may reuse: `cut`
    copies what it keeps. With the C codec loaded, `body` and `kind_and_payload`
    (with a `min_size` of at least 1) are cut in C."""

    def __init__(self, framing: Framing,
                 cut: Callable[[bytes | bytearray | memoryview, int, int], T]) -> None:
        self.framing = framing
        self.cut = cut
        self.buf = bytearray()
        self.native = _native is not None and (
            cut is body or (cut is kind_and_payload and framing.min_size >= 1))
        self.big = framing.length.format == ">I"
        self.kinds = KINDS if cut is kind_and_payload else None

    def feed(self, data: bytes | bytearray | memoryview) -> list[T]:
        """The frames `data` completes, in order; a partial frame waits for more.
        `data` is copied: the caller may reuse its buffer.

        Raises `ProtocolError` for a length outside the framing's bounds; the
        stream cannot be resynchronised after that, and every later feed raises it
        again (the bad length is kept).
        """
        held = self.buf
        if held:
            held += data
            buf: bytes | bytearray | memoryview = held
        else:  # nothing held (the usual case): frames are cut from `data` itself, and
            buf = data  # only a partial one's bytes are kept (two copies less a frame)
        try:
            out, pos = self._cut_native(buf) if self.native else self._cut(buf)
        except ProtocolError:
            if not held:  # keep the bad length, or the next feed would cut frames from
                held += buf  # wherever its bytes start (the whole buffer is kept when held)
            raise
        if held:
            del held[:pos]  # once per feed, not once per frame
        elif pos < len(buf):
            held += buf[pos:]
        return out

    def _cut(self, buf: bytes | bytearray | memoryview) -> tuple[list[T], int]:
        """The complete frames in `buf` and where the rest starts. Raises
        `ProtocolError` at a bad length."""
        size, out, pos = self.framing.length.size, [], 0
        unpack, check = self.framing.length.unpack_from, self.framing.check
        while len(buf) - pos >= size:
            (n,) = unpack(buf, pos)
            end = pos + size + check(n)
            if len(buf) < end:
                break
            out.append(self.cut(buf, pos + size, end))
            pos = end
        return out, pos

    def _cut_native(self, buf: bytes | bytearray | memoryview) -> tuple[list[T], int]:
        """`_cut` in C (`codec.c` ``cut_frames``)."""
        framing = self.framing
        out, pos, bad = _native.cut_frames(  # type: ignore[union-attr]
            buf, self.big, framing.min_size, framing.max_size, self.kinds)
        if bad >= 0:
            framing.check(bad)  # raises its error
        return out, pos
