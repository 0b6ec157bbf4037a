"""The WASM executor with real wasmtime: ABI round trips and hostile guests."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgefn_core import abi
from edgefn_core.errors import DeployError, FunctionError
from runtime.executors.wasm import native as wasm_native
from runtime.executors.wasm.engine import WasmEngine
from runtime.executors.wasm.function import WasmFunction
from runtime.functions import manifest
from runtime.net.message import Request, Response
from tests.support import EXAMPLES, function_dir, reactor


@pytest.fixture(scope="module", params=["native", "ctypes"])
def engine(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[WasmEngine]:
    """Both reactor call paths: the C fast path and the pure-ctypes fallback."""
    if request.param == "native" and wasm_native.load() is None:
        pytest.skip("no C compiler: the native fast path cannot be built here")
    e = WasmEngine(tmp_path_factory.mktemp("cache"), native=request.param == "native")
    yield e
    e.close()


def load(engine: WasmEngine, d: Path) -> WasmFunction:
    fn = WasmFunction(engine, manifest.load(d), d)
    fn.prewarm()
    return fn


def request(path: bytes = b"/", body: bytes = b"", method: bytes = b"GET", query: bytes = b"",
            headers: list[tuple[bytes, bytes]] | None = None) -> Request:
    r = Request(method, path, query, headers or [], b"localhost", "1.1", True, "127.0.0.1:1")
    r.body = body
    return r


def call(fn: WasmFunction, req: Request | None = None) -> Response:
    """The response, awaited on a fresh loop when the function runs on a worker thread
    (a reactor whose budget is longer than the inline slice, after it overran it)."""
    result = fn.handle(req or request(), "/", {})
    if not isinstance(result, Response):
        result = asyncio.run(_wait(result))
    return result


async def _wait(pending: Response | Awaitable[Response]) -> Response:
    return pending if isinstance(pending, Response) else await pending


def failure(fn: WasmFunction, req: Request | None = None) -> FunctionError:
    with pytest.raises(FunctionError) as err:
        call(fn, req)
    return err.value


def test_hello_example(engine: WasmEngine) -> None:
    r = call(load(engine, EXAMPLES / "hello-wat"))
    assert (r.status, r.body) == (200, b"Hello from edgefn (WASM)!\n")
    assert r.headers == [(b"content-type", b"text/plain; charset=utf-8")]


# What httptools lets through in a request target: no controls, no spaces.
URL_BYTES = st.lists(st.integers(0x21, 0xFF).filter(lambda b: b != 0x7F), max_size=200).map(bytes)


@settings(max_examples=60, deadline=None)
@given(method=st.sampled_from([b"GET", b"POST", b"PUT", b"DELETE"]),
       path=URL_BYTES.map(lambda b: b"/echo/" + b), query=URL_BYTES,
       body=st.binary(max_size=5000))
def test_echo_round_trips_any_request_through_the_abi(engine: WasmEngine, method: bytes,
                                                      path: bytes, query: bytes, body: bytes) -> None:
    fn = _echo(engine)
    r = call(fn, request(path, body, method, query, [(b"x-a", b"1")]))
    headers = dict(r.headers)
    assert r.status == 200 and r.body == body
    assert (headers[b"x-echo-method"], headers[b"x-echo-path"]) == (method, path)
    assert headers[b"x-echo-query"] == query
    assert headers[b"x-echo-greeting"] == b"hi from the manifest"


_ECHO: dict[int, WasmFunction] = {}


def _echo(engine: WasmEngine) -> WasmFunction:
    return _ECHO.setdefault(id(engine), load(engine, EXAMPLES / "echo"))


def test_echo_handles_a_body_larger_than_initial_memory(engine: WasmEngine) -> None:
    body = bytes(range(256)) * 4096  # 1 MiB: the guest must grow memory
    assert call(_echo(engine), request(b"/echo", body, b"POST")).body == body


def test_a_request_that_cannot_fit_in_guest_memory_is_413(engine: WasmEngine,
                                                          tmp_path: Path) -> None:
    """edgefn_alloc traps when the request does not fit under limits.memory_mb: that
    was a 500 `trap` ("trapped in edgefn_alloc (unreachable)"), a bug of the
    function's for what the client sent."""
    import shutil

    d = tmp_path / "echo"
    shutil.copytree(EXAMPLES / "echo", d)
    (d / "edgefn.toml").write_text((d / "edgefn.toml").read_text().replace(
        "memory_mb = 64", "memory_mb = 2"))
    fn = load(engine, d)
    err = failure(fn, request(b"/echo", b"x" * (3 << 20), b"POST"))
    assert (err.code, err.status) == ("request_too_large", 413), err
    import re

    asked = re.search(r"a request of (\d+) bytes does not fit", str(err))
    assert asked and 3 << 20 < int(asked[1]) < (3 << 20) + 200  # the encoded request
    assert "limits.memory_mb = 2" in str(err)
    body = b"y" * (512 << 10)
    assert call(fn, request(b"/echo", body, b"POST")).body == body  # what fits still does


