"""The function ABI: how a request reaches a guest and how its response comes back.

One codec for every side of it: the WASM executor writes requests into guest
memory and reads responses out of it, the Python executor sends the same bytes
to its isolates over the isolate wire (`runtime.executors.python.wire`), and
the Python guest SDK (``functions/sdk/python/edgefn.py``) decodes them inside
the isolate. So this module imports only the standard library,
`edgefn_core.errors` and its own C twin (`edgefn_core.fastcodec`, an extension
built for subinterpreters): it runs inside isolated subinterpreters, where msgspec
and other C extensions do not load.

Integers are little-endian ``u32``; a *string* is a ``u32`` length followed by
that many bytes; *pairs* are a ``u32`` count followed by that many
(name string, value string)::

    request  = "EFQ1" method path query  headers:pairs  env:pairs  body  params:pairs
               [principal:pairs]
    response = u32 status  headers:pairs  body  [sections added later]

Request header names are lower-case. ``env`` is the manifest's ``[env]``.

``params`` are what the route's pattern captured: ``/users/:id`` matched on
``/users/42`` gives ``("id", "42")``; a final ``/*`` gives the rest of the path
under the name ``*`` (``/files/*`` on ``/files/a/b`` gives ``("*", "a/b")``).
Values are exactly as they appear in the path (still percent-encoded, like
``path`` itself). The section comes after the body so that guests written
before it existed keep working: they read the body by its length and never
look past it. A guest that reads params checks the request's length first: a
request that ends right after the body has no params. Sections added later go
after ``params`` in the same way, so a decoder ignores bytes it does not know; so
does `decode_response` after a response's body.

``principal`` is who is calling, as the PoP's security stages found it:
``kind`` (key, jwt), ``tenant``, ``key_id``, ``subject``, ``scopes``
(space-separated), and ``bot`` / ``agent`` (the client's class and a verified
agent's identity); absent or empty for an anonymous caller. It is the section
after ``params``, so older guests never see it.

A reactor module exports ``memory``, ``edgefn_alloc(len: i32) -> i32`` and
``edgefn_handle(ptr: i32, len: i32) -> i64``: the host calls ``edgefn_alloc``
for the request's size, writes the encoded request there, calls
``edgefn_handle`` and reads the encoded response at ``result >> 32``, length
``result & 0xffffffff``. WASI command modules get the same request as CGI
variables instead (params as ``EDGEFN_PARAM_<NAME>``, see
`runtime.executors.wasm.wasi`). See README "Guest ABI" and functions/sdk/.

`encode_request`, `decode_request`, `encode_response` and `decode_response` are the
C extension's (`edgefn_core.fastcodec`) where it loads: same results, and for
anything it is not sure of (a malformed buffer, an argument that is not bytes) it
calls the Python function here, which raises as always. `PYTHON` keeps these.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple

from edgefn_core import fastcodec
from edgefn_core.errors import FunctionError, ProtocolError

MAGIC = b"EFQ1"
NO_PAIRS = b"\0\0\0\0"  # an empty pairs section: encode_pairs([]) and encode_params({})
WILDCARD = "*"  # the param name of the rest of the path a final `/*` matched
# an RFC 9110 token and nothing after it (`$` would also match before a final newline)
HEADER_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
# a field value holds no control character but HTAB (RFC 9110 5.5: CR, LF and NUL split
# or cut it; the others, \x01 or ESC, reached clients and proxies that refuse them)
BAD_HEADER_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
CTL = bytes([*range(9), *range(10, 32), 127])  # the same bytes, for `bytes.translate`
# the same checks as bytes methods, ~3x faster, for every header of every response: a
# name is one or more of these bytes and nothing else
TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
README = 'see README "Guest ABI"'
# The header fields (names and values) a function's response may carry, as a request's
# are bounded: 200,000 fields made a 4.4 MB header block the PoP sent on
MAX_HEAD_BYTES = 64 << 10
# ... and so is their number: the check of the bytes came after every field was read,
# and 1.8 million empty fields held the PoP's loop for 2 s (the C codec hands any
# response it refuses to this module's walk, which says why)
MAX_HEAD_FIELDS = 4096

type Pairs = list[tuple[bytes, bytes]]

_U32 = struct.Struct("<I")
_pack = _U32.pack
_unpack = _U32.unpack_from
_unpack2 = struct.Struct("<II").unpack_from


class GuestRequest(NamedTuple):
    """A decoded request, every field as the bytes that crossed the ABI."""

    method: bytes
    path: bytes
    query: bytes
    headers: Pairs
    env: Pairs
    body: bytes
    params: Pairs
    principal: Pairs


# -- request -----------------------------------------------------------------------------------
def encode_pairs(pairs: Iterable[tuple[bytes, bytes]]) -> bytes:
    """A pairs section: ``u32 count`` then (name, value) strings."""
    items = list(pairs)
    out = [_pack(len(items))]
    for k, v in items:
        out += (_pack(len(k)), k, _pack(len(v)), v)
    return b"".join(out)


def encode_principal(fields: Mapping[str, str | None]) -> bytes:
    """The principal section: the fields that are set, as UTF-8."""
    return encode_pairs((k.encode(), v.encode()) for k, v in fields.items() if v)


def encode_params(params: Mapping[str, str]) -> bytes:
    """The params section for a route's captures: names and values are latin-1
    text, as the router takes them from the raw path (`NO_PAIRS` if none).
    Raises `UnicodeEncodeError` for text outside latin-1."""
    if not params:
        return NO_PAIRS
    return encode_pairs((k.encode("latin-1"), v.encode("latin-1")) for k, v in params.items())


def encode_request(method: bytes, path: bytes, query: bytes, headers: Pairs, env_blob: bytes,
                   body: bytes, params_blob: bytes = NO_PAIRS, principal_blob: bytes = b""
                   ) -> bytes:
    """Encode a request. `env_blob` is `encode_pairs(env)`, computed once per deploy;
    `params_blob` is `encode_params(captures)`; `principal_blob` is empty or
    `encode_pairs` of the principal's fields."""
    out = [MAGIC, _pack(len(method)), method, _pack(len(path)), path, _pack(len(query)), query,
           _pack(len(headers))]
    for k, v in headers:
        out += (_pack(len(k)), k, _pack(len(v)), v)
    out += (env_blob, _pack(len(body)), body, params_blob, principal_blob)
    return b"".join(out)


