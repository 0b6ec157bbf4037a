"""A short chat's latency on a llama.cpp worker (the packaged smollm2-135m, a
CONTEXT-token KV cache, MAX_BATCH slots) alone, beside a hog, beside slow
readers, and beside one other client's hogs:

- hog: one stream with ``max_tokens`` = the context less its prompt and its end
  tokens banned (it really generates that long), read as fast as it comes;
- slow: MAX_BATCH streams whose readers read nothing past their first chunks
  (window 2), so each pauses for credit holding a slot;
- client's hogs: HOGS such hogs of client "a" at once (more than the slots),
  the short chat from client "b" (`Generate.client`; a worker older than it
  ignores the field and serves them first come, first served);
- chatty: MAX_BATCH streams of client "a" with a long prompt (615
  tokens) and HOG_TOKENS to generate, timed from their requests to their last
  tokens alone and while client "b" sends short chats one after another
  (each takes a hog's slot; the hog waits and comes back, its cells kept or
  recomputed). Its worker's cache is CHATTY_CONTEXT tokens: room for all.
  Printed with the worker's CPU seconds meanwhile (``/proc``), which other
  load on the machine moves less than the wall time.

The victim chat is timed from its request to its last token (max_queue_seconds WAIT:
a 503 after WAIT s is printed as such). With --code DIR (repeatable) the worker
runs the ``gpu_worker`` package in DIR instead of this checkout's, one after the
other in the same run (A/B: an older commit unpacked with ``git archive``).

    python bench/bench_preemption.py [--code DIR]... [--rounds N]
                                     [--only hog|slow|clients|chatty]...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgefn_core.errors import WorkerError
from gpu_worker.client import Generation, WorkerClient

CHAT = "smollm2-135m"
CONTEXT, MAX_BATCH, WAIT = 1024, 4, 20
HOGS = 6
NO_END = {0: -100.0, 2: -100.0}  # <|endoftext|>, <|im_end|>
SHORT = [{"role": "user", "content": "Name three colours."}]
LONG = [{"role": "user", "content": "Count to a thousand."}]
CHATTY_CONTEXT, HOG_TOKENS = 4096, 100
BRIEFED = [{"role": "user", "content": "Count to a thousand. "
            + "Here is some context about lighthouses and their keepers. " * 50}]


async def victim(client: WorkerClient, who: str | None = None) -> float | str:
    """Seconds to a whole 16-token answer for client `who`, or what went wrong."""
    started = time.perf_counter()
    gen = await client.generate(CHAT, messages=SHORT, max_tokens=16, temperature=0.0,
                                client=who)
    try:
        await asyncio.wait_for(gen.collect(), WAIT + 30)
    except WorkerError as e:
        return f"{e.code} after {time.perf_counter() - started:.1f} s"
    return time.perf_counter() - started


async def drain(gen: Generation) -> None:
    async for _ in gen:
        pass


async def beside_hog(client: WorkerClient, rounds: int) -> list[float | str]:
    room = CONTEXT - await client.count_tokens(CHAT, messages=LONG)
    hog = await client.generate(CHAT, messages=LONG, max_tokens=room,
                                logit_bias=NO_END, temperature=0.0)
    await anext(hog)
    reader = asyncio.create_task(drain(hog))
    try:
        return [await victim(client) for _ in range(rounds)]
    finally:
        await hog.aclose()
        reader.cancel()


async def beside_clients_hogs(client: WorkerClient, rounds: int) -> list[float | str]:
    room = CONTEXT - await client.count_tokens(CHAT, messages=LONG)
    hogs = [await client.generate(CHAT, messages=LONG, max_tokens=room, client="a",
                                  logit_bias=NO_END, temperature=0.0) for _ in range(HOGS)]
    await anext(hogs[0])
    readers = [asyncio.create_task(drain(hog)) for hog in hogs]
    try:
        return [await victim(client, "b") for _ in range(rounds)]
    finally:
        for hog in hogs:
            await hog.aclose()
        for task in readers:
            task.cancel()


async def beside_slow(client: WorkerClient, rounds: int) -> list[float | str]:
    slow = [await client.generate(CHAT, messages=LONG, max_tokens=200, temperature=0.0,
                                  window=2) for _ in range(MAX_BATCH)]
    for gen in slow:
        await anext(gen)
    try:
        return [await victim(client) for _ in range(rounds)]
    finally:
        for gen in slow:
            await gen.aclose()


def cpu_seconds(pid: int | None) -> float:
    """CPU seconds process `pid` has used (all its threads), or NaN where
    ``/proc`` does not tell."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


