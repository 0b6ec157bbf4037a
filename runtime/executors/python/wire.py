"""Frames between the PoP and an isolate (one socket per subinterpreter).

A frame is ``u32 length`` (of what follows, little-endian), ``u8 kind``,
payload: the framing of `edgefn_core.frames` with a one-byte minimum. Payloads
that carry a request or a response use the function ABI's encoding
(`edgefn_core.abi`), so the PoP validates a Python function's response exactly
like a WASM one's. This module is stdlib-only because the guest side imports
it inside isolated subinterpreters, where msgspec and friends do not load.

PoP -> isolate:  REQUEST (abi request), REPLY (host-call reply, JSON), CANCEL (stop a stream),
                 WARM (abi request: run the request path but not the handler; answers RESPONSE),
                 DROP (hand back every REQUEST sent before it that has not started)
isolate -> PoP:  READY (JSON), RESPONSE (abi response), HEAD (abi response, empty body,
                 a streamed body follows as CHUNKs and END), CHUNK (bytes), END,
                 ERROR (JSON {"kind", "message"}), CALL (host call, JSON),
                 DROPPED (JSON {"n"}: the answer to a DROP, the last n requests not started
                 handed back; {"n", "ended": true}: its interpreter ends, the first n not
                 started handed back, unasked)

Requests sent ahead (`pool.pipeline`): the PoP may send a REQUEST to an isolate
that is still running one; the guest runs them in the order sent, each once its
previous one's last frame was sent. So every frame of a request comes after the
last frame of the one before it, and a CANCEL applies to the last REQUEST sent
before it (the PoP sends one only for a request with none sent behind it).
host -> PoP:     RETIRE (JSON {"why"}): sent by the isolate-host process itself (between two
                 interpreters, on one isolate's socket): replace this host, it runs out of room;
                 THREAD (JSON {"tid"}): the first frame on each isolate's socket, sent before
                 any function code runs: the thread that serves it (the PoP reads its CPU time)

A KV value travels raw: CALL_VALUE (isolate -> PoP: ``kv.put``, ``kv.cas``) and
REPLY_VALUE (PoP -> isolate: ``kv.get``'s answer) are ``u32 head length``, the head
(the CALL's or the REPLY's JSON with the value emptied: ``"value": ""``), then the
value's bytes, up to the frame's end. A 16 MiB value in JSON was base64-encoded and
JSON-encoded (a get) or scanned and parsed (a put) on the PoP's loop, which every tenant
shares: ~100-190 ms of it on a 2-core machine; raw, the PoP reads and writes only the
head, ~8-10 ms (`bench/bench_kv.py --only large`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from functools import partial
from typing import Any

from edgefn_core import abi, fastcodec
from edgefn_core.abi import encode_response
from edgefn_core.errors import ProtocolError
from edgefn_core.frames import MAX_FRAME, FrameReader, Framing, kind_and_payload

REQUEST, REPLY, CANCEL, WARM, DROP = b"Q", b"R", b"Z", b"W", b"D"
READY, RESPONSE, HEAD, CHUNK, END, ERROR, CALL = b"S", b"P", b"H", b"C", b"E", b"X", b"K"
RETIRE, THREAD, DROPPED = b"T", b"N", b"d"
CALL_VALUE, REPLY_VALUE = b"B", b"V"
# the calls whose value the SDK sends raw (CALL_VALUE; the PoP takes no other), and those
# the PoP answers with the value raw (REPLY_VALUE), under "value" in args or result
VALUE_CALLS = frozenset({"kv.put", "kv.cas"})
VALUE_REPLIES = frozenset({"kv.get"})
HEAD_LENGTH = struct.Struct("<I")  # of a CALL_VALUE's or REPLY_VALUE's head
FRAMING = Framing("<", MAX_FRAME, min_size=1)
FRAME_HEAD = FRAMING.length.size + 1  # bytes before a frame's payload: its length, its kind
MAX_BODY = 256 << 20  # the ceiling of limits.max_response_mb
# a whole response in one frame: a body up to MAX_BODY and its head
RESPONSE_FRAMING = Framing("<", MAX_BODY + (1 << 20), min_size=1)
# an ERROR frame's traceback: its last characters (where it failed), cut by the guest
# and again by the PoP (past its frame bound, the PoP takes the frame for a forgery)
MAX_TRACEBACK = 64 << 10

__all__ = ["FRAME_HEAD", "FRAMING", "MAX_BODY", "MAX_FRAME", "RESPONSE_FRAMING", "Reader",
           "encode_response", "frame", "json_frame", "recv_frame", "split_value", "value_frame"]


def frame(kind: bytes, payload: bytes = b"", framing: Framing = FRAMING) -> bytes:
    """Raises `ProtocolError` if the payload is over `framing`'s limit (the peer would
    refuse it)."""
    return framing.prefix(len(payload) + 1) + kind + payload


def response_framer(response: type, headers: type) -> Callable[[Any, int], bytes | None]:
    """``framer(result, max_body)``: the RESPONSE frame of a `response` (the SDK's
    `Response`, exactly) with an int status in 200..599, a bytes or str body of at
    most `max_body` bytes and `headers` (the SDK's `Headers`, exactly) of str pairs,
    made in C in one call (`_edgefn_codec.response_frame`); None for anything else,
    and always without the C codec: the guest's Python path (the reference) then
    makes the frame or says what is wrong with the response."""
    if abi.NATIVE is None:  # (else `abi._native` bound the module: its names are set)
        return _no_frame
    return partial(fastcodec.module().response_frame,  # type: ignore[union-attr]
                   response, headers, RESPONSE, RESPONSE_FRAMING.max_size)


def _no_frame(result: Any, max_body: int) -> None:
    return None


def json_frame(kind: bytes, obj: object) -> bytes:
    return frame(kind, json.dumps(obj).encode())


def value_frame(kind: bytes, head: bytes, value: bytes) -> tuple[bytes, bytes]:
    """A CALL_VALUE or REPLY_VALUE frame as two parts, the value last and untouched
    (written after the rest, it is never copied into a frame). Raises `ProtocolError`
    if the frame is over `FRAMING`'s limit."""
    size = 1 + HEAD_LENGTH.size + len(head) + len(value)
    return FRAMING.prefix(size) + kind + HEAD_LENGTH.pack(len(head)) + head, value


def split_value(payload: bytes) -> tuple[bytes, memoryview]:
    """The head and the value (a view: not copied) of a CALL_VALUE or REPLY_VALUE
    payload. Raises `ProtocolError` if its head length is more than the payload holds."""
    if len(payload) < HEAD_LENGTH.size:
        raise ProtocolError(f"a value frame of {len(payload)} bytes has no head length")
    (n,) = HEAD_LENGTH.unpack_from(payload)
    end = HEAD_LENGTH.size + n
    if end > len(payload):
        raise ProtocolError(f"a value frame's head of {n} bytes is longer than the "
                            f"{len(payload) - HEAD_LENGTH.size} bytes after its length")
    return payload[HEAD_LENGTH.size:end], memoryview(payload)[end:]


class Reader(FrameReader[tuple[bytes, bytes]]):
    """Accumulates bytes and returns complete frames as (kind, payload); `feed`
    raises `ProtocolError` for a frame over `MAX_FRAME` or an empty one."""

    def __init__(self, framing: Framing = FRAMING) -> None:
        """`framing`: the largest frame it takes (the PoP's reader of one function's
        isolate takes a whole response up to its `limits.max_response_mb`)."""
        super().__init__(framing, kind_and_payload)
        # `recv_frame` reads into this rather than allocating 64 KiB per read
        self.inbox = bytearray(1 << 16)
        self.inbox_view = memoryview(self.inbox)


def recv_frame(sock: object, reader: Reader,
               pending: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes] | None:
    """Blocking read of the next frame from a socket; None at EOF. Raises
    `ProtocolError` (see `Reader.feed`)."""
    while not pending:
        n = sock.recv_into(reader.inbox)  # type: ignore[attr-defined]
        if not n:
            return None
        pending.extend(reader.feed(reader.inbox_view[:n]))
    return pending.pop(0)
