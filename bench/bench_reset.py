"""What resetting a WASM instance's memory costs a request, by `[wasm] keep_resident_kib`
and by where a module's memory is touched, next to a baseline measured in the same run.

    python bench/bench_reset.py [--seconds 5] [--rounds 2] [--keep 4,64,128,1028]

Every request gets a fresh instance; when it is dropped, wasmtime's pool zeroes the
first `keep_resident_kib` of its linear memory with memset and decommits the rest
(madvise), whose pages the guest touched fault in again at its next request. So the
cost depends on the module's layout:

- hello-wat: one 64 KiB page, touched in its first KiB;
- hello-c (wasi-sdk): data, then a 64 KiB stack, then the heap: its first ~70 KiB;
- stack-first: rustc's wasm32 layout (a 1 MiB stack from address 0, growing down
  from 1 MiB, then data and heap): a 17-page module that touches the stack's top
  page and the page above it, past 1 MiB.

1. For each setting in `--keep` (KiB; one PoP each, `wrk -t1 -c32`, best of
   `--rounds`): each module's req/s and the PoP's CPU microseconds per request (its
   CPU clock over the round), and the ratio of its req/s to the same module's at
   the default (128).
2. Why a memset costs more than itself: edgefn's front with a static app
   (bench/_front_only.py) zeroing 64 bytes (the call alone) vs 64 KiB of the same
   buffer at each request: req/s and CPU per request. The memset evicts what the
   kernel's loopback path had in the core's caches.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import _baseline  # noqa: E402
import _wrk  # noqa: E402
import bench_runtime  # noqa: E402

from runtime.admin.client import AdminClient  # noqa: E402
from runtime.executors.wasm.engine import KEEP_RESIDENT  # noqa: E402
from tests.support import function_dir  # noqa: E402

DEFAULT_KIB = KEEP_RESIDENT >> 10
STACK_TOP = 1 << 20  # rustc's wasm32 default stack: 1 MiB from address 0
# A reactor laid out as rustc lays out wasm32 (`--stack-first`): a call frame 256
# bytes under the stack's top, the response in a data segment just above the stack,
# the request written by `edgefn_alloc` on the heap after it.
STACK_FIRST = f"""(module
  (memory (export "memory") 17)
  (global $sp (mut i32) (i32.const {STACK_TOP}))
  (global $heap (mut i32) (i32.const {STACK_TOP + 1024}))
  (data (i32.const {STACK_TOP + 16})
    "\\c8\\00\\00\\00\\01\\00\\00\\00"
    "\\0c\\00\\00\\00content-type"
    "\\19\\00\\00\\00text/plain; charset=utf-8"
    "\\1a\\00\\00\\00Hello from edgefn (WASM)!\\0a")
  (func (export "edgefn_alloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (local.get $p) (local.get $n)))
    (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
      (then unreachable))
    (local.get $p))
  (func (export "edgefn_handle") (param $ptr i32) (param $len i32) (result i64)
    (i64.store (i32.sub (global.get $sp) (i32.const 256)) (i64.extend_i32_u (local.get 0)))
    (i64.or (i64.shl (i64.const {STACK_TOP + 16}) (i64.const 32)) (i64.const 83))))
"""
MODULES = {"hello-wat": "/hello", "hello-c": "/hello-c", "stack-first": "/stack-first"}


def by_setting(args: argparse.Namespace, work: Path) -> None:
    functions = [ROOT / "functions" / "examples" / "hello-wat",
                 ROOT / "functions" / "examples" / "hello-c",
                 function_dir(work, "stack-first", STACK_FIRST)]
    results: dict[int, dict[str, dict]] = {}
    for kib in args.keep:
        data = work / f"data-{kib}"
        data.mkdir()
        config = work / f"pop-{kib}.toml"
        config.write_text(f"[wasm]\nkeep_resident_kib = {kib}\n")
        proc, port = bench_runtime.start_edgefn(data, ["--config", str(config), "--no-ai"])
        try:
            for d in functions:
                AdminClient(data).deploy(d)
            results[kib] = _wrk.best(_wrk.rounds(
                {name: (proc.pid, f"http://127.0.0.1:{port}{path}")
                 for name, path in MODULES.items()}, args.seconds, args.rounds))
        finally:
            proc.terminate()
            proc.wait(20)
    print(f"\n== a fresh instance per request, wrk -t1 -c32 -d{args.seconds}s, best of "
          f"{args.rounds} rounds, by [wasm] keep_resident_kib ==")
    print(f"{'module':<13}{'keep KiB':>9}{'req/s':>10}{'PoP us/req':>12}{'x default':>11}")
    for name in MODULES:
        base = results.get(DEFAULT_KIB, {}).get(name)
        for kib in args.keep:
            r = results[kib][name]
            ratio = f"{r['rps'] / base['rps']:.2f}" if base else "n/a"
            print(f"{name:<13}{kib:>9}{r['rps']:>10.0f}{r['cpu_us']:>12.2f}{ratio:>11}")


def memset_effect(args: argparse.Namespace) -> None:
    servers = {}
    try:
        for touch in (64, 65536):
            port = bench_runtime.free_port()
            proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "_front_only.py"),
                                     str(port), "--touch", str(touch)],
                                    stdout=subprocess.DEVNULL)
            servers[touch] = (proc, f"http://127.0.0.1:{port}/")
            _baseline.wait_until_listening(proc, "127.0.0.1", port, 10)
        best = _wrk.best(_wrk.rounds({touch: (proc.pid, url)
                                      for touch, (proc, url) in servers.items()},
                                     args.seconds, args.rounds))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(20)
    print(f"\n== edgefn's front, static app, zeroing a buffer per request, wrk -t1 -c32 "
          f"-d{args.seconds}s, best of {args.rounds} ==")
    print(f"{'memset bytes':<14}{'req/s':>10}{'us/req':>9}{'x 64 B':>9}")
    for touch, r in best.items():
        print(f"{touch:<14}{r['rps']:>10.0f}{r['cpu_us']:>9.2f}"
              f"{r['rps'] / best[64]['rps']:>9.2f}")
    extra = best[65536]["cpu_us"] - best[64]["cpu_us"]
    print(f"64 KiB zeroed costs the request {extra:+.2f} us of CPU")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--keep", default="4,64,128,1028",
                   help="keep_resident_kib settings, comma-separated")
    args = p.parse_args()
    args.keep = [int(k) for k in args.keep.split(",")]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        by_setting(args, Path(tmp))
    memset_effect(args)
    print(f"(load average {os.getloadavg()[0]:.2f}; {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
