"""Where a WASM hello request's time goes inside the PoP, without sockets: each
segment timed in the same process and run, min of repeats (robust on a loaded
machine), next to the one it contains.

    python bench/bench_wasm_hot.py [--n 20000] [--repeat 7]

Segments, each containing the next:
  1. the default pipeline (every stage of `runtime.config.default_pipeline`,
     model worker off), a fresh Request per call, on a running event loop;
  2. a route + dispatch pipeline;
  3. `WasmFunction.handle` (the executor: params, principal, the call, Response);
  4. the reactor call alone: the native extension's ``serve`` (encode into guest
     memory, run, decode: one C call) vs the ctypes entry point with the Python
     codec (`encode_request` + call + `decode_response`, the path before it) vs
     the pure-ctypes path (``EDGEFN_NATIVE=0``).
The HTTP front's own cost is bench/bench_runtime.py's "edgefn front, static app".
The access log's lines are formatted and written to /dev/null (not the console).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgefn_core.abi import NO_PAIRS, decode_response, encode_request  # noqa: E402
from runtime import config as c  # noqa: E402
from runtime.executors.wasm.ffi import ReactorCall  # noqa: E402
from runtime.executors.wasm.function import WasmFunction  # noqa: E402
from runtime.executors.wasm.native import NativeReactorCall  # noqa: E402
from runtime.functions import deploys  # noqa: E402
from runtime.net.message import Request, Response  # noqa: E402
from runtime.pipeline.chain import Chain  # noqa: E402
from runtime.pipeline.stages.access_log import AccessLog  # noqa: E402
from runtime.pipeline.stages.dispatch import Dispatch  # noqa: E402
from runtime.pipeline.stages.route import Route  # noqa: E402
from runtime.pipeline.targets import Targets  # noqa: E402
from runtime.pop import PoP  # noqa: E402

HELLO = ROOT / "functions" / "examples" / "hello-wat"
HEADERS = [(b"host", b"127.0.0.1:8080"), (b"user-agent", b"wrk"), (b"accept", b"*/*")]


def request() -> Request:
    """What the HTTP front hands the app for wrk's GET /hello."""
    return Request(b"GET", b"/hello", b"", list(HEADERS), b"127.0.0.1:8080", "1.1", True,
                   "127.0.0.1:40000")


async def per_call_us(f: Callable[[], object], n: int, repeat: int) -> float:
    """Microseconds per call of `f`, min of `repeat` runs of `n`; the loop turns every
    32 calls, as under wrk -c32 (observers and the access log flush there)."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for i in range(n):
            f()
            if i % 32 == 31:
                await asyncio.sleep(0)
        best = min(best, time.perf_counter() - started)
    return best / n * 1e6


async def measure(pop: PoP, n: int, repeat: int) -> dict[str, float]:
    files = deploys.pack_dir(HELLO)
    await pop.registry.deploy(files)
    fn = pop.registry.router.match(b"127.0.0.1:8080", b"/hello")[0]  # type: ignore[index]
    wasm = fn.executor
    assert isinstance(wasm, WasmFunction)
    minimal = Chain([Route(Targets(pop.registry)), Dispatch()])
    full = pop.pipeline
    for app in (full, minimal):
        r = app(request())
        assert isinstance(r, Response) and r.status == 200, (r, getattr(r, "body", b""))
    # 10 s deadlines: on a loaded machine a preempted call must not be cut at 5 ms
    limits = (pop.wasm.engine, wasm.pre, wasm.memory_limit, 10_000, wasm.outcome,
              wasm.max_response)
    native = pop.wasm.native
    call = NativeReactorCall(native, *limits) if native is not None else ReactorCall(*limits)
    ctypes_call = ReactorCall(*limits)
    req = request()
    fields = (req.method, req.path, req.query, req.headers, wasm.env_blob, req.body, NO_PAIRS,
              b"")
    out: dict[str, float] = {}
    for _ in range(2):  # interleaved: both passes see the same machine
        rows = {
            "default pipeline": lambda: full(request()),
            "route + dispatch": lambda: minimal(request()),
            "WasmFunction.handle": lambda: wasm.handle(req, "/hello", {}),
            "native serve (one C call)": lambda: call.serve(*fields),
            "native call + Python codec": lambda: decode_response(call(encode_request(*fields))),
            "ctypes path + Python codec": lambda: ctypes_call.serve(*fields),
        }
        for name, f in rows.items():
            t = await per_call_us(f, n, repeat)
            out[name] = min(t, out.get(name, t))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        off: dict[str, Any] = {"ai.enabled": False}  # (dotted names: **)
        config = c.load(None, data=tmp, **off)
        pop = PoP(config)
        devnull = open(os.devnull, "wb")  # noqa: SIM115 (closed below)
        for observer in pop.observers:
            if isinstance(observer, AccessLog):
                # its lines are formatted and written (one write a loop turn), as in a
                # PoP, but not onto the console, which 100,000 of them flooded
                observer.stream = devnull
        try:
            if pop.wasm.native is None or pop.wasm.native.serve is None:
                print("the native extension is not available: its rows show the ctypes path")
            results = asyncio.run(measure(pop, args.n, args.repeat))
        finally:
            pop.close()
            devnull.close()
    print(f"\n== WASM hello per request, in process (min of {args.repeat} x {args.n}) ==")
    full = results["default pipeline"]
    base = results["native call + Python codec"]
    for name, us in results.items():
        print(f"{name:<30}{us:8.2f} us   x default pipeline = {us / full:.2f}"
              f"   x native call + Python codec = {us / base:.2f}")
    print(f"stages other than route + dispatch  {full - results['route + dispatch']:6.2f} us")
    print(f"route + dispatch around the handle  "
          f"{results['route + dispatch'] - results['WasmFunction.handle']:6.2f} us")
    print(f"handle around the reactor call      "
          f"{results['WasmFunction.handle'] - results['native serve (one C call)']:6.2f} us")


if __name__ == "__main__":
    main()
