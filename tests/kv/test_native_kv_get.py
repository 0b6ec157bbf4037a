"""The WASM ``kv_get`` host function over both of its paths, native (C on py-lmdb's
own environment) and Python, with the same cases and the same expected answers:
values, absent and expired keys, a small buffer, every denial and bad pointer;
plus what only the native path could get wrong: a reused read transaction must
see the latest write, a withdrawn grant must stop the next read, a closed store
must not be read. Real wasmtime and LMDB, no sockets."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgefn_core.abi import decode_response, encode_params, encode_request
from edgefn_core.errors import FunctionError
from runtime.bindings import Bindings, Stores
from runtime.executors.wasm import native_kv
from runtime.executors.wasm.engine import WasmEngine
from runtime.executors.wasm.function import WasmFunction
from runtime.functions import manifest
from runtime.net.message import Request, Response
from tests.support import function_dir

BUF = 3020  # the response body's bytes after the i64 result: where values land

GET = """(module
  (import "edgefn" "kv_get" (func $get (param i32 i32 i32 i32 i32 i32) (result i64)))
  (import "edgefn" "kv_put" (func $put (param i32 i32 i32 i32 i32 i32) (result i64)))
  (memory (export "memory") 1)
  (data (i32.const 100) "{ns}")
  (data (i32.const 200) "{key}")
  (data (i32.const 300) "second")
  (data (i32.const 3000) "\\c8\\00\\00\\00\\00\\00\\00\\00")
  (func (export "edgefn_alloc") (param i32) (result i32) (i32.const 8192))
  (func (export "edgefn_handle") (param $p i32) (param $n i32) (result i64)
    (i32.store (i32.const 3008) (i32.const {body_len}))
    {before}
    (i64.store (i32.const 3012) (call $get (i32.const 100) (i32.const {ns_len}) (i32.const 200)
                                           (i32.const {key_len}) (i32.const {buf})
                                           (i32.const {cap})))
    (i64.or (i64.shl (i64.const 3000) (i64.const 32)) (i64.const {total}))))
"""
# put "second" at the same key, then read it back in the same request
PUT_THEN_GET = """(drop (call $put (i32.const 100) (i32.const {ns_len}) (i32.const 200)
                                (i32.const {key_len}) (i32.const 300) (i32.const 6)))"""


def guest(ns: str, key: str, buf: int = BUF, cap: int = 16, before: str = "") -> str:
    """A reactor that answers the i64 kv_get returned, then `cap` bytes at BUF."""
    lens = {"ns_len": len(ns.encode()), "key_len": len(key.encode())}
    return GET.format(ns=ns, key=key, buf=buf, cap=cap, body_len=8 + cap, total=20 + cap,
                      before=before.format(**lens), **lens)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WasmEngine]:
    e = WasmEngine(tmp_path_factory.mktemp("cache"))
    yield e
    e.close()


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Stores]:
    s = Stores(tmp_path / "data")
    yield s
    s.close()


@pytest.fixture(params=["native", "python"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setenv("EDGEFN_NATIVE_KV", "0")
    elif native_kv.load() is None:
        pytest.skip("the native kv_get cannot be built here (no C compiler?)")
    return str(request.param)


def deploy(engine: WasmEngine, stores: Stores, root: Path, name: str, source: str,
           bindings: str, owner: str = "") -> WasmFunction:
    extra = (f'owner = "{owner}"\n' if owner else "") + f"[bindings]\n{bindings}"
    d = function_dir(root, name, source, extra=extra)
    m = manifest.load(d)
    stores.owners.check(m, name)
    stores.claim(m)
    fn = WasmFunction(engine, m, d, Bindings.prepare(stores, m))
    fn.prewarm()
    return fn


def call(fn: WasmFunction) -> tuple[int, bytes]:
    """kv_get's result and the bytes at BUF. Raises `FunctionError`."""
    async def go() -> Response:
        r = Request(b"GET", b"/", b"", [], b"localhost", "1.1", True, "127.0.0.1:1")
        result = fn.handle(r, "/", {})
        return result if isinstance(result, Response) else await result
    body = asyncio.run(go()).body
    assert isinstance(body, bytes)
    return int.from_bytes(body[:8], "little", signed=True), body[8:]


