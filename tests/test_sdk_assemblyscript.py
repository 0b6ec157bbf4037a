"""The AssemblyScript SDK with bytes that are not UTF-8: a body echoed and a KV value
stored and read back unchanged (every value was a `string`, so `\\xff\\xfe\\x00\\x01`
came back as `ed be b8 ed b0 81`). Compiled here with the pinned compiler `make
test` installs (skipped without it, failed under CI, as the examples' rebuilds are)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import EXAMPLES, Running, in_ci

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