def decode_request(buf: bytes) -> GuestRequest:
    """Decode a request; one that ends right after the body has no params.

    Raises `ProtocolError` (naming the byte offset and the field) if `buf` does
    not start with the magic or is truncated.
    """
    if buf[:4] != MAGIC:
        raise ProtocolError(f"request does not start with {MAGIC!r}: got {bytes(buf[:4])!r}")
    # The fast walk, written out field by field (a loop over a layout string took
    # twice as long, on every request a Python function serves); on failure the
    # careful one says where and what. No bounds checks here: a field past the end
    # raises `struct.error` at the next length read, or leaves `pos` past the end.
    unpack = _unpack
    try:
        (n,) = unpack(buf, 4)
        pos = 8 + n
        method = buf[8:pos]
        (n,) = unpack(buf, pos)
        pos += 4
        path = buf[pos:pos + n]
        pos += n
        (n,) = unpack(buf, pos)
        pos += 4
        query = buf[pos:pos + n]
        headers, pos = _pairs(buf, pos + n)
        env, pos = _pairs(buf, pos)
        (n,) = unpack(buf, pos)
        pos += 4
        body = buf[pos:pos + n]
        pos += n
        size = len(buf)
        params, pos = _pairs(buf, pos) if pos < size else ([], pos)
        principal, pos = _pairs(buf, pos) if pos < size else ([], pos)
        if pos > size:
            raise struct.error("short")
    except struct.error:
        _explain_request(buf)
        raise ProtocolError("malformed request") from None  # not reached
    # `_make`, not the NamedTuple's own __new__ (a Python function: ~1 us a request)
    return GuestRequest._make((method, path, query, headers, env, body, params, principal))


