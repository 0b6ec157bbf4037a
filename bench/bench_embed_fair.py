"""One short embedding's latency while LONG requests of long inputs run on the same
ONNX engine (the red team's burst), and the engine process's memory after them.

Each of LONG requests holds N inputs of 32 Ki characters (the limits' most); the
short request (one sentence, client "b") is sent SAMPLES times, one after another,
from DELAY seconds after they start (past their tokenizing: in their inference
batches), and every long request is cancelled after that. The burst runs twice:
its requests all of client "a", then each of a client of its own (how requests
shared the engine before clients: a turn each). Prints the short request's solo
time, its latency during each burst (each sample, and the worst as a ratio to solo
and to one batch of 4 long inputs), and RSS before, at the end and at the peak.

    python bench/bench_embed_fair.py [--long 2] [--inputs 2048] [--samples 5] [--delay 15]
        [--cap 120]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_worker.config import ModelSpec
from gpu_worker.engines.onnx import MAX_TEXT_CHARS, OnnxEngine

MODEL = "all-minilm-l6-v2"
SHORT = ["is it going to rain in lisbon tomorrow"]


def rss(field: str = "VmRSS") -> int:
    """This process's `field` from /proc/self/status, in MB."""
    return next(int(line.split()[1]) >> 10 for line in open("/proc/self/status")
                if line.startswith(field))


async def timed(eng: OnnxEngine, texts: list[str], cap: float, client: str = "b") -> float:
    """Seconds to embed `texts`, or `cap` if it took longer (then it is cancelled)."""
    started = time.monotonic()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(eng.embed(MODEL, texts, client), cap)
    return time.monotonic() - started


async def burst(eng: OnnxEngine, long: list[str], clients: list[str],
                args: argparse.Namespace) -> list[float]:
    """The short request's latencies while requests of `clients` embed `long`."""
    running = [asyncio.ensure_future(eng.embed(MODEL, long, c)) for c in clients]
    await asyncio.sleep(args.delay)
    waits = [await timed(eng, SHORT, args.cap) for _ in range(args.samples)]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    return waits


async def main(args: argparse.Namespace) -> None:
    eng = OnnxEngine(ModelSpec(MODEL, "onnx"))
    await eng.start()
    long = [(f"{i} " + "lighthouse keeper " * MAX_TEXT_CHARS)[:MAX_TEXT_CHARS]
            for i in range(args.inputs)]
    solo = min([await timed(eng, SHORT, args.cap) for _ in range(3)])
    batch = min([await timed(eng, long[:4], args.cap) for _ in range(2)])
    before = rss()
    print(f"short solo {solo * 1000:.0f} ms; one batch of 4 long inputs {batch * 1000:.0f} ms")
    for label, clients in (("one client", ["a"] * args.long),
                           ("a client each", [f"a{i}" for i in range(args.long)])):
        waits = await burst(eng, long, clients, args)
        print(f"short during {args.long} x {args.inputs} long inputs of {label}, from "
              f"{args.delay:.0f} s: {', '.join(f'{w:.2f}' for w in waits)} s (cap "
              f"{args.cap:.0f} s); worst = {max(waits) / solo:.1f} x solo = "
              f"{max(waits) / batch:.1f} batches", flush=True)
    await eng.embed(MODEL, SHORT)
    print(f"RSS {before} MB before the burst, {rss()} MB after, peak {rss('VmHWM')} MB")
    eng.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", type=int, default=2, help="long requests at once")
    parser.add_argument("--inputs", type=int, default=2048, help="inputs per long request")
    parser.add_argument("--samples", type=int, default=5, help="short requests timed")
    parser.add_argument("--delay", type=float, default=15.0,
                        help="seconds from the burst's start to the first short one")
    parser.add_argument("--cap", type=float, default=120.0, help="seconds a short one waits")
    asyncio.run(main(parser.parse_args()))