def test_no_state_leaks_between_requests(engine: WasmEngine, tmp_path: Path) -> None:
    counter = reactor("""
      (global.set $n (i32.add (global.get $n) (i32.const 1)))
      (i32.store8 (i32.const 28) (i32.add (i32.const 48) (global.get $n)))
      (i32.store8 (i32.const 100) (i32.add (i32.load8_u (i32.const 100)) (i32.const 1)))
      (i32.store8 (i32.const 29) (i32.add (i32.const 48) (i32.load8_u (i32.const 100))))""",
                      prelude="(global $n (mut i32) (i32.const 0))")
    fn = load(engine, function_dir(tmp_path, "counter", counter))
    bodies = {call(fn).body for _ in range(50)}
    assert bodies == {b"11"}  # a fresh global and a fresh memory every time


def test_infinite_loop_stops_at_the_cpu_limit(engine: WasmEngine, tmp_path: Path) -> None:
    fn = load(engine, function_dir(tmp_path, "spin", reactor("(loop $l (br $l))"),
                                   limits="cpu_ms = 30"))
    walls, cpus = [], []
    for _ in range(3):
        # Its CPU time is what the limit bounds (the first call spends the inline slice
        # too), and a busy machine lengthens the wall time of a run but not its CPU time.
        started, cpu_started = time.perf_counter(), time.process_time()
        err = failure(fn)
        cpus.append(time.process_time() - cpu_started)
        walls.append(time.perf_counter() - started)
        assert (err.code, err.status) == ("cpu_limit", 503)
        assert "CPU limit of 30 ms" in str(err)
    assert min(walls) > 0.025  # not stopped early
    assert min(cpus) < 0.030 * 3 + 0.01, cpus  # nor late: a deadline 4x late fails this


def test_wall_limit_when_it_is_the_tighter_one(engine: WasmEngine, tmp_path: Path) -> None:
    fn = load(engine, function_dir(tmp_path, "spin2", reactor("(loop $l (br $l))"),
                                   limits="cpu_ms = 1000\nwall_ms = 20"))
    err = failure(fn)
    assert (err.code, err.status) == ("wall_limit", 504)


def test_memory_bomb_stops_at_the_memory_limit(engine: WasmEngine, tmp_path: Path) -> None:
    bomb = reactor("""
      (loop $grow
        (br_if $grow (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))
      unreachable""")
    fn = load(engine, function_dir(tmp_path, "bomb", bomb, limits="memory_mb = 8"))
    err = failure(fn)
    assert (err.code, err.status) == ("memory_limit", 503)
    assert "of 8 MiB" in str(err)
    assert call(load(engine, EXAMPLES / "hello-wat")).status == 200


def test_module_needing_more_memory_than_its_limit_is_rejected_at_deploy(
        engine: WasmEngine, tmp_path: Path) -> None:
    d = function_dir(tmp_path, "big", reactor("", memory=512), limits="memory_mb = 16")
    with pytest.raises(DeployError, match=r"cannot instantiate within limits\.memory_mb = 16"):
        load(engine, d)


def test_deep_recursion_is_a_stack_overflow_trap(engine: WasmEngine, tmp_path: Path) -> None:
    rec = reactor("(call $down (i32.const 0))",
                  prelude="(func $down (param i32) (call $down (i32.add (local.get 0) (i32.const 1))))")
    err = failure(load(engine, function_dir(tmp_path, "rec", rec)))
    assert (err.code, err.status) == ("trap", 500)
    assert "stack overflow" in str(err)


