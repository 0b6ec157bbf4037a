"""The AssemblyScript SDK with bytes that are not UTF-8: a body echoed and a KV value
stored and read back unchanged (every value was a `string`, so `\\xff\\xfe\\x00\\x01`
came back as `ed be b8 ed b0 81`); and its reads into a buffer (`kvGetBytes`, `call`)
against a value that changes between the first call and the retry with a bigger
buffer (it retried once: a value grown again was read past the buffer, one gone
reached `new Uint8Array(-1)`). Compiled here with the pinned compiler `make test`
installs (skipped without it, failed under CI, as the examples' rebuilds are)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgefn_core.errors import FunctionError
from tests.support import EXAMPLES, Running, function_dir, in_ci, scripted_host

SDK = EXAMPLES.parent / "sdk" / "assemblyscript" / "edgefn"
SOURCE = """\
import {{ Request, Response, kvGetBytes, kvPutBytes, setHandler }} from "{sdk}";
export {{ edgefn_alloc, edgefn_handle }} from "{sdk}";

function handle(req: Request): Response {{
  if (req.method == "POST") {{
    kvPutBytes("asbytes", "v", req.body);
    return Response.binary(200, "application/octet-stream", req.body);
  }}
  const v = kvGetBytes("asbytes", "v");
  if (v === null) return new Response(404, "text/plain", "none\\n");
  return Response.binary(200, "application/octet-stream", v);
}}

setHandler(handle);
"""


def asc() -> str:
    found = os.environ.get("ASC") or str(Path(sys.prefix) / "tools" / "node_modules" / ".bin"
                                         / "asc")
    if not Path(found).exists():
        why = f"the AssemblyScript compiler is missing ({found}): `make test` installs it"
        if in_ci():
            pytest.fail(why)
        pytest.skip(why)
    return found


def test_binary_bodies_and_kv_values_round_trip(pop: Running, tmp_path: Path) -> None:
    d = tmp_path / "asbytes"
    d.mkdir()
    (d / "fn.ts").write_text(SOURCE.format(sdk=os.path.relpath(SDK, d)))
    subprocess.run([asc(), "fn.ts", "-O3", "--runtime", "stub", "--use", "abort=", "-o",
                    "fn.wasm"], cwd=d, check=True, capture_output=True, timeout=300)
    (d / "edgefn.toml").write_text('name = "asbytes"\nruntime = "wasm"\nentry = "fn.wasm"\n'
                                   'routes = ["/asbytes"]\n[bindings]\nkv = ["asbytes"]\n')
    pop.deploy(d)
    data = bytes([0xFF, 0xFE, 0x00, 0x01]) + bytes(range(256))
    status, _, body = pop.request("POST", "/asbytes", data)
    assert (status, body) == (200, data)
    assert pop.get("/asbytes")[2] == data
    assert pop.pop.stores.kv.get("asbytes", b"v") == data


RETRY_SOURCE = """\
import {{ Request, Response, call, kvGetBytes, setHandler }} from "{sdk}";
export {{ edgefn_alloc, edgefn_handle }} from "{sdk}";

function handle(req: Request): Response {{
  if (req.path == "/call") return new Response(200, "text/plain", call("kv.get", "{{}}"));
  const v = kvGetBytes("sdk", "k");
  if (v === null) return new Response(404, "text/plain", "none");
  return Response.binary(200, "application/octet-stream", v);
}}

setHandler(handle);
"""
SMALL, BIG = b"s" * 9000, b"0123456789abcdef" * 12800  # 9,000 and 204,800 bytes


@pytest.fixture(scope="module")
def retry_wasm(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    d = tmp_path_factory.mktemp("asretry")
    (d / "fn.ts").write_text(RETRY_SOURCE.format(sdk=os.path.relpath(SDK, d)))
    subprocess.run([asc(), "fn.ts", "-O3", "--runtime", "stub", "--use", "abort=", "-o",
                    "fn.wasm"], cwd=d, check=True, capture_output=True, timeout=300)
    return (d / "fn.wasm").read_bytes()


def retry_folder(tmp_path: Path, wasm: bytes) -> Path:
    return function_dir(tmp_path, "asretry", wasm, entry="fn.wasm",
                        extra='[bindings]\nkv = ["sdk"]')


@pytest.mark.parametrize(("path", "first"), [(b"/kv", 4096), (b"/call", 8192)])
def test_a_value_that_grew_again_before_the_retry_is_read_whole(
        retry_wasm: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: bytes,
        first: int) -> None:
    with scripted_host(retry_folder(tmp_path, retry_wasm), [SMALL, BIG, BIG],
                       monkeypatch) as (fn, host):
        r = host.handle(fn, path)
    assert (r.status, len(r.body), r.body == BIG) == (200, len(BIG), True)
    assert host.caps == [first, len(SMALL), len(BIG)]


def test_a_value_gone_before_the_retry_is_null(retry_wasm: bytes, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    with scripted_host(retry_folder(tmp_path, retry_wasm), [SMALL, None],
                       monkeypatch) as (fn, host):
        r = host.handle(fn)
    assert (r.status, r.body) == (404, b"none")
    assert host.caps == [4096, len(SMALL)]


def test_a_value_that_grows_on_every_call_traps_after_eight(
        retry_wasm: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    growing: list[bytes | None] = [b"g" * (5000 + 1000 * i) for i in range(20)]
    with (scripted_host(retry_folder(tmp_path, retry_wasm), growing, monkeypatch) as (fn, host),
          pytest.raises(FunctionError) as err):
        host.handle(fn)
    assert err.value.code == "trap", str(err.value)
    assert host.caps == [4096] + [5000 + 1000 * i for i in range(7)]  # 8 calls, no more