async def hogs_beside_chats(client: WorkerClient, chats: bool
                            ) -> tuple[float, float, list[float | str]]:
    """Seconds for client a's MAX_BATCH briefed streams to end, the worker's CPU
    seconds meanwhile, and the times of client b's chats sent one after another
    meanwhile (with `chats`)."""
    started, cpu = time.perf_counter(), cpu_seconds(client.pid)
    hogs = [await client.generate(CHAT, messages=BRIEFED, max_tokens=HOG_TOKENS, client="a",
                                  logit_bias=NO_END, temperature=0.0) for _ in range(MAX_BATCH)]
    for hog in hogs:  # all running before b's first chat: none waits for a slot
        await anext(hog)
    readers = [asyncio.create_task(drain(hog)) for hog in hogs]
    times: list[float | str] = []
    while chats and not all(task.done() for task in readers):
        times.append(await victim(client, "b"))
    await asyncio.gather(*readers)
    return time.perf_counter() - started, cpu_seconds(client.pid) - cpu, times


async def chatty(client: WorkerClient, rounds: int) -> None:
    for chats in (False, True):
        runs = [await hogs_beside_chats(client, chats) for _ in range(rounds)]
        took, cpu = statistics.median(run[0] for run in runs), statistics.median(
            run[1] for run in runs)
        times = [t for run in runs for t in run[2] if isinstance(t, float)]
        print(f"  a's {MAX_BATCH} briefed streams {'beside b' if chats else 'alone'}: "
              f"p50 {took:6.2f} s, worker CPU {cpu:6.2f} s  each: "
              + ", ".join(f"{t:.2f} s/{c:.2f} s" for t, c, _ in runs)
              + (f"; {len(times)} chats of b, p50 {statistics.median(times):.2f} s"
                 if times else ""), flush=True)


def show(label: str, got: list[float | str], alone: float) -> None:
    times = [t for t in got if isinstance(t, float)]
    errors = [t for t in got if isinstance(t, str)]
    p50 = statistics.median(times) if times else float("nan")
    print(f"  {label:<16} p50 {p50:6.2f} s  ({p50 / alone:5.1f}x alone)  "
          f"each: {', '.join(f'{t:.2f}' if isinstance(t, float) else t for t in got)}"
          + (f"  [{len(errors)} failed]" if errors else ""), flush=True)


SCENARIOS = {"hog": ("beside hog", beside_hog), "slow": ("beside slow", beside_slow),
             "clients": (f"beside a's {HOGS}", beside_clients_hogs)}


@contextlib.asynccontextmanager
async def worker(code: str | None, context: int) -> AsyncIterator[WorkerClient]:
    """A worker running the ``gpu_worker`` in `code` (None: this checkout's)."""
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "worker.toml"
        config.write_text(f'[[models]]\nname = "{CHAT}"\nengine = "llamacpp"\n'
                          f"threads = 1\ncontext = {context}\nmax_batch = {MAX_BATCH}\n"
                          f"max_queue_seconds = {WAIT}\n")
        command = [sys.executable, "-m", "gpu_worker", "--socket", f"{tmp}/w.sock",
                   "--config", str(config), "--log-level", "warning"]
        client = WorkerClient(f"{tmp}/w.sock", ["env", "-C", code, *command] if code
                              else command)
        await client.start()
        try:
            await victim(client)  # warm
            yield client
        finally:
            await client.close()


async def run(code: str | None, rounds: int, only: list[str]) -> None:
    if names := [name for name in only if name in SCENARIOS]:
        async with worker(code, CONTEXT) as client:
            alone = statistics.median([t for t in [await victim(client) for _ in range(rounds)]
                                       if isinstance(t, float)])
            print(f"{code or 'this checkout'}: a 16-token chat alone p50 {alone:.2f} s",
                  flush=True)
            for name in names:
                label, scenario = SCENARIOS[name]
                show(label, await scenario(client, rounds), alone)
    if "chatty" in only:
        async with worker(code, CHATTY_CONTEXT) as client:
            print(f"{code or 'this checkout'}, context {CHATTY_CONTEXT}:", flush=True)
            await chatty(client, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", action="append", help="run the worker from this folder")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", action="append", choices=[*sorted(SCENARIOS), "chatty"],
                        help="run this scenario (default: all)")
    args = parser.parse_args()
    for code in args.code or [None]:
        asyncio.run(run(code, args.rounds, args.only or [*SCENARIOS, "chatty"]))


if __name__ == "__main__":
    main()
