"""No request sees what the one before it left in linear memory: every WASM request
gets a fresh instance, and the pooling allocator hands it a slot whose first
`KEEP_RESIDENT` bytes were reset by memset and the rest by madvise. A guest that
finds a marker of its own at an address below, at and past that boundary traps;
otherwise it leaves the marker there for the next request. Run in process (the
executor's inline call) and over HTTP, where the native lane calls the reactor and
runs the command in C."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.executors.wasm.engine import KEEP_RESIDENT
from runtime.pipeline.lane import NativeLane
from tests.executors.test_wasm_function import HEADER
from tests.support import function_dir, pop_thread, reactor

# page 0 (the data image's page), the last word kept resident, the first word past
# it, and one deep in the third page: each must read 0 in every fresh instance
ADDRESSES = [200, KEEP_RESIDENT - 4, KEEP_RESIDENT, KEEP_RESIDENT + 9000]
PAGES = (KEEP_RESIDENT + 9000) // 65536 + 1
CHECK = "".join(f"(br_if $dirty (i32.load (i32.const {a})))" for a in ADDRESSES)
MARK = "".join(f"(i32.store (i32.const {a}) (i32.const 0x5a5a5a5a))" for a in ADDRESSES)
REACTOR = reactor(f"(block $clean (block $dirty {CHECK} {MARK} (br $clean)) unreachable)",
                  memory=PAGES)
# fd_write alone (no poll_oneoff): a command the lane's C runs itself
COMMAND = f"""(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") {PAGES}) {HEADER}
  (func (export "_start")
    (block $dirty {CHECK} {MARK}
      (i32.store (i32.const 0) (i32.const 64)) (i32.store (i32.const 4) (i32.const 8))
      (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
      (return))
    unreachable))"""


# In a process of its own: this one may hold POOLED_MAX pooling engines already (other
# tests' PoPs), and a new engine would then make its instances on demand, fresh mmaps
# that prove nothing about the pool's reset.
CHILD = """
import asyncio, sys
from pathlib import Path
from runtime.executors.wasm.engine import WasmEngine
from tests.executors.test_wasm_function import load, run
engine = WasmEngine(Path(sys.argv[1]) / "cache")
assert engine.pooling, "no pooling allocator here"
for name in sys.argv[2:]:
    fn = load(engine, Path(sys.argv[1]) / name)
    for _ in range(5):
        response = run(fn)
        assert response.status == 200, (name, response.status, response.body)
print("ok", flush=True)
"""


def test_in_process_each_request_finds_memory_zeroed(tmp_path: Path) -> None:
    function_dir(tmp_path, "rmarks", REACTOR)
    function_dir(tmp_path, "cmarks", COMMAND, extra='abi = "wasi"')
    root = Path(__file__).resolve().parents[2]
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), "rmarks", "cmarks"],
                           capture_output=True, text=True, timeout=120, cwd=root,
                           env={**os.environ, "PYTHONPATH": str(root)})
    assert child.returncode == 0 and child.stdout == "ok\n", child.stderr[-3000:]


def test_over_the_native_lane_each_request_finds_memory_zeroed(tmp_path: Path) -> None:
    with pop_thread(tmp_path / "data") as pop:
        pop.deploy(function_dir(tmp_path, "rmarks", REACTOR))
        pop.deploy(function_dir(tmp_path, "cmarks", COMMAND, extra='abi = "wasi"'))
        lane = pop.pop.lane
        assert isinstance(lane, NativeLane)
        conn = http.client.HTTPConnection(pop.host, pop.port, timeout=10)
        for path in ["/rmarks", "/cmarks"] * 5:
            conn.request("GET", path, headers={"User-Agent": "curl/8"})
            response = conn.getresponse()
            assert response.status == 200, (path, response.read())
            response.read()
        conn.close()
        assert lane.served >= 5 and (lane.c.commands_run >= 5 or not lane.commands)


def test_the_guest_tells_a_used_instance_from_a_fresh_one() -> None:
    """What makes the tests above able to fail: the reactor called twice in one
    instance (its marks still there) traps the second time."""
    import wasmtime

    store = wasmtime.Store()
    instance = wasmtime.Instance(store, wasmtime.Module(store.engine, REACTOR), [])
    handle = instance.exports(store)["edgefn_handle"]
    assert isinstance(handle, wasmtime.Func)
    handle(store, 1024, 0)
    with pytest.raises(wasmtime.Trap):
        handle(store, 1024, 0)
