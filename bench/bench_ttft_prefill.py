"""A long prompt's prefill beside other requests, in one run of the model worker (the
chat model on the CPU): a short request's time to first token, and the gaps between a
running stream's tokens, each against the same request alone; for each
`prefill_chunk` (the prompt tokens a decode call feeds while some sequence waits on it
for a token), with the whole step budget (512: the scheduler before the chunk) as the
baseline, each in a worker of its own started in turn.

    .venv/bin/python bench/bench_ttft_prefill.py [--prompt-tokens 3000] [--repeat 3]
                                                 [--chunks 512,128,64]

The long prompt goes first; the short one 0.3 s later, while the long one is still
being fed. The scheduler feeds the prompt with the fewest tokens left first, and in a
step where anything samples at most `prefill_chunk` prompt tokens
(`gpu_worker.engines.batching.Scheduler.plan`); fed in arrival order, the short
request's first token waited for the long prompt's whole prefill.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ai import CHAT, worker_config

from gpu_worker.client import WorkerClient

SHORT = [{"role": "user", "content": "Say hi."}]
EOS = (0, 1, 2)  # smollm2's <|endoftext|>, <|im_start|>, <|im_end|>
STREAM = [{"role": "user", "content": "Count from one to five hundred in words."}]


async def first_token(client: WorkerClient, messages: list[dict[str, str]],
                      max_tokens: int = 4) -> tuple[float, float]:
    """(seconds to the first chunk, seconds in all)."""
    started = time.perf_counter()
    gen = await client.generate(CHAT, messages=messages, max_tokens=max_tokens,
                                temperature=0, seed=1)
    first = 0.0
    async for _ in gen:
        if not first:
            first = time.perf_counter() - started
    return first, time.perf_counter() - started


async def stream_times(client: WorkerClient, until: asyncio.Event | int) -> list[float]:
    """When each chunk of a stream came (perf_counter seconds), up to `until` chunks
    or until it is set (its end-of-text tokens banned, so that it runs that long)."""
    gen = await client.generate(CHAT, messages=STREAM, max_tokens=4000, temperature=0,
                                seed=1, logit_bias=dict.fromkeys(EOS, -100.0))
    times: list[float] = []
    async for _ in gen:
        times.append(time.perf_counter())
        if until.is_set() if isinstance(until, asyncio.Event) else len(times) >= until:
            break
    await gen.aclose()
    return times


def gaps(times: list[float], start: float, end: float) -> list[float]:
    """The gaps between chunks that came from `start` to `end` (and the first after)."""
    inside = [t for t in times if t >= start]
    inside = [t for t in inside if t <= end] + [t for t in inside if t > end][:1]
    return [b - a for a, b in itertools.pairwise(inside)]


async def measure(a: argparse.Namespace, tmp: Path, chunk: int) -> dict[str, float]:
    folder = tmp / f"chunk{chunk}"
    folder.mkdir()
    config = Path(worker_config(folder, a.weights, 2))
    config.write_text(config.read_text() + f"prefill_chunk = {chunk}\n")
    client = WorkerClient.spawning(str(folder / "w.sock"), str(config))
    await client.start()
    try:
        words = " ".join(f"word{i}" for i in range(a.prompt_tokens // 3))
        long = [{"role": "user", "content": f"Summarize: {words}"}]
        await first_token(client, SHORT)  # warm-up
        alone, beside, prefill, gap_alone, gap_beside = [], [], [], [], []
        for _ in range(a.repeat):
            alone.append((await first_token(client, SHORT))[0])
            big = asyncio.ensure_future(first_token(client, long, 1))
            await asyncio.sleep(0.3)
            beside.append((await first_token(client, SHORT))[0])
            prefill.append((await big)[1])
            # a stream's token gaps alone, then while a long prompt is fed beside it
            times = await stream_times(client, 40)
            gap_alone.append(statistics.median(gaps(times, 0, float("inf"))))
            done = asyncio.Event()
            stream = asyncio.ensure_future(stream_times(client, done))
            await asyncio.sleep(0.5)
            begun = time.perf_counter()
            await first_token(client, long, 1)
            ended = time.perf_counter()
            await asyncio.sleep(0.2)
            done.set()
            gap_beside.append(max(gaps(await stream, begun, ended)))
        return {k: statistics.median(v) for k, v in (
            ("alone", alone), ("beside", beside), ("prefill", prefill),
            ("gap_alone", gap_alone), ("gap_beside", gap_beside))}
    finally:
        await client.close()


async def run(a: argparse.Namespace, tmp: Path) -> None:
    chunks = [int(c) for c in a.chunks.split(",")]
    print(f"== a ~{a.prompt_tokens}-token prompt's prefill beside other requests ({a.repeat} "
          f"runs each, medians; model {CHAT}, weights {a.weights}; baseline: prefill_chunk "
          f"{chunks[0]}) ==")
    print("prefill_chunk   short TTFT: alone   0.3 s after it   x alone   x base  |  "
          "stream gap: alone   longest beside   x alone   x base  |  long prompt   x base")
    base: dict[str, float] = {}
    for chunk in chunks:
        m = await measure(a, tmp, chunk)
        base = base or m
        print(f"{chunk:13d}   {m['alone'] * 1e3:14.1f} ms {m['beside'] * 1e3:13.1f} ms "
              f"{m['beside'] / m['alone']:9.2f} {m['beside'] / base['beside']:8.2f}  |  "
              f"{m['gap_alone'] * 1e3:14.1f} ms {m['gap_beside'] * 1e3:13.1f} ms "
              f"{m['gap_beside'] / m['gap_alone']:9.2f} {m['gap_beside'] / base['gap_beside']:8.2f}"
              f"  |  {m['prefill'] * 1e3:8.0f} ms {m['prefill'] / base['prefill']:7.2f}",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt-tokens", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--weights", default="f16")
    ap.add_argument("--chunks", default="512,128,64",
                    help="prefill_chunk values, the first the baseline (512: the whole step)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgefn-bench-ttft-") as folder:
        asyncio.run(run(a, Path(folder)))


if __name__ == "__main__":
    main()
