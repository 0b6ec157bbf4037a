"""The C SDK's reads into a buffer (`edgefn_kv_get_str`, `edgefn_call_str`) against a
value that changes between its first call and the retry with a bigger buffer: it
retried once and took the second length as it came, so a value that had grown again
meanwhile was read past its buffer (2 of ~14,000 reads under two writers alternating
a key between 5,000 and 200,000 bytes trapped `memory out of bounds`; others returned
garbage). Compiled here with clang and lld (skipped without them, failed under CI)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from edgefn_core.errors import FunctionError
from tests.support import EXAMPLES, function_dir, in_ci, scripted_host

SDK = EXAMPLES.parent / "sdk" / "c"
SOURCE = r"""#include "edgefn.h"
int64_t handle(const edgefn_request *req) {
    edgefn_str v = edgefn_eq(req->path, "/call") ? edgefn_call_str("kv.get", 6, "{}", 2)
                                                 : edgefn_kv_get_str("sdk", 3, "k", 1);
    if (!v.ptr) return edgefn_respond(404, "text/plain", "none", 4);
    return edgefn_respond(200, "application/octet-stream", v.ptr, v.len);
}
"""
SMALL, BIG = b"s" * 5000, bytes(range(256)) * 800  # 5,000 and 204,800 bytes


@pytest.fixture(scope="module")
def wasm(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    if shutil.which("clang") is None or shutil.which("wasm-ld") is None:
        why = "clang and lld not installed: `make toolchains` installs them"
        if in_ci():
            pytest.fail(why)
        pytest.skip(why)
    d = tmp_path_factory.mktemp("sdk-c")
    (d / "fn.c").write_text(SOURCE)
    subprocess.run(["clang", "--target=wasm32", "-O2", "-nostdlib", "-Wl,--no-entry",
                    "-Wl,--strip-all", "-Wl,--allow-undefined", f"-I{SDK}", "-o",
                    str(d / "fn.wasm"), str(d / "fn.c")], check=True, timeout=120,
                   env=os.environ.copy())
    return (d / "fn.wasm").read_bytes()


def folder(tmp_path: Path, wasm: bytes) -> Path:
    return function_dir(tmp_path, "sdkc", wasm, entry="fn.wasm", extra='[bindings]\nkv = ["sdk"]')


@pytest.mark.parametrize("path", [b"/kv", b"/call"])
def test_a_value_that_grew_again_before_the_retry_is_read_whole(
        wasm: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: bytes) -> None:
    # 5,000 bytes for the 4 KiB buffer; 204,800 by the retry with 5,000; whole at last
    with scripted_host(folder(tmp_path, wasm), [SMALL, BIG, BIG], monkeypatch) as (fn, host):
        r = host.handle(fn, path)
    assert (r.status, len(r.body), r.body == BIG) == (200, len(BIG), True)
    assert host.caps == [4096, len(SMALL), len(BIG)]


def test_a_value_gone_before_the_retry_is_absent(wasm: bytes, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    with scripted_host(folder(tmp_path, wasm), [SMALL, None], monkeypatch) as (fn, host):
        r = host.handle(fn)
    assert (r.status, r.body) == (404, b"none")
    assert host.caps == [4096, len(SMALL)]


def test_a_value_that_shrank_before_the_retry_is_read(wasm: bytes, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    with scripted_host(folder(tmp_path, wasm), [BIG, SMALL], monkeypatch) as (fn, host):
        r = host.handle(fn)
    assert (r.status, r.body) == (200, SMALL)


def test_a_value_that_grows_on_every_call_traps_after_eight(
        wasm: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    growing: list[bytes | None] = [b"g" * (5000 + 1000 * i) for i in range(20)]
    with (scripted_host(folder(tmp_path, wasm), growing, monkeypatch) as (fn, host),
          pytest.raises(FunctionError) as err):
        host.handle(fn)
    assert err.value.code == "trap", str(err.value)
    assert host.caps == [4096] + [5000 + 1000 * i for i in range(7)]  # 8 calls, no more