def native_used(fn: WasmFunction, path: str) -> None:
    """In the native case, kv_get is the C function (else the Python one)."""
    assert (fn.host_functions is not None and fn.host_functions.native_kv is not None) \
        == (path == "native")


def seed(stores: Stores) -> None:
    kv = stores.kv
    kv.put("docs", b"k", b"hello", metadata={"lang": "en"})
    kv.put("docs", b"big", b"x" * 40)
    kv.put("docs", b"empty", b"")
    with kv._write() as w:  # already expired: a read must not return it, purged or not
        w.put("docs", b"old", b"stale", expires_ms=int(time.time() * 1000) - 1000)
    kv.put("docs", b"later", b"fresh", ttl=3600)


Z = bytes(16)
# (case, namespace, key, buf, cap, expected): (result, the 16 bytes at BUF), or the error
CASES: list[tuple[str, str, str, int, int, Any]] = [
    ("value", "docs", "k", BUF, 16, (5, b"hello" + Z[5:])),
    ("value with ttl", "docs", "later", BUF, 16, (5, b"fresh" + Z[5:])),
    ("empty value", "docs", "empty", BUF, 16, (0, Z)),
    ("value that fills the buffer", "docs", "big", BUF, 40, (40, b"x" * 16)),
    ("absent", "docs", "nope", BUF, 16, (-1, Z)),
    ("expired", "docs", "old", BUF, 16, (-1, Z)),
    ("too big for the buffer: its length, nothing copied", "docs", "big", BUF, 16, (40, Z)),
    ("absent, buffer outside memory: never touched", "docs", "nope", 70000, 16, (-1, Z)),
    ("undeclared namespace", "secret", "k", BUF, 16,
     "did not declare KV namespace 'secret'"),
    ("buffer outside memory", "docs", "k", 65534, 16,
     "pointer (65534, 5) is outside guest memory"),
    ("empty key", "docs", "", BUF, 16, "key of 0 bytes in 'docs': keys must be 1 to 511 bytes"),
    ("key over 511 bytes: never stored, so absent", "docs", "k" * 512, BUF, 16, (-1, Z)),
]