def _pairs(buf: bytes, pos: int) -> tuple[Pairs, int]:
    """The pairs section at `pos` and the offset after it, unchecked as in
    `decode_request`."""
    (count,) = _unpack(buf, pos)
    pos += 4
    pairs = []
    for _ in range(count):
        (k,) = _unpack(buf, pos)
        pos += 4
        name = buf[pos:pos + k]
        (v,) = _unpack(buf, pos + k)
        pos += k + 4
        pairs.append((name, buf[pos:pos + v]))
        pos += v
    return pairs, pos


def _explain_request(buf: bytes) -> None:
    """Raises `ProtocolError` saying where `buf` stops being a request."""
    c = _Cursor(buf, "request", ProtocolError, 4)
    c.string("method"), c.string("path"), c.string("query")
    c.pairs("header"), c.pairs("env"), c.string("body")
    if c.pos < len(buf):
        c.pairs("param")
    if c.pos < len(buf):
        c.pairs("principal")


# -- response ----------------------------------------------------------------------------------
def encode_response(status: int, headers: Pairs, body: bytes) -> bytes:
    """What a guest returns (the Python guest via the isolate wire); unchecked:
    `decode_response` validates on the PoP's side."""
    out = [_pack(status), _pack(len(headers))]
    for k, v in headers:
        out += (_pack(len(k)), k, _pack(len(v)), v)
    out += (_pack(len(body)), body)
    return b"".join(out)


def decode_response(buf: bytes) -> tuple[int, Pairs, bytes]:
    """Decode and check a guest's response. Header names come back lower-cased.

    Raises `FunctionError` (``bad_response``, 502) if it is truncated (the
    message names the byte where it ends and what was expected there), has a
    status outside 200..599 (a 1xx is never a final response), carries an
    invalid header name or value, or more than `MAX_HEAD_FIELDS` header fields or
    `MAX_HEAD_BYTES` of them.
    """
    try:  # the hot path: inline, and only on failure the careful walk that explains it
        status, count = _unpack2(buf, 0)
        if count > MAX_HEAD_FIELDS:
            raise FunctionError("bad_response", 502, f"guest returned {count} header fields: "
                                f"more than {MAX_HEAD_FIELDS}")
        pos = size = 8
        headers = []
        for _ in range(count):
            (n,) = _unpack(buf, pos)
            name = buf[pos + 4:pos + 4 + n]
            pos += 4 + n
            (m,) = _unpack(buf, pos)
            value = buf[pos + 4:pos + 4 + m]
            pos += 4 + m
            if len(name) != n or len(value) != m:
                raise struct.error
            headers.append(check_header(name, value))
            size += n + m
            if size > MAX_HEAD_BYTES + 8:  # said now, not after the rest is read
                check_head_size(headers, size - 8)
        (n,) = _unpack(buf, pos)
        body = buf[pos + 4:pos + 4 + n]
        if len(body) != n:
            raise struct.error
    except struct.error:
        raise FunctionError("bad_response", 502, "malformed response from the guest: "
                            f"{_explain_response(buf)} ({README})") from None
    if not 200 <= status <= 599:
        raise FunctionError("bad_response", 502, f"guest returned invalid HTTP status {status} "
                            "(expected 200..599: a final status)")
    check_head_size(headers, size - 8)
    return status, headers, body


def check_head_size(headers: Pairs, size: int) -> None:
    """Raises `FunctionError` (``bad_response``, 502) when `headers` (`size` bytes of
    names and values) are more than `MAX_HEAD_BYTES`."""
    if size > MAX_HEAD_BYTES:
        raise FunctionError("bad_response", 502, f"guest returned {len(headers)} header "
                            f"fields of {size} bytes (names and values): more than "
                            f"{MAX_HEAD_BYTES}")


def check_header(name: bytes, value: bytes) -> tuple[bytes, bytes]:
    """`(name.lower(), value)`. Raises `FunctionError` (``bad_response``, 502) if the
    name is not a token or the value holds a control character but HTAB (CR, LF, NUL,
    DEL included)."""
    if not name or name.translate(None, TOKEN):  # `HEADER_NAME`, as bytes methods
        raise FunctionError("bad_response", 502, f"guest returned invalid header name {name!r}")
    if bad_value(value):
        raise FunctionError("bad_response", 502,
                            f"guest returned invalid value for header {name.decode()!r}")
    return name.lower(), value