@pytest.mark.parametrize(("body", "words"), [
    ("unreachable", "unreachable"),
    ("(drop (i32.div_u (i32.const 1) (i32.const 0)))", "integer division by zero"),
    ("(drop (i32.load (i32.const -1)))", "memory out of bounds"),
])
def test_traps_are_500_with_the_reason(engine: WasmEngine, tmp_path: Path, body: str,
                                       words: str) -> None:
    err = failure(load(engine, function_dir(tmp_path, "trap", reactor(body))))
    assert (err.code, err.status) == ("trap", 500)
    assert words in str(err)
    # the cause and where, not wasmtime's first line ("... at wasm backtrace:") alone
    assert "backtrace:" not in str(err) and "(at <unknown>!" in str(err), str(err)


@pytest.mark.parametrize(("result", "words"), [
    ("(i64.const 0x00000010ffffffff)", "exceeds the limit"),  # 4 GiB response
    ("(i64.const 0x0000fff000001000)", "outside guest memory"),
    ("(i64.const 0x0000001000000004)", "malformed response"),  # truncated
])
def test_bad_responses_are_502(engine: WasmEngine, tmp_path: Path, result: str, words: str) -> None:
    src = reactor(f"(return {result})")
    err = failure(load(engine, function_dir(tmp_path, "bad", src)))
    assert (err.code, err.status) == ("bad_response", 502)
    assert words in str(err)


@pytest.mark.parametrize("value", [b"1\r\nevil: 1", b"a\x01\x1bb", b"a\x7fb"])
def test_header_injection_from_guest_is_refused(engine: WasmEngine, tmp_path: Path,
                                                value: bytes) -> None:
    """CR and LF split a field; the other control characters (but HTAB) reached clients
    and proxies that refuse them (RFC 9110 5.5)."""
    resp = struct.pack("<II", 200, 1) + struct.pack("<I", 3) + b"x-a" + \
        struct.pack("<I", len(value)) + value + struct.pack("<I", 0)
    data = "".join(f"\\{b:02x}" for b in resp)
    src = f"""(module (memory (export "memory") 1) (data (i32.const 16) "{data}")
      (func (export "edgefn_alloc") (param i32) (result i32) (i32.const 1024))
      (func (export "edgefn_handle") (param i32 i32) (result i64)
        (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const {len(resp)}))))"""
    err = failure(load(engine, function_dir(tmp_path, "inject", src)))
    assert err.code == "bad_response" and "invalid value for header 'x-a'" in str(err)


def test_a_response_cut_inside_a_header_name_length_is_refused(engine: WasmEngine,
                                                               tmp_path: Path) -> None:
    """The declared length ends 2 bytes into header 1's u32 name length, and the
    guest's memory holds the rest of a valid frame after it: a decoder that reads
    that u32 without checking the room left would answer 200 from bytes the guest
    never returned."""
    resp = (struct.pack("<II", 200, 2) + struct.pack("<I", 12) + b"content-type"
            + struct.pack("<I", 10) + b"text/plain" + struct.pack("<I", 3) + b"x-b"
            + struct.pack("<I", 1) + b"1" + struct.pack("<I", 2) + b"hi")
    cut = 8 + 4 + 12 + 4 + 10 + 2
    data = "".join(f"\\{b:02x}" for b in resp)
    src = f"""(module (memory (export "memory") 1) (data (i32.const 16) "{data}")
      (func (export "edgefn_alloc") (param i32) (result i32) (i32.const 1024))
      (func (export "edgefn_handle") (param i32 i32) (result i64)
        (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const {cut}))))"""
    err = failure(load(engine, function_dir(tmp_path, "cut", src)))
    assert (err.code, err.status) == ("bad_response", 502)
    assert "header 1 name length" in str(err), str(err)


@pytest.mark.parametrize(("source", "words"), [
    ('(module (memory (export "memory") 1))', "exports neither `edgefn_handle`"),
    ('(module (func (export "edgefn_handle") (param i32 i32) (result i64) (i64.const 0)))',
     "needs an export `memory`"),
    ('(module (memory (export "memory") 1) (func (export "edgefn_alloc") (result i32) (i32.const 0))'
     ' (func (export "edgefn_handle") (param i32 i32) (result i64) (i64.const 0)))',
     "`edgefn_alloc` of type func (i32) -> (i32), found func () -> (i32)"),
    ('(module (import "env" "now" (func)) (func (export "_start")))',
     "imports `env.now`, which edgefn does not provide"),
    ("(module (func (export \"_start\") (call $nope)))", "not a valid WebAssembly module"),
])
def test_invalid_modules_are_rejected_at_deploy(engine: WasmEngine, tmp_path: Path, source: str,
                                                words: str) -> None:
    with pytest.raises(DeployError, match=words.replace("(", r"\(").replace(")", r"\)")):
        load(engine, function_dir(tmp_path, "bad", source))