@pytest.mark.parametrize(("case", "ns", "key", "buf", "cap", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_kv_get_answers_alike_on_both_paths(engine: WasmEngine, stores: Stores, tmp_path: Path,
                                            path: str, case: str, ns: str, key: str, buf: int,
                                            cap: int, expected: Any) -> None:
    fn = deploy(engine, stores, tmp_path, "me", guest(ns, key, buf, cap), 'kv = ["docs"]')
    native_used(fn, path)
    seed(stores)
    native = fn.host_functions.native_kv if fn.host_functions else None
    if native is not None:
        native.refresh()  # else the first read fills the table, in Python
    fallbacks = native.fallbacks if native else 0
    if isinstance(expected, str):
        with pytest.raises(FunctionError) as err:
            call(fn)
        assert (err.value.code, err.value.status) == ("binding", 500)
        assert expected in str(err.value), str(err.value)
        return
    result, data = call(fn)
    assert (result, data[:16]) == expected
    if native is not None and len(key) <= 511:  # served in C, not handed to Python
        assert native.fallbacks == fallbacks


def test_plain_reads_are_served_in_c(engine: WasmEngine, stores: Stores, tmp_path: Path,
                                     path: str) -> None:
    fn = deploy(engine, stores, tmp_path, "me", guest("docs", "k"), 'kv = ["docs"]')
    seed(stores)
    assert call(fn)[0] == 5  # the first read fills the table of readable namespaces
    native = fn.host_functions.native_kv if fn.host_functions else None
    if native is None:
        return
    before = native.fallbacks
    for _ in range(20):
        assert call(fn) == (5, b"hello" + bytes(11))
    assert native.fallbacks == before


def test_a_write_is_seen_by_the_next_read(engine: WasmEngine, stores: Stores, tmp_path: Path,
                                          path: str) -> None:
    """The C side reuses read transactions: each read must still take a fresh
    snapshot, for writes by the PoP and by the guest itself."""
    fn = deploy(engine, stores, tmp_path, "me", guest("docs", "k"), 'kv = ["docs"]')
    stores.kv.put("docs", b"k", b"first")
    assert call(fn)[1][:5] == b"first"
    assert call(fn)[1][:5] == b"first"  # the transaction goes back to the pool here
    stores.kv.put("docs", b"k", b"other")
    assert call(fn)[1][:5] == b"other"
    stores.kv.delete("docs", b"k")
    assert call(fn)[0] == -1
    again = deploy(engine, stores, tmp_path / "2", "me2",
                   guest("docs", "k", before=PUT_THEN_GET), 'kv = ["docs"]', owner="me")
    assert call(again) == (6, b"second" + bytes(10))


def test_a_withdrawn_grant_stops_the_next_read(engine: WasmEngine, stores: Stores,
                                              tmp_path: Path, path: str) -> None:
    deploy(engine, stores, tmp_path, "owner", guest("n", "k"),
           'kv = ["n"]\n[bindings.share.kv]\nn = { read = ["reader"] }')
    stores.kv.put("n", b"k", b"shared")
    reader = deploy(engine, stores, tmp_path, "reader", guest("n", "k"), 'kv = ["n"]')
    assert call(reader)[1][:6] == b"shared"
    assert call(reader)[1][:6] == b"shared"
    deploy(engine, stores, tmp_path / "2", "owner", guest("n", "k"), 'kv = ["n"]')  # no grant
    for _ in range(3):
        with pytest.raises(FunctionError) as err:
            call(reader)
        assert "KV namespace 'n' belongs to owner 'owner' and is not shared with 'reader'" \
            in str(err.value)


def test_a_closed_store_is_not_read(engine: WasmEngine, stores: Stores, tmp_path: Path,
                                    path: str) -> None:
    fn = deploy(engine, stores, tmp_path, "me", guest("docs", "k"), 'kv = ["docs"]')
    seed(stores)
    assert call(fn)[0] == 5
    stores.kv.close()
    with pytest.raises(FunctionError) as err:
        call(fn)
    assert "KV store is closed" in str(err.value)


def test_concurrent_reads_see_whole_values_while_the_pop_writes(
        engine: WasmEngine, stores: Stores, tmp_path: Path, path: str) -> None:
    """Four guest threads share the pool of read transactions while the PoP rewrites
    the key: every read is one whole value that was written, never a mix."""
    fn = deploy(engine, stores, tmp_path, "me", guest("docs", "k"), 'kv = ["docs"]')
    values = [bytes([65 + i]) * (1 + i % 16) for i in range(26)]
    stores.kv.put("docs", b"k", values[0])
    data = encode_request(b"GET", b"/", b"", [], b"", b"", encode_params({}), b"")
    fn._call_here(data)  # fills the table of readable namespaces
    native = fn.host_functions.native_kv if fn.host_functions else None
    fallbacks = native.fallbacks if native else 0
    seen: list[bytes] = []
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            for _ in range(200):
                status, _, body = decode_response(fn._call_here(data))
                assert status == 200
                n = int.from_bytes(body[:8], "little", signed=True)
                seen.append(body[8:8 + n])
        except BaseException as e:  # reported below, with the thread's failure
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for i in range(200):
        stores.kv.put("docs", b"k", values[i % 26])
    for t in threads:
        t.join()
    assert errors == []
    assert len(seen) == 800 and set(seen) <= set(values)
    if native is not None:  # all of them served in C
        assert native.fallbacks == fallbacks
