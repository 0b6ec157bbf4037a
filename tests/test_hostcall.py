"""Host calls too big to parse without stalling the PoP (`edgefn_core.hostcall`):
a WASM guest's `call` and a Python isolate's CALL frame are refused before they
are parsed (one 60 MiB call of ``[1,1,...]`` froze every tenant's requests for 2 s),
with a message the function can read; a forged frame ends its own host."""

from __future__ import annotations

import base64
import random
import re
import time
from pathlib import Path

import pytest

from edgefn_core import hostcall
from edgefn_core.errors import FunctionError
from tests.support import Running, function_dir, host_pids, python_function, reactor


def test_refused_says_which_bound_a_call_passes() -> None:
    assert hostcall.refused(b'{"ns": "a", "key": "k"}') is None
    assert hostcall.refused(b"[" + b"1" * hostcall.MAX_DIGITS + b"]") is None
    assert hostcall.refused(b"[" + b"1" * (hostcall.MAX_DIGITS + 1) + b"]") == (
        f"its arguments hold a run of more than {hostcall.MAX_DIGITS} digits")
    keys = b"{" + b",".join(b'"k%d": 1' % i for i in range(hostcall.MAX_KEYS)) + b"}"
    assert hostcall.refused(keys) is None
    assert hostcall.refused(keys[:-1] + b', "last": 1}') == (
        f"its arguments hold {hostcall.MAX_KEYS + 1} keys (at most {hostcall.MAX_KEYS}); "
        "send fewer at a time")
    # small calls are scanned too: 60 numbers of 4,299 digits parse in ~10 ms
    assert hostcall.refused(b"[" + b",".join([b"1" * 4299] * 60) + b"]") is not None
    big = b'{"value": "' + b"A" * (hostcall.MAX_BYTES - 13) + b'"}'
    assert len(big) == hostcall.MAX_BYTES and hostcall.refused(big) is None  # one string
    assert hostcall.refused(big + b" ") == (
        f"its arguments are {hostcall.MAX_BYTES + 1} bytes of JSON (at most "
        f"{hostcall.MAX_BYTES})")
    nested = b"[" + b"{}," * hostcall.MAX_CONTAINERS + b"{}]"
    assert hostcall.refused(nested) == (
        f"its arguments hold {hostcall.MAX_CONTAINERS + 2} JSON objects and arrays (at most "
        f"{hostcall.MAX_CONTAINERS}); send fewer at a time")
    assert hostcall.refused(nested[:-6] + b"]") is None  # at the bound
    flat = b"[" + b"1," * hostcall.MAX_VALUES + b"1]"
    assert hostcall.refused(flat) == (f"its arguments hold {hostcall.MAX_VALUES + 1} values "
                                      f"(at most {hostcall.MAX_VALUES}); send fewer at a time")
    assert hostcall.refused(memoryview(flat[:-4] + b"]")) is None


def test_numbers_near_1e308_are_counted_before_a_parse_that_they_would_hold() -> None:
    """msgspec parses a number of 1e288..1e308 in ~10 us (1.5: 0.05 us): a call of
    900,000 of them held the GIL 8 s, in any of its forms; other numbers pass, and so
    does the largest value in base64 (3-digit exponents appear in it by chance)."""
    for number in (b"1e300", b"1E+0300", b"-2.5e299", b"1.7976931348623157e308"):
        at_bound = b"[" + b",".join([number] * hostcall.MAX_HUGE_NUMBERS) + b"]"
        assert hostcall.refused(at_bound) is None and hostcall.huge_numbers(at_bound) is None
        past = at_bound[:-1] + b"," + number + b"]"
        assert hostcall.refused(past) == (
            f"its arguments hold {hostcall.MAX_HUGE_NUMBERS + 1} numbers with exponents of 100"
            f" or more (at most {hostcall.MAX_HUGE_NUMBERS}: each takes the JSON parser ~200 "
            "times as long)"), number
        assert hostcall.huge_numbers(memoryview(past)) == (
            f"it holds {hostcall.MAX_HUGE_NUMBERS + 1} numbers with exponents of 100 or more "
            f"(at most {hostcall.MAX_HUGE_NUMBERS}: each takes the JSON parser ~200 times as "
            "long)")
    for number in (b"1.5", b"1.234e-05", b"1e99", b"1e-300", b"5e-324"):
        many = b"[" + b",".join([number] * 100_000) + b"]"
        assert hostcall.refused(many) is None and hostcall.huge_numbers(many) is None, number
    value = base64.b64encode(random.Random(7).randbytes(16 << 20))
    assert hostcall.refused(b'{"value": "' + value + b'"}') is None
    # a small frame (READY, ERROR, ...: up to 256 KiB, parsed with no other check)
    from runtime.executors.python.isolate import read_json
    frame = b'{"kind": "exception", "pad": [' + b",".join(
        [b"1e300"] * (hostcall.MAX_HUGE_NUMBERS + 1)) + b"]}"
    assert read_json(frame) == {}
    assert read_json(frame.replace(b"1e300,", b"", 1))["kind"] == "exception"