def test_garbage_bytes_are_not_a_module(engine: WasmEngine, tmp_path: Path) -> None:
    d = function_dir(tmp_path, "junk", b"\x00asm\x01\x00\x00\x00garbage", entry="f.wasm")
    with pytest.raises(DeployError, match="not a valid WebAssembly module"):
        load(engine, d)


@pytest.mark.parametrize("source", [b"garbage!", b"", b"\x7fELF\x02\x01\x01", b"(module"])
def test_a_wasm_file_without_the_magic_is_not_a_webassembly_binary(
        engine: WasmEngine, tmp_path: Path, source: bytes) -> None:
    """It got wasmtime's WAT parser's error ("expected `(`"); WAT text that parses is
    still served from a `.wasm` file, as it was."""
    d = function_dir(tmp_path, "junk", source, entry="f.wasm")
    with pytest.raises(DeployError) as err:
        load(engine, d)
    assert str(err.value) == (f"f.wasm: not a WebAssembly binary (its first bytes are "
                              f"{source[:4]!r}, not b'\\x00asm'; a text module goes in a "
                              "`.wat` file)")
    text = function_dir(tmp_path, "text", '(module (func (export "_start")))', entry="f.wasm")
    assert load(engine, text).abi == "wasi"


# -- WASI command modules (WAGI style) -------------------------------------------------------

def run_async(fn: WasmFunction, req: Request) -> Response:
    import asyncio

    async def go() -> Response:
        return await _wait(fn.handle(req, "/hello-c", {}))
    return asyncio.run(go())


def test_c_example_runs_as_a_wasi_command(engine: WasmEngine) -> None:
    fn = load(engine, EXAMPLES / "hello-c")
    r = run_async(fn, request(b"/hello-c/x", b"12345", b"POST", b"name=Ada"))
    assert r.status == 200
    assert r.body == b"Hello, Ada from C! method=POST path=/hello-c/x\nbody-bytes=5\n"
    assert (b"x-powered-by", b"edgefn-c") in r.headers


WASI_PRELUDE = """(import "wasi_snapshot_preview1" "fd_write"
                    (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)"""


def wasi(body: str, data: str = "") -> str:
    return f'(module {WASI_PRELUDE} {data} (func (export "_start") {body}))'


def test_wasi_output_sets_status_and_headers(engine: WasmEngine, tmp_path: Path) -> None:
    out = "Status: 404 Not Found\\nX-A: b\\n\\nmissing"
    src = wasi(f"""(i32.store (i32.const 0) (i32.const 64)) (i32.store (i32.const 4) (i32.const {len(out) - out.count(chr(92))}))
               (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))""",
               f'(data (i32.const 64) "{out}")')
    r = run_async(load(engine, function_dir(tmp_path, "w", src)), request())
    assert (r.status, r.headers, r.body) == (404, [(b"x-a", b"b")], b"missing")


