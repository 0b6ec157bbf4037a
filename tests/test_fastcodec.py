"""The C codec (`edgefn_core.fastcodec`, codec.c) against the Python one it stands in
for: the same result or the same error (type and message) on any input, valid,
cut, corrupted or of the wrong type; frames cut the same in any chunking; loaded in
an isolated subinterpreter only when told the main interpreter's library; and the
Python codec when it is off or cannot be built."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgefn_core import abi, fastcodec, frames
from edgefn_core.errors import ProtocolError
from edgefn_core.frames import Framing, body, kind_and_payload
from runtime.executors.python import interp
from tests.test_frames import PIECES, chunked, outcomes

ROOT = Path(__file__).resolve().parent.parent
C, PY = abi.NATIVE, abi.PYTHON
ADDRESS = re.compile(" at 0x[0-9a-f]+")
pytestmark = pytest.mark.skipif(C is None, reason="the C codec did not build here")
# Every property here runs without hypothesis's per-example deadline: each example
# runs both codecs on a dozen buffers, on a machine other work keeps loaded.


def outcome(f: Callable[..., object], *args: object) -> object:
    """What `f(*args)` returns, or the type, message and status of what it raises."""
    try:
        return f(*args)
    except Exception as e:  # compared, not swallowed (a memoryview's repr: its address)
        return type(e), ADDRESS.sub("", str(e)), getattr(e, "status", None)


class Declined(Exception):
    """What `STRICT` raises where the C hands a call to its Python twin."""


def decline(*args: object, **kwargs: object) -> object:
    raise Declined


# A second instance of the extension whose twins only say the C declined: what the C
# answers by itself (through `C`, a decline is the Python answer, equal by construction).
STRICT = None if C is None else fastcodec.import_extension(
    fastcodec.NAME, Path(str(fastcodec.loaded_path())))
if STRICT is not None:
    STRICT.bind(decline, decline, decline, decline, abi.GuestRequest)
DECLINED = (Declined, "", None)


def same(name: str, *args: object, takes: bool = True) -> object:
    """Asserts the C and Python `name` answer `args` alike; returns the answer. The C
    answers by itself exactly what Python accepts (`takes`: `args` are of the types the
    C takes); it declines, for Python to raise, every input Python refuses."""
    want = outcome(getattr(PY, name), *args)
    assert outcome(getattr(C, name), *args) == want, args
    own = outcome(getattr(STRICT, name), *args)
    refused = isinstance(want, tuple) and isinstance(want[0], type) \
        and issubclass(want[0], Exception)
    if own == DECLINED:
        assert refused or not takes, ("the C declined what Python accepts", args)
    else:
        assert own == want and not refused, args
    return want


# every byte value, and the ones the ABI turns on more often than chance would
BYTE = st.integers(0, 255) | st.sampled_from(b"\r\n\x00 \t:\x7f\x80\xffAZaz09-~")
PART = st.lists(BYTE, max_size=12).map(bytes)
PAIRS = st.lists(st.tuples(PART, PART), max_size=6)
BLOB = PAIRS.map(abi.encode_pairs) | st.binary(max_size=24)  # a section, or any bytes
# an argument that is not what the C takes: the Python twin answers (or raises) for it
ODD = st.sampled_from([bytearray(b"ab"), memoryview(b"cd"), "text", None, 7, [b"x"], ()])


def lengths(buf: bytes) -> list[int]:
    """Offsets of every u32 in `buf` (a length or a count may be at any of them)."""
    return list(range(0, max(0, len(buf) - 3)))


def mutations(buf: bytes, data: st.DataObject) -> list[bytes]:
    """`buf`, cut anywhere, with bytes appended, overwritten, and a u32 somewhere set
    to a huge, a bad or an off-by-one length."""
    out = [buf, buf + data.draw(st.binary(min_size=1, max_size=9)), b""]
    out += [buf[:cut] for cut in range(max(0, len(buf) - 12), len(buf))]
    out.append(buf[:data.draw(st.integers(0, len(buf)))])
    at = data.draw(st.integers(0, len(buf)))
    out.append(buf[:at] + data.draw(st.binary(min_size=1, max_size=8)) + buf[at + 8:])
    if len(buf) >= 4:
        at = data.draw(st.sampled_from(lengths(buf)))
        (was,) = struct.unpack_from("<I", buf, at)
        for n in (0xFFFFFFFF, 0x7FFFFFFF, 1 << 20, min(was + 1, 0xFFFFFFFF), max(0, was - 1), len(buf)):
            out.append(buf[:at] + struct.pack("<I", n) + buf[at + 4:])
    return out


def test_the_abi_answers_with_the_c_functions_and_keeps_the_python_ones() -> None:
    assert C is not None
    assert (abi.encode_request, abi.decode_request, abi.encode_response,
            abi.decode_response) == tuple(C)
    assert all(type(f).__name__ == "builtin_function_or_method" for f in C)
    assert all(f.__module__ == "edgefn_core.abi" for f in PY)


# -- requests ----------------------------------------------------------------------------------
REQUESTS = st.builds(abi.GuestRequest, PART, PART, PART, PAIRS, PAIRS, st.binary(max_size=64),
                     PAIRS, PAIRS)


@settings(max_examples=300, deadline=None)
@given(PART, PART, PART, PAIRS, BLOB, st.binary(max_size=64), BLOB, BLOB, st.integers(6, 8))
def test_encode_request_writes_what_python_writes(method: bytes, path: bytes, query: bytes,
                                                  headers: list[tuple[bytes, bytes]],
                                                  env: bytes, body_: bytes, params: bytes,
                                                  principal: bytes, nargs: int) -> None:
    args = (method, path, query, headers, env, body_, params, principal)[:nargs]
    assert isinstance(same("encode_request", *args), bytes)


@settings(deadline=None)
@given(st.data(), st.integers(0, 7), ODD)
def test_encode_request_with_an_argument_it_does_not_take_answers_as_python(
        data: st.DataObject, which: int, odd: object) -> None:
    args: list[object] = [b"GET", b"/", b"", [(b"a", b"b")], abi.NO_PAIRS, b"", b"", b""]
    args[which] = odd
    same("encode_request", *args, takes=False)
    headers = data.draw(st.sampled_from([((b"a", b"b"),), [[b"a", b"b"]], [(b"a",)],
                                         [(b"a", b"b", b"c")], [(b"a", "b")], [("a", b"b")],
                                         [(bytearray(b"a"), b"b")]]))
    same("encode_request", b"GET", b"/", b"", headers, abi.NO_PAIRS, b"", takes=False)
    same("encode_request", b"GET", b"/", b"", [], abi.NO_PAIRS, takes=False)  # too few
    assert C.encode_request(b"GET", b"/", b"", [], b"\0\0\0\0", b"", principal_blob=b"x") \
        == PY.encode_request(b"GET", b"/", b"", [], b"\0\0\0\0", b"", principal_blob=b"x")


@settings(max_examples=300, deadline=None)
@given(REQUESTS, st.data())
def test_decode_request_answers_as_python(r: abi.GuestRequest, data: st.DataObject) -> None:
    buf = PY.encode_request(r.method, r.path, r.query, r.headers, abi.encode_pairs(r.env),
                            r.body, abi.encode_pairs(r.params),
                            abi.encode_pairs(r.principal) if r.principal else b"")
    for b in [*mutations(buf, data), abi.MAGIC + data.draw(st.binary(max_size=40))]:
        got = same("decode_request", b)
        if isinstance(got, abi.GuestRequest):
            assert type(got) is abi.GuestRequest and all(
                type(f) is (bytes if i in (0, 1, 2, 5) else list) for i, f in enumerate(got))
    same("decode_request", bytearray(buf), takes=False)
    same("decode_request", memoryview(buf), takes=False)


def test_decode_request_with_huge_counts_and_empty_fields() -> None:
    empty = PY.encode_request(b"", b"", b"", [(b"", b"")], b"\0\0\0\0", b"", b"\0\0\0\0",
                              abi.encode_pairs([(b"", b"")]))
    assert same("decode_request", empty) == abi.GuestRequest(b"", b"", b"", [(b"", b"")], [],
                                                             b"", [], [(b"", b"")])
    huge = struct.pack("<I", 0xFFFFFFFF)
    for buf in [abi.MAGIC + b"\0" * 12 + huge, abi.MAGIC + huge, abi.MAGIC, b"EFQ", b"EFQ2",
                empty[:-4] + huge, empty + huge]:
        assert isinstance(same("decode_request", buf), tuple)
    with pytest.raises(ProtocolError, match="ends at byte 20: expected a u32 header 0 name"):
        C.decode_request(abi.MAGIC + b"\0" * 12 + huge)


# -- responses ---------------------------------------------------------------------------------
STATUS = st.integers(195, 605) | st.sampled_from([0, 99, 100, 199, 600, 0xFFFFFFFF])


@settings(max_examples=300, deadline=None)
@given(STATUS, PAIRS, st.binary(max_size=64), st.data())
def test_decode_response_answers_as_python(status: int, headers: list[tuple[bytes, bytes]],
                                           body_: bytes, data: st.DataObject) -> None:
    buf = PY.encode_response(status, headers, body_)
    for b in mutations(buf, data):
        same("decode_response", b)
    same("decode_response", bytearray(buf), takes=False)
    same("decode_response", memoryview(buf), takes=False)


def test_decode_response_checks_every_byte_of_names_and_values() -> None:
    for byte in range(256):
        one = bytes([byte])
        for name, value in [(one, b"v"), (b"X" + one, b"v"), (one * 3, b""), (b"x", one),
                            (b"x", b"a" + one), (b"x", one * 3)]:
            same("decode_response", PY.encode_response(200, [(b"A", b"1"), (name, value)], b"b"))


def test_decode_response_bounds_the_head_as_python() -> None:
    for extra in (-1, 0, 1):
        value = b"v" * (abi.MAX_HEAD_BYTES - 1 + extra)
        same("decode_response", PY.encode_response(200, [(b"x", value)], b""))
    many = [(b"x", b"y")] * (abi.MAX_HEAD_BYTES // 2 + 1)
    same("decode_response", PY.encode_response(200, many, b""))
    for n in (abi.MAX_HEAD_FIELDS, abi.MAX_HEAD_FIELDS + 1):  # few bytes, many fields
        same("decode_response", PY.encode_response(200, [(b"a", b"")] * n, b""))


@settings(deadline=None)
@given(STATUS | st.integers(-5, 5) | st.sampled_from([1 << 32, -1 << 40, True]), PAIRS,
       st.binary(max_size=64))
def test_encode_response_writes_what_python_writes(status: int,
                                                   headers: list[tuple[bytes, bytes]],
                                                   body_: bytes) -> None:
    same("encode_response", status, headers, body_, takes=type(status) is int)


@settings(deadline=None)
@given(st.integers(0, 2), ODD)
def test_encode_response_with_an_argument_it_does_not_take_answers_as_python(which: int,
                                                                           odd: object) -> None:
    args: list[object] = [200, [(b"a", b"b")], b"body"]
    args[which] = odd
    same("encode_response", *args, takes=False)
    same("encode_response", 200.0, [], b"", takes=False)


# -- frames ------------------------------------------------------------------------------------
def readers(framing: Framing, cut: Callable[..., object]) -> tuple[frames.FrameReader,
                                                                  frames.FrameReader]:
    native, python = frames.FrameReader(framing, cut), frames.FrameReader(framing, cut)
    python.native = False
    assert native.native
    return native, python


@settings(deadline=None)
@given(PIECES, st.lists(st.integers(0, 2000), max_size=16), st.booleans(),
       st.sampled_from(["<", ">"]), st.booleans())
def test_frames_are_cut_in_c_as_in_python(pieces: list[tuple[str, object]], cuts: list[int],
                                          reuse: bool, order: str, kinds: bool) -> None:
    """The same frames from each feed, the same error at the same feed, in any
    chunking, from bytes or a reused buffer; bodies, or kind and payload."""
    framing = Framing(order, max_size=40, min_size=1)  # type: ignore[arg-type]
    data = b"".join(framing.length.pack(p) if kind == "length" else  # type: ignore[arg-type]
                    framing.length.pack(len(p)) + p for kind, p in pieces)  # type: ignore[arg-type]
    chunks = chunked(data, cuts)
    native, python = readers(framing, kind_and_payload if kinds else body)
    assert outcomes(native, chunks, reuse) == outcomes(python, chunks, reuse)
    assert native.buf == python.buf


@settings(deadline=None)
@given(st.lists(st.integers(0, 0xFFFFFFFF) | st.sampled_from([0, 1, 63, 64, 65, 0xFFFFFFFF]),
                min_size=1, max_size=4), st.integers(0, 64), st.integers(0, 70))
def test_any_length_is_judged_as_python_judges_it(ns: list[int], lo: int, hi: int) -> None:
    framing = Framing("<", max_size=hi, min_size=lo)
    data = b"".join(struct.pack("<I", n) + b"k" * min(n, 80) for n in ns)
    assert outcomes(readers(framing, body)[0], [data], False) == outcomes(
        readers(framing, body)[1], [data], False)


def test_the_wire_reader_cuts_in_c_and_other_cuts_in_python() -> None:
    from runtime.executors.python import wire

    assert wire.Reader().native and Framing().reader().native
    assert not frames.FrameReader(Framing(min_size=0), kind_and_payload).native
    assert not frames.FrameReader(Framing(), lambda b, s, e: bytes(b[s:e])).native


# -- where it loads ----------------------------------------------------------------------------
def test_a_subinterpreter_loads_it_only_when_told_the_main_interpreter_s_library() -> None:
    path = fastcodec.loaded_path()
    assert path is not None
    for given_path, native in ((path, True), (None, False)):
        i = interp.create()
        try:
            code = (f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                    f"from edgefn_core import fastcodec\nfastcodec.use({given_path!r})\n"
                    "from edgefn_core import abi, frames\n"
                    f"assert (abi.NATIVE is not None) is {native}, abi.NATIVE\n"
                    f"assert (frames._native is not None) is {native}\n"
                    "buf = abi.encode_request(b'GET', b'/', b'', [(b'h', b'v')], b'\\0' * 4, b'')\n"
                    "assert abi.decode_request(buf).headers == [(b'h', b'v')]\n"
                    "assert abi.decode_response(abi.encode_response(200, [], b'ok'))[2] == b'ok'\n"
                    "assert 'msgspec' not in sys.modules\n")
            assert interp.run_error(i, code) is None
        finally:
            interp.destroy(i)


def run_python(env: dict[str, str]) -> str:
    """What a fresh interpreter with `env` says about its codec (and logs, stderr)."""
    code = ("import logging; logging.basicConfig(format='%(message)s')\n"
            "from edgefn_core import abi, frames, fastcodec\n"
            "print(abi.NATIVE is not None, frames._native is not None)\n"
            "print(abi.decode_response(abi.encode_response(201, [], b'x')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                      **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


def test_off_switch_and_no_compiler_leave_the_python_codec(tmp_path: Path) -> None:
    assert run_python({"EDGEFN_NATIVE_CODEC": "0"}).startswith("False False\n(201, [], b'x')")
    assert run_python({"EDGEFN_NATIVE": "0"}).startswith("False False\n")
    out = run_python({"CC": str(tmp_path / "no-cc"), "EDGEFN_NATIVE_CACHE": str(tmp_path)})
    assert out.startswith("False False\n(201, [], b'x')")
    assert out.count("the C codec is unavailable") == 1, out  # logged once


def test_a_file_a_source_includes_is_part_of_the_build_key(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`build(source, stem, parts)` keys the cached library by the parts too (the lane's
    lane.c includes lane_drain.c.h): a changed part builds anew, never the stale one."""
    if fastcodec.python_headers() is None:
        pytest.skip("no Python.h")
    monkeypatch.setenv("EDGEFN_NATIVE_CACHE", str(tmp_path / "cache"))
    source, part = tmp_path / "m.c", tmp_path / "m_part.c.h"
    source.write_text('#include "m_part.c.h"\nint answer(void) { return ANSWER; }\n')
    part.write_text("#define ANSWER 1\n")
    first = fastcodec.build(source, "m", (part,))
    assert fastcodec.build(source, "m", (part,)) == first  # cached
    part.write_text("#define ANSWER 2\n")
    second = fastcodec.build(source, "m", (part,))
    assert second != first and first.exists() and second.exists()