def bad_value(value: bytes) -> bool:
    """Whether a header value holds a control character but HTAB (`BAD_HEADER_VALUE`,
    as bytes methods: the smallest byte first, as a value of text has none under 32,
    then the exact look for the few that do, a HTAB)."""
    return bool(value) and (min(value) < 32 or 127 in value) and \
        len(value.translate(None, CTL)) != len(value)


def _explain_response(buf: bytes) -> str:
    """Why `buf` is not a complete response, walking it field by field."""
    c = _Cursor(buf, "response", _Short)
    try:
        c.u32("status")
        count = c.u32("header count")
    except _Short as e:
        return str(e)
    try:
        for i in range(count):
            c.string(f"header {i} name")
            c.string(f"header {i} value")
        c.string("body")
    except _Short as e:
        room = len(buf) - 8
        if count * 8 > room:  # each header takes at least 8 bytes: the count is suspect
            return (f"{e}; and the u32 header count at byte 4 says {count}, more headers than "
                    f"the {room} bytes after it can hold")
        return str(e)
    return "truncated"  # not reached: decode_response failed on this buffer


# -- reading -----------------------------------------------------------------------------------
class _Short(Exception):
    """A response ended early; the message says where (internal to `_explain_response`)."""


class _Cursor:
    """Reads `buf` from `pos`; a field that does not fit raises `error` naming the
    byte offset and the field."""

    def __init__(self, buf: bytes, kind: str, error: type[Exception], pos: int = 0) -> None:
        self.buf, self.kind, self.error, self.pos = buf, kind, error, pos

    def u32(self, label: str) -> int:
        if len(self.buf) - self.pos < 4:
            raise self.error(f"{self._ends()}: expected a u32 {label}")
        (n,) = _unpack(self.buf, self.pos)
        self.pos += 4
        return int(n)

    def string(self, label: str) -> bytes:
        start, left = self.pos, len(self.buf) - self.pos
        expected = f"expected a u32 {label} length followed by the {label}"
        if left < 4:
            raise self.error(f"{self._ends()}: {expected}")
        n = self.u32(label)
        if n > left - 4:
            raw = bytes(self.buf[start:start + 4])
            raise self.error(f"the u32 {label} length at byte {start} says {n} bytes ({raw!r} "
                             f"read as a length), but the {self.kind} ends {left - 4} bytes "
                             f"later: {expected}")
        self.pos += n
        return bytes(self.buf[start + 4:self.pos])

    def pairs(self, label: str) -> Pairs:
        count = self.u32(f"{label} count")
        return [(self.string(f"{label} {i} name"), self.string(f"{label} {i} value"))
                for i in range(count)]

    def _ends(self) -> str:
        left = len(self.buf) - self.pos
        stray = f" ({left} stray bytes from byte {self.pos}: {bytes(self.buf[self.pos:])!r})"
        return f"{self.kind} ends at byte {len(self.buf)}" + (stray if left else "")


# -- the C codec -------------------------------------------------------------------------------
class Codec(NamedTuple):
    encode_request: Callable[..., bytes]
    decode_request: Callable[[bytes], GuestRequest]
    encode_response: Callable[[int, Pairs, bytes], bytes]
    decode_response: Callable[[bytes], tuple[int, Pairs, bytes]]


PYTHON = Codec(encode_request, decode_request, encode_response, decode_response)


def _native() -> Codec | None:
    """The C functions, bound to their Python twins, or None (pure Python)."""
    mod = fastcodec.module()
    if mod is None:
        return None
    mod.bind(*PYTHON, GuestRequest)
    return Codec(mod.encode_request, mod.decode_request, mod.encode_response,
                 mod.decode_response)


NATIVE = _native()
if NATIVE is not None:
    encode_request, decode_request, encode_response, decode_response = NATIVE  # type: ignore[assignment]
