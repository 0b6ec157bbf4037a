"""No request sees what the one before it left in linear memory: every WASM request
gets a fresh instance, and the pooling allocator hands it a slot whose first
`KEEP_RESIDENT` bytes (`[wasm] keep_resident_kib`) were reset by memset and the rest
by madvise. A guest that finds a marker of its own at an address below, at and past
that boundary (the default's, and 4 KiB's) traps; otherwise it leaves the marker
there for the next request. Run in process (the executor's inline call) with the
default and with 4 KiB kept, and over HTTP, where the native lane calls the reactor
and runs the command in C. What the setting changes, which pages stay resident, is
read from the kernel (mincore)."""

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
ADDRESSES = [200, 4092, 4096, KEEP_RESIDENT - 4, KEEP_RESIDENT, KEEP_RESIDENT + 9000]
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
engine = WasmEngine(Path(sys.argv[1]) / "cache", keep_resident=int(sys.argv[2]))
assert engine.pooling, "no pooling allocator here"
for name in sys.argv[3:]:
    fn = load(engine, Path(sys.argv[1]) / name)
    for _ in range(5):
        response = run(fn)
        assert response.status == 200, (name, response.status, response.body)
print("ok", flush=True)
"""


def in_child(script: str, *args: str) -> str:
    """What `script` prints, run with `args` in a process of its own (see CHILD)."""
    root = Path(__file__).resolve().parents[2]
    child = subprocess.run([sys.executable, "-c", script, *args], capture_output=True,
                           text=True, timeout=120, cwd=root,
                           env={**os.environ, "PYTHONPATH": str(root)})
    assert child.returncode == 0, child.stderr[-3000:]
    return child.stdout


@pytest.mark.parametrize("keep", [KEEP_RESIDENT, 4096])
def test_in_process_each_request_finds_memory_zeroed(tmp_path: Path, keep: int) -> None:
    function_dir(tmp_path, "rmarks", REACTOR)
    function_dir(tmp_path, "cmarks", COMMAND, extra='abi = "wasi"')
    assert in_child(CHILD, str(tmp_path), str(keep), "rmarks", "cmarks") == "ok\n"


# An instance writes a byte 100 bytes into its second page and is dropped: is that
# page still resident (reset by memset) or not (decommitted)? mincore says.
RESIDENT = """
import ctypes, gc, sys
import wasmtime
from runtime.executors.wasm.engine import WasmEngine
engine = WasmEngine(None, keep_resident=int(sys.argv[1]))
assert engine.pooling, "no pooling allocator here"
module = wasmtime.Module(engine.engine, '(module (memory (export "memory") 3) '
                         '(func (export "touch") (i32.store8 (i32.const 65636) (i32.const 1))))')
libc = ctypes.CDLL(None, use_errno=True)
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
vec = (ctypes.c_ubyte * 1)()
for _ in range(3):
    store = wasmtime.Store(engine.engine)
    store.set_epoch_deadline(1 << 30)
    instance = wasmtime.Instance(store, module, [])
    memory = instance.exports(store)["memory"]
    page = ctypes.addressof(memory.data_ptr(store).contents) + 65536
    instance.exports(store)["touch"](store)
    del instance, memory, store
    gc.collect()  # the store is dropped: its slot reset as keep_resident says
    assert libc.mincore(ctypes.c_void_p(page), 4096, vec) == 0, ctypes.get_errno()
    print(vec[0] & 1, end=" ")
engine.close()
"""


@pytest.mark.parametrize(("keep", "resident"), [(KEEP_RESIDENT, "1 1 1 "), (4096, "0 0 0 "),
                                                (65536, "0 0 0 "), (69632, "1 1 1 ")])
def test_keep_resident_decides_which_pages_stay_resident(keep: int, resident: str) -> None:
    """The engine's `keep_resident` reaches wasmtime's pool: a page past it that the
    guest wrote is decommitted when its instance is dropped, one below it is kept."""
    assert in_child(RESIDENT, str(keep)) == resident


def test_the_pop_config_sets_keep_resident_and_the_threads_memory(tmp_path: Path) -> None:
    with pop_thread(tmp_path / "data", **{"wasm.keep_resident_kib": 8,
                                          "wasm.max_thread_memory_mb": 3000}) as pop:
        assert pop.pop.wasm.keep_resident == 8192
        assert pop.pop.wasm.thread_memory_mb == 3000
    with pop_thread(tmp_path / "data2", **{"wasm.max_thread_memory_mb": 3000,
                                           "workers": 2}) as pop:
        assert pop.pop.wasm.thread_memory_mb == 1500  # each worker its part


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
