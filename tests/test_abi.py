"""The function ABI codec (`edgefn_core.abi`) without a guest: round trips,
truncation anywhere, what a malformed response is told, and that the codec
loads where the guest SDK needs it (an isolated subinterpreter)."""

from __future__ import annotations

import importlib.util
import re
import struct
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgefn_core import abi
from edgefn_core.errors import FunctionError, ProtocolError
from runtime.executors.python import interp

SDK = Path(__file__).resolve().parent.parent / "functions" / "sdk" / "python" / "edgefn" / "__init__.py"

PAIRS = st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=40)), max_size=6)
TOKEN = st.text("abcxyzABC0123456789-_!#$%&'*+.^`|~", min_size=1, max_size=16).map(str.encode)
VALUE = st.binary(max_size=40).filter(lambda v: not abi.BAD_HEADER_VALUE.search(v))
REQUESTS = st.builds(abi.GuestRequest, st.binary(max_size=8), st.binary(max_size=60),
                     st.binary(max_size=60), PAIRS, PAIRS, st.binary(max_size=300), PAIRS,
                     PAIRS)


def encode(r: abi.GuestRequest) -> bytes:
    """As the PoP sends it: no principal section for an anonymous caller."""
    return abi.encode_request(r.method, r.path, r.query, r.headers, abi.encode_pairs(r.env),
                              r.body, abi.encode_pairs(r.params),
                              abi.encode_pairs(r.principal) if r.principal else b"")


def short_forms(r: abi.GuestRequest) -> dict[int, abi.GuestRequest]:
    """The cuts of `encode(r)` that still decode: what a PoP from before params, or
    before the principal, sends."""
    buf = encode(r)
    tail = len(abi.encode_pairs(r.principal)) if r.principal else 0
    forms = {len(buf) - tail - len(abi.encode_pairs(r.params)): r._replace(params=[],
                                                                            principal=[])}
    if tail:
        forms[len(buf) - tail] = r._replace(principal=[])
    return forms


@given(REQUESTS)
def test_requests_round_trip(r: abi.GuestRequest) -> None:
    assert abi.decode_request(encode(r)) == r


@given(REQUESTS, st.data())
def test_a_cut_request_is_refused_unless_it_ends_right_after_the_body(
        r: abi.GuestRequest, data: st.DataObject) -> None:
    buf = encode(r)
    cut = data.draw(st.integers(0, len(buf) - 1))
    short = short_forms(r)
    if cut in short:
        assert abi.decode_request(buf[:cut]) == short[cut]
    else:
        with pytest.raises(ProtocolError, match=r"request (ends at byte|does not start)|says"):
            abi.decode_request(buf[:cut])


