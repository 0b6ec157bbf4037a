"""The C example rebuilds from source to a module that behaves like the committed one."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from runtime.executors.wasm.engine import WasmEngine
from runtime.executors.wasm.function import WasmFunction
from runtime.functions import manifest
from runtime.net.message import Request
from tests.support import EXAMPLES

HELLO_C = EXAMPLES / "hello-c"


def toolchain_missing() -> str | None:
    if not shutil.which("clang"):
        return "clang not installed (apt-get install -y clang lld wasi-libc libclang-rt-dev-wasm32)"
    if not Path("/usr/include/wasm32-wasi").is_dir():
        return "wasi-libc not installed (apt-get install -y wasi-libc libclang-rt-dev-wasm32)"
    return None


def run(engine: WasmEngine, folder: Path, query: bytes, body: bytes) -> bytes:
    fn = WasmFunction(engine, manifest.load(folder), folder)
    request = Request(b"POST", b"/hello-c", query, [], b"x", "1.1", True, "127.0.0.1:1")
    request.body = body

    async def go() -> bytes:
        result = fn.handle(request, "/hello-c", {})
        response = await result  # type: ignore[misc]
        return bytes(response.body)
    return asyncio.run(go())


@pytest.mark.skipif(toolchain_missing() is not None, reason=toolchain_missing() or "")
def test_c_example_rebuilds_and_matches_the_committed_build(tmp_path: Path) -> None:
    rebuilt = tmp_path / "hello-c"
    shutil.copytree(HELLO_C, rebuilt)
    (rebuilt / "hello.wasm").unlink()
    subprocess.run(["bash", str(rebuilt / "build.sh")], check=True, cwd=rebuilt, timeout=120,
                   env={**os.environ, "OUT": str(rebuilt / "hello.wasm")})
    engine = WasmEngine(None)
    try:
        for query, body in ((b"", b""), (b"name=Grace", b"x" * 70000)):
            assert run(engine, rebuilt, query, body) == run(engine, HELLO_C, query, body)
    finally:
        engine.close()


@pytest.mark.skipif(shutil.which("clang") is None or shutil.which("wasm-ld") is None,
                    reason="clang and lld not installed (apt-get install -y clang lld)")
@pytest.mark.parametrize("example", ["counter-c", "retrieval-c"])
def test_c_sdk_examples_rebuild_to_the_same_interface(example: str, tmp_path: Path) -> None:
    import wasmtime

    folder = EXAMPLES / example
    committed = next(folder.glob("*.wasm"))
    out = tmp_path / committed.name
    subprocess.run(["bash", str(folder / "build.sh")], check=True, timeout=120,
                   env={**os.environ, "OUT": str(out)})
    engine = wasmtime.Engine()

    def interface(path: Path) -> tuple[list[tuple[str, str]], list[str]]:
        m = wasmtime.Module.from_file(engine, str(path))
        return sorted((i.module, i.name or "") for i in m.imports), sorted(e.name for e in m.exports)

    assert interface(out) == interface(committed)
