"""The reactor guest ABI: how a request enters guest memory and a response leaves it.

A reactor module exports ``memory``, ``edgefn_alloc(len: i32) -> i32`` and
``edgefn_handle(ptr: i32, len: i32) -> i64``. The host calls ``edgefn_alloc``
for the request's size, writes the encoded request there, calls
``edgefn_handle`` and reads the encoded response at ``result >> 32`` with
length ``result & 0xffffffff``. Integers are little-endian ``u32``; a
"string" is a ``u32`` length followed by that many bytes.

Request  = magic "EFQ1", method, path, query, u32 n_headers, (name, value) * n,
           u32 n_env, (name, value) * n, body
Response = u32 status, u32 n_headers, (name, value) * n, body

Header names arrive lower-cased. See README "Guest ABI" and functions/sdk/.
"""

from __future__ import annotations

import re
import struct

from edgefn_core.errors import FunctionError

MAGIC = b"EFQ1"
_U32 = struct.Struct("<I")
_U32x2 = struct.Struct("<II")
_pack = _U32.pack
_unpack2 = _U32x2.unpack_from
_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_BAD_VALUE = re.compile(rb"[\r\n\x00]")


def encode_pairs(pairs: list[tuple[bytes, bytes]]) -> bytes:
    out = [_pack(len(pairs))]
    for k, v in pairs:
        out += (_pack(len(k)), k, _pack(len(v)), v)
    return b"".join(out)


def encode_request(method: bytes, path: bytes, query: bytes,
                   headers: list[tuple[bytes, bytes]], env_blob: bytes, body: bytes) -> bytes:
    """Encode a request; `env_blob` is `encode_pairs(env)`, computed once per deploy."""
    out = [MAGIC, _pack(len(method)), method, _pack(len(path)), path, _pack(len(query)), query,
           _pack(len(headers))]
    for k, v in headers:
        out += (_pack(len(k)), k, _pack(len(v)), v)
    out += (env_blob, _pack(len(body)), body)
    return b"".join(out)


def decode_response(buf: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Decode and check a guest's response.

    Raises `FunctionError` (``bad_response``, 502) if it is truncated, has a
    status outside 100..599, or carries an invalid header name or value.
    """
    try:
        status, count = _unpack2(buf, 0)
        pos = 8
        headers = []
        for _ in range(count):
            (n,) = _U32.unpack_from(buf, pos)
            name = buf[pos + 4:pos + 4 + n]
            pos += 4 + n
            (m,) = _U32.unpack_from(buf, pos)
            value = buf[pos + 4:pos + 4 + m]
            pos += 4 + m
            if len(name) != n or len(value) != m:
                raise struct.error("truncated header")
            headers.append(_check_header(name, value))
        (blen,) = _U32.unpack_from(buf, pos)
        body = buf[pos + 4:pos + 4 + blen]
        if len(body) != blen:
            raise struct.error("truncated body")
    except struct.error as e:
        raise FunctionError("bad_response", 502,
                            f"malformed response from the guest: {e}") from None
    if not 100 <= status <= 599:
        raise FunctionError("bad_response", 502, f"guest returned invalid HTTP status {status}")
    return status, headers, body


def _check_header(name: bytes, value: bytes) -> tuple[bytes, bytes]:
    if not _TOKEN.match(name):
        raise FunctionError("bad_response", 502, f"guest returned invalid header name {name!r}")
    if _BAD_VALUE.search(value):
        raise FunctionError("bad_response", 502,
                            f"guest returned invalid value for header {name.decode()!r}")
    return name.lower(), value