def caller(length: int, fill: bool) -> str:
    """A reactor that calls ``kv.get`` with `length` bytes of arguments at 65536:
    `fill` writes them as ``[[[...`` first."""
    fill_code = (f"(memory.fill (i32.const 65536) (i32.const 91) (i32.const {length}))"
                 if fill else "")
    return reactor(f"""
      {fill_code}
      (drop (call $call (i32.const 300) (i32.const 6) (i32.const 65536) (i32.const {length})
                        (i32.const 0) (i32.const 0)))""",
                   imports='(import "edgefn" "call" (func $call (param i32 i32 i32 i32 i32 i32) '
                           '(result i64)))',
                   prelude='(data (i32.const 300) "kv.get")', memory=2 + length // 65536)


@pytest.mark.parametrize(("length", "fill", "why"), [
    (hostcall.MAX_BYTES + 1, False, f"its arguments are {hostcall.MAX_BYTES + 1} bytes of JSON"),
    (300_000, True, "its arguments hold 300000 JSON objects and arrays"),
])
def test_a_wasm_call_too_big_to_parse_traps_saying_why(pop: Running, tmp_path: Path,
                                                        length: int, fill: bool,
                                                        why: str) -> None:
    pop.deploy(function_dir(tmp_path, "big-call", caller(length, fill),
                            extra='[bindings]\nkv = ["big"]',
                            limits="memory_mb = 64\ncpu_ms = 1000"))
    status, _, body = pop.get("/big-call")
    assert status == 500 and f"call 'kv.get': {why}".encode() in body, body


SENDER = """
import gc, sys
from edgefn import BindingError, Response

def handle(request, env):
    n = int(request.query["n"])
    if request.query.get("forge"):  # past the SDK: a frame straight onto its socket
        wire = sys.modules["runtime.executors.python.wire"]
        session = next(o for o in gc.get_objects() if type(o).__name__ == "Session")
        if request.query["forge"] == "value":  # its head's length past the frame's end
            session._send(wire.frame(wire.CALL_VALUE, n.to_bytes(4, "little") + b'{"id": 1'))
        elif request.query["forge"] == "kind":  # a kind no guest sends, n of them
            session._send(wire.frame(b"?") * n)
        else:
            session._send(wire.frame(wire.CALL, b'{"id": 1, "name": "kv.get", "args": ['
                                     + b"{}," * n + b'{}], "wait": true}'))
        return Response("sent")
    try:
        env.kv("big").put("k", b"x" * n)
    except BindingError as e:
        return Response(str(e), status=413)
    return Response("stored")
"""


def test_a_python_call_too_big_is_refused_by_the_sdk_and_a_forged_one_ends_its_host(
        pop: Running, tmp_path: Path) -> None:
    pop.deploy(python_function(tmp_path, "sender", SENDER, extra='[bindings]\nkv = ["big"]',
                               limits="memory_mb = 256\nwall_ms = 10000\ncpu_ms = 5000",
                               pool="min = 1\nmax = 1\nstandby = true"))
    status, _, body = pop.get(f"/sender?n={16 << 20}")  # the largest KV value fits
    assert (status, body) == (200, b"stored"), body
    status, _, body = pop.get(f"/sender?n={18 << 20}")  # base64: 24 MiB and more
    assert status == 413 and re.fullmatch(
        rb"kv\.put: its arguments are \d+ bytes of JSON \(at most 25165824\)", body), body
    for forged in (f"n={hostcall.MAX_CONTAINERS}&forge=call", f"n={1 << 20}&forge=value",
                   "n=100000&forge=kind"):
        before = host_pids("sender")
        status, headers, body = pop.get(f"/sender?{forged}")
        assert (status, headers.get("x-edgefn-error")) == (502, "crash"), body
        assert host_pids("sender") != before  # killed, and replaced
        assert pop.get(f"/sender?n={1 << 10}")[::2] == (200, b"stored")


HUGE = """
import gc, sys
from edgefn import BindingError, Response

def handle(request, env):
    if request.query.get("forge"):  # past the SDK: a frame straight onto its socket
        wire = sys.modules["runtime.executors.python.wire"]
        session = next(o for o in gc.get_objects() if type(o).__name__ == "Session")
        session._send(wire.frame(wire.CALL, b'{"id": 1, "name": "vectors.query", "args": '
                                 b'{"index": "v", "k": 1, "vector": ['
                                 + b",".join([b"1e300"] * 900_000) + b']}, "wait": true}'))
        return Response("sent")
    try:
        env.vectors("v").query([1e300] * 900_000, k=1)
    except BindingError as e:
        return Response(str(e), status=400)
    return Response("queried")
"""


def test_a_call_of_numbers_near_1e308_is_refused_before_the_pop_parses_it(
        pop: Running, tmp_path: Path) -> None:
    """900,000 x 1e300 in one vector query held the PoP's loop ~8 s (every tenant's
    requests waited), on every call: the SDK refuses it saying why, a forged frame
    ends its host, and a WASM guest's call traps saying why."""
    pop.deploy(python_function(tmp_path, "huge", HUGE, extra='[bindings]\nvectors = ["v"]',
                               limits="memory_mb = 512\nwall_ms = 10000\ncpu_ms = 5000",
                               pool="min = 1\nmax = 1\nstandby = true"))
    status, _, body = pop.get("/huge")
    assert (status, body) == (400, (
        f"vectors.query: its arguments hold 900000 numbers with exponents of 100 or more (at "
        f"most {hostcall.MAX_HUGE_NUMBERS}: each takes the JSON parser ~200 times as long)"
    ).encode())
    before = host_pids("huge")
    sent = time.monotonic()
    status, headers, body = pop.get("/huge?forge=1")
    assert (status, headers.get("x-edgefn-error")) == (502, "crash"), body
    assert time.monotonic() - sent < 5
    assert host_pids("huge") != before  # killed, and replaced
    args = b'{"index": "w", "k": 1, "vector": [' + b",".join(
        [b"1e300"] * (hostcall.MAX_HUGE_NUMBERS + 1)) + b"]}"
    wat = reactor(f"""
      (drop (call $call (i32.const 300) (i32.const 13) (i32.const 65536) (i32.const {len(args)})
                        (i32.const 0) (i32.const 0)))""",
                  imports='(import "edgefn" "call" (func $call (param i32 i32 i32 i32 i32 i32) '
                          '(result i64)))',
                  prelude='(data (i32.const 300) "vectors.query") (data (i32.const 65536) "'
                          + args.decode().replace('"', '\\"') + '")', memory=2)
    pop.deploy(function_dir(tmp_path, "huge-wasm", wat, extra='[bindings]\nvectors = ["w"]'))
    status, _, body = pop.get("/huge-wasm")
    assert status == 500 and (
        f"call 'vectors.query': its arguments hold {hostcall.MAX_HUGE_NUMBERS + 1} numbers "
        "with exponents of 100 or more").encode() in body, body


RAISER = """
import gc, sys, time
from edgefn import BindingError, Response

def handle(request, env):
    kind = request.query["kind"]
    if kind == "lines":  # an ordinary exception with a huge message
        raise ValueError("\\nx" * 2_000_000)
    if kind == "surrogate":  # a lone surrogate in a large call: json writes what
        try:  # msgspec refuses, too big to read twice: answered, not dropped (a value
            # goes raw, outside the JSON: metadata makes it large)
            env.kv("big").put("k\\ud800", b"x", metadata={"m": "x" * 100_000})
        except BindingError as e:
            return Response(str(e), status=400)
        return Response("stored")
    if kind == "nan":
        try:
            env.vectors("v").upsert([{"id": "a", "vector": [float("nan")] * 3}])
        except BindingError as e:
            return Response(str(e), status=400)
        return Response("stored")
    # past the SDK: an ERROR frame too big for any the guest sends
    wire = sys.modules["runtime.executors.python.wire"]
    session = next(o for o in gc.get_objects() if type(o).__name__ == "Session")
    session._send(wire.frame(wire.ERROR, b'{"kind": "exception", "message": "x", "pad": "'
                             + b"x" * (300 << 10) + b'"}'))
    time.sleep(5)
    return Response("not reached")
"""


def test_guest_errors_are_bounded_before_they_are_parsed_or_logged(
        pop: Running, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A 50 MB ERROR frame was parsed on the loop (6 s for every tenant); an exception
    of "\\nx" * 10M wrote 10M log lines (290 MB) and a 30 MB body; a large call
    msgspec refused was parsed again by json, or dropped (a wait to the wall limit)."""
    pop.deploy(python_function(tmp_path, "raiser", RAISER,
                               extra='[bindings]\nkv = ["big"]\nvectors = ["v"]',
                               limits="wall_ms = 20000\ncpu_ms = 5000",
                               pool="min = 1\nmax = 1\nstandby = true"))
    status, _, body = pop.get("/raiser?kind=lines")
    assert status == 500 and len(body) < 10_000, len(body)  # 4 KiB of message, escaped
    traces = [r.getMessage() for r in caplog.records if "raiser" in r.getMessage()
              and r.levelname == "ERROR"]
    assert traces and all(t.count("\n") <= 200 for t in traces), [len(t) for t in traces]
    sent = time.monotonic()
    status, _, body = pop.get("/raiser?kind=surrogate")
    assert (status, body) == (400, b"the call's arguments are JSON the PoP does not read "
                                    b"(a lone surrogate in a string?)")
    assert time.monotonic() - sent < 5
    status, _, body = pop.get("/raiser?kind=nan")
    assert (status, body) == (400, b"vectors.upsert: its arguments hold NaN or Infinity, "
                                    b"which JSON cannot carry")
    before = host_pids("raiser")
    status, headers, _ = pop.get("/raiser?kind=forged")
    assert (status, headers.get("x-edgefn-error")) == (502, "crash")
    assert host_pids("raiser") != before


def test_a_wasm_call_name_is_bounded(pop: Running, tmp_path: Path) -> None:
    src = reactor("""
      (drop (call $call (i32.const 0) (i32.const 30000) (i32.const 0) (i32.const 2)
                        (i32.const 0) (i32.const 0)))""",
                  imports='(import "edgefn" "call" (func $call (param i32 i32 i32 i32 i32 i32) '
                          '(result i64)))')
    pop.deploy(function_dir(tmp_path, "long-name", src, extra='[bindings]\nkv = ["big"]'))
    status, _, body = pop.get("/long-name")
    assert status == 500 and b"call name of 30000 bytes (at most 256)" in body, body
    assert len(body) < 2000


def test_a_function_error_keeps_at_most_4_kib_of_its_message() -> None:
    """It goes into the response and the PoP's log: a trap's or a binding's text
    carries what the function sent (a URL, a call's name) whole."""
    e = FunctionError("binding", 500, "x" * 10_000)
    assert str(e) == "x" * FunctionError.MAX_MESSAGE + " [cut: 10000 characters]"
    assert str(FunctionError("trap", 500, "short")) == "short"


NEIGHBOURS = """
import gc, os, stat, sys
from edgefn import Response

def handle(request, env):
    wire = sys.modules["runtime.executors.python.wire"]
    session = next(o for o in gc.get_objects() if type(o).__name__ == "Session")
    own = os.fstat(session.sock.fileno()).st_ino
    call = wire.frame(wire.CALL, b'{"id": 900001, "name": "kv.get", "args": '
                      b'{"namespace": "hog", "key": "big"}, "wait": true}')
    written = 0
    for fd in range(3, 256):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if stat.S_ISSOCK(st.st_mode) and st.st_ino != own:
            try:
                os.write(fd, call)
                written += 1
            except OSError:
                pass
    return Response(f"wrote {written}")
"""


def test_a_call_written_on_an_isolate_not_started_ends_its_host(
        pop: Running, tmp_path: Path) -> None:
    """The isolates of a host share its file descriptors: one wrote CALL frames on the
    sockets of isolates whose interpreter had not started, and the answers (a 16 MiB
    KV value each) waited there for a reader that never came, up to 128 MiB an
    isolate, for as long as the host lived. A frame from an isolate not started is
    forged: its host is killed (502 `crash`) and replaced."""
    pop.deploy(python_function(tmp_path, "neighbours", NEIGHBOURS,
                               extra='[bindings]\nkv = ["hog"]',
                               pool="min = 1\nmax = 4\nstandby = false"))
    before = host_pids("neighbours")
    status, headers, body = pop.get("/neighbours")
    assert body == b"wrote 3" or (status, headers.get("x-edgefn-error")) == (502, "crash"), \
        body  # (answered before or after the PoP read the frames: either may come first)
    deadline = time.monotonic() + 10
    while host_pids("neighbours") & before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not host_pids("neighbours") & before  # killed (and replaced)
