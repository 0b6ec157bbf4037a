"""A short request's time to first token beside a long prompt's prefill, against the
same request alone, in one run of the model worker (the chat model on the CPU).

    .venv/bin/python bench/bench_ttft_prefill.py [--prompt-tokens 3000] [--repeat 3]

The long prompt goes first; the short one 0.3 s later, while the long one is still
being fed in chunks of the step budget. The scheduler feeds the prompt with the fewest
tokens left first (`gpu_worker.engines.batching.Scheduler.plan`); fed in arrival order,
the short request's first token waited for the long prompt's whole prefill.
"""

from __future__ import annotations

import argparse
import asyncio
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


async def run(a: argparse.Namespace, tmp: Path) -> None:
    client = WorkerClient.spawning(str(tmp / "w.sock"), worker_config(tmp, a.weights, 2))
    await client.start()
    try:
        words = " ".join(f"word{i}" for i in range(a.prompt_tokens // 3))
        long = [{"role": "user", "content": f"Summarize: {words}"}]
        await first_token(client, SHORT)  # warm-up
        alone, beside, prefill = [], [], []
        for _ in range(a.repeat):
            alone.append((await first_token(client, SHORT))[0])
            big = asyncio.ensure_future(first_token(client, long, 1))
            await asyncio.sleep(0.3)
            beside.append((await first_token(client, SHORT))[0])
            prefill.append((await big)[1])
        a50, b50, p50 = (statistics.median(x) for x in (alone, beside, prefill))
        print(f"== TTFT of a short chat ({a.repeat} runs, medians; model {CHAT}, "
              f"weights {a.weights}) ==")
        print(f"alone                                  {a50 * 1e3:8.1f} ms   x alone = 1.00")
        print(f"0.3 s after a ~{a.prompt_tokens}-token prompt      {b50 * 1e3:8.1f} ms   "
              f"x alone = {b50 / a50:.2f}")
        print(f"(the long prompt's own first token     {p50 * 1e3:8.1f} ms   x alone = "
              f"{p50 / a50:.2f})")
    finally:
        await client.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt-tokens", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--weights", default="f16")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgefn-bench-ttft-") as folder:
        asyncio.run(run(a, Path(folder)))


if __name__ == "__main__":
    main()
