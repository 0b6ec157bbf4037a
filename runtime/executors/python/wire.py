"""Frames between the PoP and an isolate (one socket per subinterpreter).

A frame is ``u32 length`` (of what follows), ``u8 kind``, payload. This module
is stdlib-only because the guest side imports it inside isolated
subinterpreters, where msgspec and friends do not load. Requests use the
reactor ABI's encoding (`runtime.executors.abi`), responses too, so the PoP
validates a Python function's response exactly like a WASM one's.

PoP -> isolate:  REQUEST (abi request), REPLY (host-call reply, JSON), CANCEL (stop a stream),
                 WARM (abi request: run the request path but not the handler; answers RESPONSE)
isolate -> PoP:  READY (JSON), RESPONSE (abi response), HEAD (abi response, empty body,
                 a streamed body follows as CHUNKs and END), CHUNK (bytes), END,
                 ERROR (JSON {"kind", "message"}), CALL (host call, JSON)
"""

from __future__ import annotations

import json
import struct

from edgefn_core.errors import ProtocolError

REQUEST, REPLY, CANCEL, WARM = b"Q", b"R", b"Z", b"W"
READY, RESPONSE, HEAD, CHUNK, END, ERROR, CALL = b"S", b"P", b"H", b"C", b"E", b"X", b"K"
MAX_FRAME = 64 << 20
_LEN = struct.Struct("<I")



def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return _LEN.pack(len(payload) + 1) + kind + payload


def json_frame(kind: bytes, obj: object) -> bytes:
    return frame(kind, json.dumps(obj).encode())


class Reader:
    """Accumulates bytes and yields complete frames as (kind, payload)."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """Raises `ProtocolError` for a frame over `MAX_FRAME` or an empty one."""
        self.buf += data
        out = []
        while len(self.buf) >= 4:
            (n,) = _LEN.unpack_from(self.buf, 0)
            if n == 0 or n > MAX_FRAME:
                raise ProtocolError(f"bad frame length {n}")
            if len(self.buf) < 4 + n:
                break
            out.append((bytes(self.buf[4:5]), bytes(self.buf[5:4 + n])))
            del self.buf[:4 + n]
        return out


def recv_frame(sock: object, reader: Reader,
               pending: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes] | None:
    """Blocking read of the next frame from a socket; None at EOF."""
    while not pending:
        data = sock.recv(1 << 16)  # type: ignore[attr-defined]
        if not data:
            return None
        pending.extend(reader.feed(data))
    return pending.pop(0)


def encode_response(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
    out = [struct.pack("<II", status, len(headers))]
    for k, v in headers:
        out += (_LEN.pack(len(k)), k, _LEN.pack(len(v)), v)
    out += (_LEN.pack(len(body)), body)
    return b"".join(out)
