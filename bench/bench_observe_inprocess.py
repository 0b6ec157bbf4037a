"""What events and metrics cost per request, in process: a PoP's pipeline called
directly (no sockets, no HTTP parsing) for a WASM hello, with

    (a) the default pipeline without the events stage (so no metrics either)
    (b) the default pipeline, [metrics] off
    (c) the default pipeline (events into the ring and the Prometheus metrics)

CPU microseconds per request of the calling thread, best and median of --rounds
rounds of --n requests, the three interleaved in each round so machine noise
hits them alike; ratios to (a). Run from the repo root:

    .venv/bin/python bench/bench_observe_inprocess.py [--n 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

from runtime import config as c  # noqa: E402
from runtime.executors.wasm import function as wasm_function  # noqa: E402
from runtime.functions import deploys  # noqa: E402
from runtime.net.message import Request, Response  # noqa: E402
from runtime.pop import PoP  # noqa: E402

# CPU time is what is measured: a request preempted past the 5 ms inline slice on a busy
# machine must not move the function to worker threads (the loop is not running here)
wasm_function.INLINE_SLICE_MS = 10_000

VARIANTS = ("(a) no events stage", "(b) events, metrics off", "(c) events + metrics")


def make(variant: int, data: Path) -> PoP:
    overrides: dict[str, Any] = {"ai.enabled": False, "metrics.enabled": variant == 2}
    cfg = c.load(None, data=str(data), **overrides)
    if variant == 0:
        cfg = msgspec.structs.replace(cfg, pipeline=[
            s for s in cfg.pipeline if not isinstance(s, c.EventsStage)])
    return PoP(cfg)


def one_round(pop: PoP, request: Request, n: int) -> float:
    started = time.thread_time()
    for _ in range(n):
        response = pop.pipeline(request)
        assert isinstance(response, Response) and response.status == 200, response
    return (time.thread_time() - started) / n * 1e6


async def main(args: argparse.Namespace) -> None:
    hello = deploys.pack_dir(ROOT / "functions" / "examples" / "hello-wat")
    request = Request(b"GET", b"/hello", b"", [(b"host", b"localhost"),
                                                (b"user-agent", b"bench/1.0")],
                      b"localhost", "1.1", True, "127.0.0.1:5000")
    with tempfile.TemporaryDirectory() as tmp:
        pops = [make(i, Path(tmp) / str(i)) for i in range(3)]
        for pop in pops:
            await pop.registry.deploy(hello)
            one_round(pop, request, args.n // 4)  # warm up
        rounds: list[list[float]] = [[], [], []]
        for r in range(args.rounds):
            order = range(3) if r % 2 == 0 else reversed(range(3))
            for i in order:
                rounds[i].append(one_round(pops[i], request, args.n))
        for pop in pops:
            pop.close()
    base = statistics.median(rounds[0])
    print(f"hello (WASM) through the pipeline in process, {args.rounds} rounds x {args.n} "
          "requests, CPU us per request:")
    print(f"{'variant':28} {'best':>7} {'median':>7}  x (a) median")
    for name, values in zip(VARIANTS, rounds, strict=True):
        med = statistics.median(values)
        print(f"{name:28} {min(values):7.2f} {med:7.2f}  {base / med:5.2f}x the req/s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    asyncio.run(main(parser.parse_args()))
