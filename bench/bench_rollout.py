"""What a consistent rollout costs, and what a canary costs a request.

    (A) in process: `Targets.resolve` (the route lookup every request makes) for a
        WASM function without and with a 10 % canary beside it; CPU microseconds
        per lookup, best of --rounds interleaved rounds; ratio to no canary.
    (B) three `edgefn serve --no-ai` processes on loopback: --n rollouts of
        alternating versions with `runtime.topology.rollout` (stage on all, then
        activate on all), against a one-shot `edgefn deploy` to one PoP measured
        in the same run: milliseconds of each phase, and the switch window (first
        to last PoP switch, from the PoPs' own clocks).

Run from the repo root:

    .venv/bin/python bench/bench_rollout.py [--n 10] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.admin.client import AdminClient  # noqa: E402
from runtime.bindings import Stores  # noqa: E402
from runtime.executors.wasm.engine import WasmEngine  # noqa: E402
from runtime.functions import deploys  # noqa: E402
from runtime.functions.canary import HEADER  # noqa: E402
from runtime.functions.registry import Registry  # noqa: E402
from runtime.net.message import Request  # noqa: E402
from runtime.pipeline.stage import Context  # noqa: E402
from runtime.pipeline.targets import Targets  # noqa: E402
from runtime.topology import rollout  # noqa: E402

WAT = """(module (memory (export "memory") 1)
  (data (i32.const 16) "\\c8\\00\\00\\00\\00\\00\\00\\00\\02\\00\\00\\00ok")
  (func (export "edgefn_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "edgefn_handle") (param i32 i32) (result i64)
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 14))))"""


def package(root: Path, rev: int) -> deploys.Files:
    d = root / f"rev{rev}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "main.wat").write_text(WAT)
    (d / "edgefn.toml").write_text(f'name = "b"\nruntime = "wasm"\nentry = "main.wat"\n'
                                   f'routes = ["/b"]\n# rev {rev}\n')
    return deploys.pack_dir(d)


# -- (A) ------------------------------------------------------------------------------------
def lookups(targets: Targets, requests: list[Request]) -> float:
    """CPU microseconds per `resolve`."""
    started = time.thread_time()
    for r in requests:
        targets.resolve(r, Context("10.0.0.1:5000"))
    return (time.thread_time() - started) / len(requests) * 1e6


async def bench_lookup(root: Path, rounds: int) -> None:
    engines = [WasmEngine(root / f"cache{i}") for i in range(2)]
    regs = [Registry(root / f"data{i}", engines[i], Stores(root / f"data{i}")) for i in range(2)]
    for reg in regs:
        await reg.deploy(package(root, 1))
    staged = await regs[1].stage(package(root, 2))
    await regs[1].activate("b", staged.version, 10.0)
    requests = [Request(b"GET", b"/b", b"", [(HEADER, f"user-{i}".encode())], b"h", "1.1",
                        True, "10.0.0.1:5000") for i in range(20_000)]
    best = [min(lookups(Targets(reg), requests) for _ in range(rounds)) for reg in regs]
    print(f"(A) route lookup, no canary:   {best[0]:.3f} us  1.00x")
    print(f"(A) route lookup, 10% canary:  {best[1]:.3f} us  {best[1] / best[0]:.2f}x")
    for reg in regs:
        reg.close()
    for e in engines:
        e.close()


# -- (B) ------------------------------------------------------------------------------------
@contextlib.contextmanager
def pop(data: Path) -> Iterator[None]:
    """An `edgefn serve --no-ai` process on `data`, once it serves."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", "--no-ai", "--port",
                             "0", "--data", str(data)], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("serving "):
                break
        yield
    finally:
        proc.terminate()
        proc.wait(30)


def bench_rollout(root: Path, n: int) -> None:
    run = root / "run"
    names = ["edge-a", "edge-b", "central"]
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(pop(rollout.rundir.pop_dir(run, name)))
        pops = [(name, rollout.rundir.pop_dir(run, name)) for name in names]
        single = root / "single"
        stack.enter_context(pop(single))
        one, stage, switch, window = [], [], [], []
        for i in range(n):
            blob = deploys.to_tar(package(root, 10 + i))
            t0 = time.perf_counter()
            AdminClient(single).request("POST", "/v1/deploy", blob)
            t1 = time.perf_counter()
            staged = rollout.stage(pops, lambda _, c, b=blob: c.request(  # type: ignore[misc]
                "POST", "/v1/stage", b))
            t2 = time.perf_counter()
            r = rollout.activate(pops, staged)
            t3 = time.perf_counter()
            one.append((t1 - t0) * 1000)
            stage.append((t2 - t1) * 1000)
            switch.append((t3 - t2) * 1000)
            window.append(r.window_ms)
    base = statistics.median(one)
    total = [a + b for a, b in zip(stage, switch, strict=True)]
    for label, xs in (("one-shot deploy, 1 PoP (baseline)", one),
                      ("rollout stage, 3 PoPs", stage), ("rollout activate, 3 PoPs", switch),
                      ("rollout total, 3 PoPs", total),
                      ("switch window (first..last PoP)", window)):
        med = statistics.median(xs)
        print(f"(B) {label:<36} median {med:8.2f} ms  max {max(xs):8.2f} ms  "
              f"{med / base:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10, help="rollouts in (B)")
    p.add_argument("--rounds", type=int, default=5, help="rounds in (A)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(bench_lookup(Path(tmp), args.rounds))
        bench_rollout(Path(tmp), args.n)


if __name__ == "__main__":
    main()