@pytest.mark.parametrize(("output", "headers", "body"), [
    # the header block ends at the first blank line, whichever line ends it uses: a
    # body's "\n\n" after a CRLF header block was taken for its end (502 b'')
    (b"Content-Type: text/plain\r\n\r\npara1\n\npara2\n", [(b"content-type", b"text/plain")],
     b"para1\n\npara2\n"),
    (b"A: b\n\npara1\r\n\r\npara2", [(b"a", b"b")], b"para1\r\n\r\npara2"),
    (b"A: b\r\nC: d\n\n\r\nbody", [(b"a", b"b"), (b"c", b"d")], b"\r\nbody"),
    (b"A: b\n\r\nbody\n\n", [(b"a", b"b")], b"body\n\n"),
])
def test_wasi_header_block_ends_at_its_first_blank_line(
        output: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    from runtime.executors.wasm.wasi import parse_response

    assert parse_response(output) == (200, headers, body)


# A WASI guest that answers with its environment: each NAME=value and its NUL.
ENV_DUMP = f"""(module
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $sizes (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_get" (func $environ (param i32 i32) (result i32)))
  {WASI_PRELUDE}
  (data (i32.const 64) "X-A: b\\n\\n")
  (func (export "_start")
    (drop (call $sizes (i32.const 32) (i32.const 36)))
    (drop (call $environ (i32.const 1024) (i32.const 8192)))
    (i32.store (i32.const 0) (i32.const 64)) (i32.store (i32.const 4) (i32.const 8))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16)))
    (i32.store (i32.const 0) (i32.const 8192)) (i32.store (i32.const 4) (i32.load (i32.const 36)))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16)))))"""


def test_wasi_request_bytes_arrive_as_utf8_once(engine: WasmEngine, tmp_path: Path) -> None:
    """Valid UTF-8 arrives byte for byte (it was read as latin-1 and encoded again:
    `café` arrived as `cafÃ©`); an invalid sequence arrives as U+FFFD."""
    fn = load(engine, function_dir(tmp_path, "envdump", ENV_DUMP, routes=["/e/:who"],
                                   extra='abi = "wasi"'))
    req = request("/e/zoë/ü".encode(), query="q=café".encode(),
                  headers=[(b"x-name", "café".encode()), (b"x-bad", b"ok\xff\xfe!")])
    r = asyncio.run(_wait(fn.handle(req, "/e/:who", {"who": "zoë".encode().decode("latin-1")})))
    assert isinstance(r.body, bytes)
    env = dict(e.split(b"=", 1) for e in r.body.split(b"\0") if e)
    assert env[b"HTTP_X_NAME"] == "café".encode()
    assert env[b"HTTP_X_BAD"] == "ok\ufffd\ufffd!".encode()
    assert (env[b"PATH_INFO"], env[b"QUERY_STRING"]) == ("/e/zoë/ü".encode(), "q=café".encode())
    assert env[b"EDGEFN_PARAM_WHO"] == "zoë".encode()


def test_a_nul_in_a_stored_versions_env_cuts_that_string_only(engine: WasmEngine,
                                                             tmp_path: Path) -> None:
    """A stored version may carry a NUL in a variable (a new deploy is refused one):
    the guest gets that name or value up to it, as C reads it, and every other
    variable whole (the native run takes them all in one NUL-separated buffer)."""
    fn = load(engine, function_dir(tmp_path, "envdump", ENV_DUMP, extra='abi = "wasi"'))
    fn.env.update({"SEP": "a\0b", "N\0AME": "v", "AFTER": "whole"})
    r = asyncio.run(_wait(fn.handle(request(b"/envdump"), "/envdump", {})))
    assert isinstance(r.body, bytes)
    env = dict(e.split(b"=", 1) for e in r.body.split(b"\0") if e)
    assert (env[b"SEP"], env[b"N"], env[b"AFTER"]) == (b"a", b"v", b"whole")
    assert env[b"PATH_INFO"] == b"/envdump"


def test_wasi_nonzero_exit_and_loop_and_flood(engine: WasmEngine, tmp_path: Path) -> None:
    exit1 = load(engine, function_dir(tmp_path, "exit1", wasi("(call $exit (i32.const 3))")))
    with pytest.raises(FunctionError, match="exited with status 3"):
        run_async(exit1, request())
    spin = load(engine, function_dir(tmp_path, "spin", wasi("(loop $l (br $l))"),
                                     limits="cpu_ms = 20"))
    with pytest.raises(FunctionError) as err:
        run_async(spin, request())
    assert err.value.code == "cpu_limit"
    # A well-formed CGI response of 20 x 60000 bytes, written in full before a normal exit:
    # past max_response_mb it is a 502 whatever the guest does with the write errors.
    flood = wasi("""(i32.store (i32.const 0) (i32.const 64)) (i32.store (i32.const 4) (i32.const 60000))
      (i32.store (i32.const 8) (i32.const 1024)) (i32.store (i32.const 12) (i32.const 8))
      (drop (call $fd_write (i32.const 1) (i32.const 8) (i32.const 1) (i32.const 16)))
      (i32.store (i32.const 20) (i32.const 20))
      (loop $l (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16)))
               (i32.store (i32.const 20) (i32.sub (i32.load (i32.const 20)) (i32.const 1)))
               (br_if $l (i32.load (i32.const 20))))""", '(data (i32.const 1024) "X-A: b\\n\\n")')
    fn = load(engine, function_dir(tmp_path, "flood", flood, limits="max_response_mb = 1"))
    with pytest.raises(FunctionError) as err:
        run_async(fn, request())
    assert (err.value.code, err.value.status) == ("bad_response", 502)
    assert f"larger than the limit of {1 << 20} bytes" in str(err.value)


def test_compiled_modules_are_cached_on_disk(tmp_path: Path) -> None:
    e = WasmEngine(tmp_path / "cache")
    try:
        load(e, EXAMPLES / "echo")
        cached = list((tmp_path / "cache").glob("*.cwasm"))
        assert len(cached) == 1 and e.compiles == 1
        load(e, EXAMPLES / "echo")
        assert e.compiles == 1  # a cache hit: machine code loaded, nothing compiled
        assert list((tmp_path / "cache").glob("*.cwasm")) == cached
        restarted = WasmEngine(tmp_path / "cache")  # a restarted PoP on the same data dir
        try:
            assert call(load(restarted, EXAMPLES / "echo"), request(b"/echo")).status == 200
            assert restarted.compiles == 0
        finally:
            restarted.close()
        cached[0].write_bytes(b"corrupt")  # a damaged cache entry is recompiled, not fatal
        assert call(load(e, EXAMPLES / "hello-wat")).status == 200
        assert call(load(e, EXAMPLES / "echo"), request(b"/echo")).status == 200
        assert e.compiles == 3  # hello-wat, and echo again over its corrupt entry
        assert call(load(e, EXAMPLES / "echo"), request(b"/echo")).status == 200
        assert e.compiles == 3  # the recompiled entry replaced the corrupt one
    finally:
        e.close()


def test_engine_uses_the_path_it_was_asked_for(engine: WasmEngine) -> None:
    fn = load(engine, EXAMPLES / "hello-wat")
    native = isinstance(fn.call, wasm_native.NativeReactorCall)
    assert native == (engine.native is not None)


def test_native_library_builds_and_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    if not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler on PATH")
    monkeypatch.setenv("EDGEFN_NATIVE_CACHE", str(tmp_path))
    built = wasm_native._build()
    assert built.parent == tmp_path and built.exists()
    assert wasm_native._build() == built  # second call: cache hit, no rebuild
    assert wasm_native.NativeLib(built).call is not None


# -- the native serve: the request encoded and the response decoded in C ----------------------
# A guest whose response is the request's body: GET / with no query, headers, env, params
# or principal puts the body at byte 32 (magic, 3 strings, 2 empty pair counts, body
# length), and 4 bytes of empty params follow it.
MIRROR = """(module (memory (export "memory") 1)
  (func (export "edgefn_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "edgefn_handle") (param $p i32) (param $n i32) (result i64)
    (i64.or (i64.shl (i64.extend_i32_u (i32.add (local.get $p) (i32.const 32))) (i64.const 32))
            (i64.extend_i32_u (i32.sub (local.get $n) (i32.const 36))))))"""
ROOMY = "cpu_ms = 5000\nwall_ms = 5000"  # epochs count wall time: a loaded machine is slow
NAME_BYTES = st.sampled_from([b"x-a", b"Content-Type", b"X-UPPER", b"a b", b"", b"x\n", b"x\r",
                              b"x:y", b"\xff", b"~!#$%&'*+-.^_`|", b"k\0"])
VALUE_BYTES = st.sampled_from([b"", b"v", b"a\r\nb: c", b"x\n", b"x\ry", b"\0", b"\xff\xfe",
                               b" sp "])


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """Response frames: well-formed, with invalid names, values or status, cut short, or
    with bytes flipped or appended."""
    headers = draw(st.lists(st.tuples(NAME_BYTES, VALUE_BYTES), max_size=4))
    status = draw(st.sampled_from([200, 99, 100, 599, 600, 0, 2**32 - 1]))
    frame = bytearray(abi.encode_response(status, headers, draw(st.binary(max_size=64))))
    match draw(st.sampled_from(["as is", "cut", "flip", "append"])):
        case "cut":
            del frame[draw(st.integers(0, len(frame))):]
        case "flip":
            frame[draw(st.integers(0, len(frame) - 1))] ^= draw(st.integers(1, 255))
        case "append":
            frame += draw(st.binary(min_size=1, max_size=8))
    return bytes(frame)


def _outcome(f: Callable[[], object]) -> object:
    try:
        return f()
    except FunctionError as e:
        return (e.code, e.status, str(e))


@pytest.fixture(scope="module")
def mirror(engine: WasmEngine, tmp_path_factory: pytest.TempPathFactory) -> WasmFunction:
    """The MIRROR guest on `engine`, once a module (hypothesis reruns the test that
    uses it hundreds of times). In pytest's own temporary directory: a `mkdtemp` removed
    at exit was left in /tmp by `make mutate`, whose forked workers skip atexit."""
    return load(engine, function_dir(tmp_path_factory.mktemp("mirror"), "mirror", MIRROR,
                                     limits=ROOMY))


@settings(max_examples=400, deadline=None)
@given(frame=frames())
def test_any_response_decodes_as_the_python_decoder_decodes_it(mirror: WasmFunction,
                                                               frame: bytes) -> None:
    fn = mirror
    full = fn.new_call()  # its whole budget: the 5 ms inline slice could cut a preempted run
    got = _outcome(lambda: full.serve(b"GET", b"/", b"", [], fn.env_blob, frame,
                                      abi.NO_PAIRS, b""))
    assert got == _outcome(lambda: abi.decode_response(frame))


# A guest that answers 200 with its whole request as the body: it frames the request
# in place (status, no headers, the body length, in the 12 bytes before it).
WHOLE = """(module (memory (export "memory") 1)
  (func (export "edgefn_alloc") (param i32) (result i32) (i32.const 1036))
  (func (export "edgefn_handle") (param $p i32) (param $n i32) (result i64)
    (i32.store (i32.const 1024) (i32.const 200)) (i32.store (i32.const 1028) (i32.const 0))
    (i32.store (i32.const 1032) (local.get $n))
    (i64.or (i64.shl (i64.const 1024) (i64.const 32))
            (i64.extend_i32_u (i32.add (local.get $n) (i32.const 12))))))"""


@pytest.mark.parametrize("headers", [[], [(b"x-a", b"1"), (b"x-b", b""), (b"k", b"\xff\x00")]])
def test_the_request_is_encoded_as_the_python_encoder_encodes_it(
        engine: WasmEngine, tmp_path: Path, headers: list[tuple[bytes, bytes]]) -> None:
    fn = load(engine, function_dir(tmp_path, "whole", WHOLE, extra='[env]\nA = "b"',
                                   limits=ROOMY))
    fields = (b"PATCH", b"/a%20b", b"q=1", headers, fn.env_blob, b"body\0",
              abi.encode_params({"id": "7"}), abi.encode_principal({"tenant": "t"}))
    assert fn.new_call().serve(*fields) == (200, [], abi.encode_request(*fields))


@pytest.mark.parametrize("fields", [
    ("GET", b"/", b"", [], b"\0\0\0\0", b"", b"\0\0\0\0", b""),  # a str method
    (b"GET", b"/", b"", [(b"x", "y")], b"\0\0\0\0", b"", b"\0\0\0\0", b""),
    (b"GET", b"/", b"", [(b"x",)], b"\0\0\0\0", b"", b"\0\0\0\0", b""),
    (b"GET", b"/", b"", ((b"x", b"y"),), b"\0\0\0\0", b"", b"\0\0\0\0", b""),
    (b"GET", b"/", b"", [], b"\0\0\0\0", bytearray(b"x"), b"\0\0\0\0", b""),
])
def test_a_field_of_the_wrong_type_is_a_type_error(fields: tuple[object, ...]) -> None:
    e = WasmEngine(None, native=True) if wasm_native.load() is not None else None
    if e is None or wasm_native.load().serve is None:  # type: ignore[union-attr]
        pytest.skip("the native extension cannot be built here")
    try:
        fn = load(e, EXAMPLES / "hello-wat")
        with pytest.raises(TypeError):
            fn.call.serve(*fields)  # type: ignore[arg-type]
        assert fn.call.serve(b"GET", b"/", b"", [], fn.env_blob, b"", abi.NO_PAIRS,
                             b"")[0] == 200  # and the next request is served
    finally:
        e.close()