def old_guest_body(buf: bytes) -> bytes:
    """How guests written before params read a request: field by field, the body by
    its length, nothing after it."""
    pos = 4
    for _ in range(3):
        pos += 4 + struct.unpack_from("<I", buf, pos)[0]
    for _ in range(2):
        (count,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        for _ in range(2 * count):
            pos += 4 + struct.unpack_from("<I", buf, pos)[0]
    (n,) = struct.unpack_from("<I", buf, pos)
    return buf[pos + 4:pos + 4 + n]


@given(REQUESTS)
def test_guests_that_predate_params_still_read_the_body(r: abi.GuestRequest) -> None:
    assert old_guest_body(encode(r)) == r.body


def test_params_are_latin1_text_and_none_is_an_empty_section() -> None:
    assert abi.encode_params({}) == abi.NO_PAIRS == abi.encode_pairs([])
    blob = abi.encode_params({"id": "42", "*": "a/b\xe9"})
    assert blob == (b"\x02\0\0\0" b"\x02\0\0\0id" b"\x02\0\0\x0042"
                    b"\x01\0\0\0*" b"\x04\0\0\0a/b\xe9")


@given(st.integers(200, 599), st.lists(st.tuples(TOKEN, VALUE), max_size=6),
       st.binary(max_size=300))
def test_responses_round_trip_with_names_lower_cased(
        status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    decoded = abi.decode_response(abi.encode_response(status, headers, body))
    assert decoded == (status, [(k.lower(), v) for k, v in headers], body)


@given(st.integers(200, 599), st.lists(st.tuples(TOKEN, VALUE), max_size=4),
       st.binary(max_size=100), st.data())
def test_every_truncated_response_is_a_bad_response(
        status: int, headers: list[tuple[bytes, bytes]], body: bytes,
        data: st.DataObject) -> None:
    buf = abi.encode_response(status, headers, body)
    cut = data.draw(st.integers(0, len(buf) - 1))
    with pytest.raises(FunctionError) as err:
        abi.decode_response(buf[:cut])
    assert (err.value.code, err.value.status) == ("bad_response", 502)
    assert "malformed response" in str(err.value) and 'README "Guest ABI"' in str(err.value)


# What hello.wat returns, but with the body's u32 length forgotten.
HEAD = b"\xc8\0\0\0\x01\0\0\0\x0c\0\0\0content-type\x19\0\0\0text/plain; charset=utf-8"


@pytest.mark.parametrize(("buf", "message"), [
    (HEAD, "response ends at byte 53: expected a u32 body length followed by the body"),
    (HEAD + b"Hello from edgefn!\n",
     "the u32 body length at byte 53 says 1819043144 bytes (b'Hell' read as a length), but "
     "the response ends 15 bytes later: expected a u32 body length followed by the body"),
    (HEAD + b"hi", "response ends at byte 55 (2 stray bytes from byte 53: b'hi'): expected a u32 "
                   "body length followed by the body"),
    (b"", "response ends at byte 0: expected a u32 status"),
    (b"\xc8\0\0\0\x01\0", "response ends at byte 6 (2 stray bytes from byte 4: b'\\x01\\x00'): "
                          "expected a u32 header count"),
    (b"\xc8\0\0\0\x05\0\0\0\0\0\0\0",
     "response ends at byte 12: expected a u32 header 0 value length followed by the header 0 "
     "value; and the u32 header count at byte 4 says 5, more headers than the 4 bytes after it "
     "can hold"),
    (b"\xc8\0\0\0\x01\0\0\0\x03\0\0\0x-a",
     "response ends at byte 15: expected a u32 header 0 value length followed by the "
     "header 0 value; and the u32 header count at byte 4 says 1, more headers than the 7 bytes "
     "after it can hold"),
    (b"\xc8\0\0\0", "response ends at byte 4: expected a u32 header count"),
    (b"\xc8\0\0\0\x01\0\0\0\x03\0\0\0x-a\0\0\0\0",
     "response ends at byte 19: expected a u32 body length followed by the body"),
    (b"\xc8\0\0\0\x01\0\0\0\x05\0\0\0x-",
     "the u32 header 0 name length at byte 8 says 5 bytes (b'\\x05\\x00\\x00\\x00' read as a "
     "length), but the response ends 2 bytes later: expected a u32 header 0 name length "
     "followed by the header 0 name; and the u32 header count at byte 4 says 1, more headers "
     "than the 6 bytes after it can hold"),
    # 8 bytes after the count: room for one header of 8 bytes, so no suspicion
    (b"\xc8\0\0\0\x01\0\0\0\x01\0\0\0a\x05\0\0",
     "response ends at byte 16 (3 stray bytes from byte 13: b'\\x05\\x00\\x00'): expected a "
     "u32 header 0 value length followed by the header 0 value"),
    # 17 bytes after the count: room for two headers of 8 bytes at least, so no suspicion
    (b"\xc8\0\0\0\x02\0\0\0\x01\0\0\0a\0\0\0\0\x04\0\0\0abcd",
     "response ends at byte 25: expected a u32 header 1 value length followed by the "
     "header 1 value"),
])
def test_a_malformed_response_is_told_where_it_ends_and_what_was_expected(
        buf: bytes, message: str) -> None:
    with pytest.raises(FunctionError) as err:
        abi.decode_response(buf)
    assert (err.value.code, err.value.status) == ("bad_response", 502)
    assert str(err.value) == f'malformed response from the guest: {message} (see README "Guest ABI")'


def test_bytes_after_the_body_are_ignored_and_599_is_a_status() -> None:
    buf = abi.encode_response(599, [], b"body") + b"trailing"
    assert abi.decode_response(buf) == (599, [], b"body")


def request_fields(r: abi.GuestRequest) -> list[tuple[str, str, bytes]]:
    """The request's fields in wire order: (kind, label, content) with kind "s" for a
    length-prefixed string and "n" for a pairs count."""
    out = [("s", "method", r.method), ("s", "path", r.path), ("s", "query", r.query)]
    for label, pairs in (("header", r.headers), ("env", r.env)):
        out.append(("n", f"{label} count", struct.pack("<I", len(pairs))))
        for i, (k, v) in enumerate(pairs):
            out += [("s", f"{label} {i} name", k), ("s", f"{label} {i} value", v)]
    out.append(("s", "body", r.body))
    out.append(("n", "param count", struct.pack("<I", len(r.params))))
    for i, (k, v) in enumerate(r.params):
        out += [("s", f"param {i} name", k), ("s", f"param {i} value", v)]
    if r.principal:
        out.append(("n", "principal count", struct.pack("<I", len(r.principal))))
        for i, (k, v) in enumerate(r.principal):
            out += [("s", f"principal {i} name", k), ("s", f"principal {i} value", v)]
    return out


def cut_message(r: abi.GuestRequest, cut: int) -> str:
    """What `decode_request` must say about `encode(r)[:cut]`, worked out from the
    fields' offsets (an oracle apart from the codec's own walk)."""
    pos = 4
    for kind, label, content in request_fields(r):
        size = 4 if kind == "n" else 4 + len(content)
        if cut < pos + size:
            left = cut - pos
            if kind == "s" and left >= 4:
                raw = struct.pack("<I", len(content))
                return (f"the u32 {label} length at byte {pos} says {len(content)} bytes "
                        f"({raw!r} read as a length), but the request ends {left - 4} bytes "
                        f"later: expected a u32 {label} length followed by the {label}")
            stray = f" ({left} stray bytes from byte {pos}: {encode(r)[pos:cut]!r})" if left else ""
            expected = (f"a u32 {label}" if kind == "n"
                        else f"a u32 {label} length followed by the {label}")
            return f"request ends at byte {cut}{stray}: expected {expected}"
        pos += size
    raise AssertionError("the cut is past the end")


@given(REQUESTS, st.data())
def test_a_cut_request_is_told_which_field_it_ends_in(
        r: abi.GuestRequest, data: st.DataObject) -> None:
    buf = encode(r)
    cut = data.draw(st.integers(4, len(buf) - 1))
    if cut in short_forms(r):
        return  # a request from before params or the principal: it decodes (the test above)
    with pytest.raises(ProtocolError) as err:
        abi.decode_request(buf[:cut])
    assert str(err.value) == cut_message(r, cut)


def test_a_request_cut_in_the_magic_is_told_what_it_got() -> None:
    for buf, got in ((b"EFQ", "b'EFQ'"), (b"EFQ2EFQ1", "b'EFQ2'")):
        with pytest.raises(ProtocolError) as err:
            abi.decode_request(buf)
        assert str(err.value) == f"request does not start with b'EFQ1': got {got}"


FULL = abi.GuestRequest(b"GET", b"/p", b"q=1", [(b"h", b"v")], [(b"E", b"w")], b"body",
                        [(b"id", b"7")], [(b"tenant", b"acme")])


@pytest.mark.parametrize("cut", range(4, len(encode(FULL))))
def test_every_cut_of_a_request_with_every_field_names_its_field(cut: int) -> None:
    buf = encode(FULL)
    if cut in short_forms(FULL):
        assert abi.decode_request(buf[:cut]) == short_forms(FULL)[cut]
        return
    with pytest.raises(ProtocolError) as err:
        abi.decode_request(buf[:cut])
    assert str(err.value) == cut_message(FULL, cut)


@pytest.mark.parametrize(("status", "headers", "words"), [
    (99, [], "invalid HTTP status 99"),
    (100, [], "invalid HTTP status 100"),  # a 1xx is never final: it would break framing
    (199, [], "invalid HTTP status 199"),
    (600, [], "invalid HTTP status 600"),
    (200, [(b"bad name", b"x")], "invalid header name b'bad name'"),
    (200, [(b"", b"x")], "invalid header name b''"),
    (200, [(b"x-a\n", b"x")], "invalid header name b'x-a\\n'"),  # `$` matched before \n
    (200, [(b"x-a", b"1\r\nevil: 1")], "invalid value for header 'x-a'"),
    (200, [(b"x-a", b"1\0")], "invalid value for header 'x-a'"),
])
def test_invalid_status_and_headers_are_bad_responses(
        status: int, headers: list[tuple[bytes, bytes]], words: str) -> None:
    with pytest.raises(FunctionError) as err:
        abi.decode_response(abi.encode_response(status, headers, b"body"))
    assert (err.value.code, err.value.status) == ("bad_response", 502)
    assert words in str(err.value)


# bytes near the edges of the token set and the forbidden value bytes
HEADER_BYTES = st.binary(max_size=12) | st.lists(
    st.sampled_from(b"aZ09-_!~|`^.\x00\r\n\t :;\"(),/<=>?@[\\]{}\x7f\x80\xff"),
    max_size=12).map(bytes)


@given(HEADER_BYTES, HEADER_BYTES)
def test_a_response_header_is_checked_as_the_token_and_value_patterns_say(
        name: bytes, value: bytes) -> None:
    """`check_header` (bytes methods, on the hot path) and the patterns the WASI path
    uses (`HEADER_NAME`, `BAD_HEADER_VALUE`) take and refuse the same fields."""
    valid = bool(abi.HEADER_NAME.match(name)) and not abi.BAD_HEADER_VALUE.search(value)
    try:
        assert abi.check_header(name, value) == (name.lower(), value) and valid
    except FunctionError:
        assert not valid


def test_a_response_s_header_fields_are_bounded() -> None:
    """200,000 fields made a 4.4 MB header block the PoP sent on."""
    at = [(b"x-%05d" % i, b"v" * (abi.MAX_HEAD_BYTES // 64 - 7)) for i in range(64)]
    assert sum(len(k) + len(v) for k, v in at) == abi.MAX_HEAD_BYTES
    assert abi.decode_response(abi.encode_response(200, at, b""))[1] == at
    over = [*at, (b"x", b"")]
    with pytest.raises(FunctionError) as err:
        abi.decode_response(abi.encode_response(200, over, b""))
    assert (err.value.code, err.value.status) == ("bad_response", 502)
    assert str(err.value).endswith(f"guest returned 65 header fields of "
                                   f"{abi.MAX_HEAD_BYTES + 1} bytes (names and values): more "
                                   f"than {abi.MAX_HEAD_BYTES}")


def test_a_response_s_header_fields_are_counted_before_they_are_read() -> None:
    """1.8 million empty fields were each read and checked before the bytes were
    counted: the PoP's loop held 2 s for one response (the C codec hands what it
    refuses to this walk)."""
    import struct

    fields = [(b"a", b"")] * abi.MAX_HEAD_FIELDS
    assert abi.decode_response(abi.encode_response(200, fields, b""))[1] == fields
    with pytest.raises(FunctionError, match=r"^guest returned 4097 header fields: more than "
                                            r"4096$"):
        abi.decode_response(abi.encode_response(200, [*fields, (b"a", b"")], b""))
    huge = struct.pack("<II", 200, 1_800_000) + b"\x01\0\0\0a\0\0\0\0" * 1_800_000
    with pytest.raises(FunctionError, match=r"^guest returned 1800000 header fields"):
        abi.decode_response(huge + b"\0\0\0\0")
    # the bytes are said at the field that passes them, the rest unread
    wide = [(b"x-%04d" % i, b"v" * 100) for i in range(1000)]
    with pytest.raises(FunctionError, match=r"guest returned 619 header fields of 65614 bytes"):
        abi.decode_response(abi.encode_response(200, wide, b""))


def test_a_request_without_the_magic_is_refused() -> None:
    with pytest.raises(ProtocolError, match="does not start with b'EFQ1'"):
        abi.decode_request(b"EFQ2" + encode(abi.GuestRequest(b"", b"", b"", [], [], b"", [], []))[4:])


def load_sdk() -> ModuleType:
    spec = importlib.util.spec_from_file_location("edgefn_sdk_under_test", SDK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_python_sdk_decodes_with_the_shared_codec() -> None:
    sdk = load_sdk()
    buf = abi.encode_request(b"PUT", b"/users/42/a%20b", b"x=1", [(b"host", b"h.test")],
                             abi.encode_pairs([(b"MODE", b"pr\xc3\xb6d")]), b"{}",
                             abi.encode_params({"id": "42", "*": "a%20b"}))
    request, env = sdk.Request._decode(buf)
    assert (request.method, request.path, request.query) == ("PUT", "/users/42/a%20b", {"x": "1"})
    assert request.params == {"id": "42", "*": "a%20b"} and request.body == b"{}"
    assert request.url == "http://h.test/users/42/a%20b?x=1" and env == {"MODE": "pr\xf6d"}
    old, _ = sdk.Request._decode(buf[:-len(abi.encode_params({"id": "42", "*": "a%20b"}))])
    assert old.params == {}


def test_the_codec_and_frames_load_in_an_isolated_subinterpreter() -> None:
    """They run inside isolates, where msgspec and other C extensions cannot load."""
    root = str(Path(__file__).resolve().parent.parent)
    i = interp.create()
    try:
        code = (f"import sys\nsys.path.insert(0, {root!r})\n"
                "import edgefn_core.abi, edgefn_core.frames\n"
                "assert 'msgspec' not in sys.modules\n"
                "buf = edgefn_core.abi.encode_response(200, [], b'ok')\n"
                "assert edgefn_core.abi.decode_response(buf) == (200, [], b'ok')\n")
        assert interp.run(i, code) is None
    finally:
        interp.destroy(i)


# -- equivalence with the codec before its hot-path rewrite (0622670) ----------------------------
# The reference: `check_header` with the two regular expressions, and `decode_request`
# walking a layout string, as they were; the rewrite must answer the same on any input.
_OLD_HEADER_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_OLD_BAD_HEADER_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # every CTL but HTAB


def old_check_header(name: bytes, value: bytes) -> tuple[bytes, bytes]:
    if not _OLD_HEADER_NAME.match(name):
        raise FunctionError("bad_response", 502, f"guest returned invalid header name {name!r}")
    if _OLD_BAD_HEADER_VALUE.search(value):
        raise FunctionError("bad_response", 502,
                            f"guest returned invalid value for header {name.decode()!r}")
    return name.lower(), value


def old_decode_request(buf: bytes) -> abi.GuestRequest:
    if buf[:4] != abi.MAGIC:
        raise ProtocolError(f"request does not start with {abi.MAGIC!r}: got {bytes(buf[:4])!r}")
    try:
        fields, pos = _old_walk(buf, 4, "ssspps")
        for _ in range(2):  # params, then principal: absent from an older PoP's request
            if pos < len(buf):
                section, pos = _old_walk(buf, pos, "p")
                fields += section
            else:
                fields.append([])
        if pos > len(buf):
            raise struct.error("short")
    except struct.error:
        abi._explain_request(buf)
        raise ProtocolError("malformed request") from None
    return abi.GuestRequest._make(fields)


def _old_walk(buf: bytes, pos: int, layout: str) -> tuple[list, int]:
    out: list = []
    for kind in layout:
        (n,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if kind == "s":
            out.append(buf[pos:pos + n])
            pos += n
            continue
        pairs = []
        for _ in range(n):
            (k,) = struct.unpack_from("<I", buf, pos)
            pos += 4
            name = buf[pos:pos + k]
            (v,) = struct.unpack_from("<I", buf, pos + k)
            pos += k + 4
            pairs.append((name, buf[pos:pos + v]))
            pos += v
        out.append(pairs)
    return out, pos


def outcome(f: Callable[..., object], *args: object) -> object:
    """What `f(*args)` returns, or the type and message of what it raises."""
    try:
        return f(*args)
    except Exception as e:  # compared, not swallowed
        return type(e), str(e)


# the bytes a header check turns on, with any byte now and then
EDGE_BYTES = st.sampled_from(b"\r\n\x00 \t:\x7f\x80\xff\"(),/;<=>?@[\\]{}aZ9-_~")
HEADER_PART = st.lists(EDGE_BYTES | st.integers(0, 255), max_size=10).map(bytes)


def test_check_header_answers_as_the_regular_expressions_did_for_every_byte() -> None:
    for byte in range(256):
        one = bytes([byte])
        for name, value in [(one, b"v"), (b"x" + one, b"v"), (one + b"x", b"v"), (one * 3, b""),
                            (b"x", one), (b"x", b"a" + one), (b"x", one + b"a"), (b"x", one * 3)]:
            assert outcome(abi.check_header, name, value) == outcome(old_check_header, name,
                                                                     value), (name, value)


@given(TOKEN | HEADER_PART, HEADER_PART)
def test_check_header_answers_as_the_regular_expressions_did(name: bytes, value: bytes) -> None:
    assert outcome(abi.check_header, name, value) == outcome(old_check_header, name, value)


def test_check_header_edge_cases() -> None:
    for name in [b"", b":", b" ", b"\t", b"a b", b"a:", b"\x7f", b"\x80", b"a\n", b"a\r\n"]:
        with pytest.raises(FunctionError, match="invalid header name"):
            abi.check_header(name, b"v")
    # every control character but HTAB (RFC 9110 5.5): \x01, ESC and DEL reached clients
    for value in [b"\r", b"\n", b"\0", b"a\r\nb: c", b"\0a", b"a\x01b", b"\x1b[31m", b"a\x7fb",
                  b"\x0b", b"\x1f"]:
        with pytest.raises(FunctionError, match="invalid value"):
            abi.check_header(b"x", value)
    assert abi.check_header(b"X-A", b"\t \x80\xff:~") == (b"x-a", b"\t \x80\xff:~")


@settings(max_examples=300)
@given(REQUESTS, st.data())
def test_decode_request_answers_as_the_layout_walk_did(r: abi.GuestRequest,
                                                       data: st.DataObject) -> None:
    """On valid encodings, their cuts, overwritten bytes and bytes appended: the
    same request or the same error."""
    buf = encode(r)
    bufs = [buf, buf + data.draw(st.binary(max_size=9))]
    bufs += [buf[:cut] for cut in range(max(0, len(buf) - 16), len(buf))]  # the last field
    bufs.append(buf[:data.draw(st.integers(0, len(buf)))])
    at = data.draw(st.integers(4, len(buf)))
    bufs.append(buf[:at] + data.draw(st.binary(min_size=1, max_size=8)) + buf[at + 8:])
    bufs.append(abi.MAGIC + data.draw(st.binary(max_size=40)))
    for b in bufs:
        assert outcome(abi.decode_request, b) == outcome(old_decode_request, b)
