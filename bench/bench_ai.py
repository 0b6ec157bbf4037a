"""Model worker benchmarks: continuous batching, mixed LoRA adapters, TTFT and
IPC overhead. Every figure is printed with its ratio to a baseline measured in
the same run.

    .venv/bin/python bench/bench_ai.py [--tokens 64] [--repeat 3] [--weights f16]
                                       [--threads 2] [--quick] [--no-engine-limit]
                                       [--engine-only] [--gpu-layers N]

The engine limit times raw llama.cpp decode steps on the CPU, or with `--gpu-layers -1`
on a CUDA build's GPU (there EDGEFN_LORA_STACK_FUSE=0 leaves the LoRA stack's four
masked ops unfused, to compare; see .ci/llama-patches/per-seq-lora.patch).

Each load is run `--repeat` times, the configurations taking turns, and the best
run of each is printed: other work on a shared machine only ever slows a run
down, and taking turns spreads it over every configuration alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpu_worker.engines  # noqa: F401  (sets OpenMP's wait, as in the worker, for the header)
from gpu_worker.adapters import write_random_lora
from gpu_worker.client import WorkerClient
from gpu_worker.models import packaged_model

CHAT = "smollm2-135m"
TOPICS = ["a dragon", "the sea", "a robot", "a city", "a forest", "winter", "a train",
          "the moon", "a baker", "a storm", "a garden", "a clock", "a lighthouse", "a cat",
          "a mountain", "a river"]


async def stream(client: WorkerClient, model: str, i: int, tokens: int
                 ) -> tuple[int, float, float]:
    """(completion tokens, seconds to first chunk, seconds in all)."""
    started = time.perf_counter()
    gen = await client.generate(model, messages=[{"role": "user", "content":
                                f"Write a long story about {TOPICS[i % len(TOPICS)]}."}],
                                max_tokens=tokens, temperature=0.8, seed=i)
    first = 0.0
    async for _ in gen:
        if not first:
            first = time.perf_counter() - started
    assert gen.done is not None
    return gen.done.completion_tokens, first, time.perf_counter() - started


async def load(client: WorkerClient, models: list[str], tokens: int
               ) -> tuple[float, list[float]]:
    """Run one stream per entry of `models` at once: (total tokens/s, TTFTs)."""
    started = time.perf_counter()
    results = await asyncio.gather(*(stream(client, m, i, tokens) for i, m in enumerate(models)))
    wall = time.perf_counter() - started
    return sum(r[0] for r in results) / wall, [r[1] for r in results]


async def best_of(client: WorkerClient, configs: list[list[str]], tokens: int, repeat: int
                  ) -> list[tuple[float, list[float]]]:
    """Each configuration's best run (highest tokens/s) of `repeat`, run in turns."""
    best: list[tuple[float, list[float]]] = [(0.0, [])] * len(configs)
    for _ in range(repeat):
        for i, models in enumerate(configs):
            got = await load(client, models, tokens)
            if got[0] > best[i][0]:
                best[i] = got
    return best


def uptime() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def ipc(client: WorkerClient, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await client.ping(b"x" * 64)
        out.append(time.perf_counter() - t)
    return out


async def echo_baseline(path: str, n: int) -> list[float]:
    """Round trips to a bare Unix-socket echo server in another process: what any
    IPC costs here, before framing, msgspec and dispatch."""
    code = ("import asyncio,sys\n"
            "async def h(r,w):\n"
            "    while d := await r.read(65536):\n        w.write(d)\n"
            "async def m():\n"
            f"    s = await asyncio.start_unix_server(h, {path!r})\n"
            "    print('ready', flush=True)\n    await s.serve_forever()\n"
            "asyncio.run(m())\n")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code,
                                                stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    await proc.stdout.readline()
    reader, writer = await asyncio.open_unix_connection(path)
    out = []
    payload = b"x" * 80
    for _ in range(n):
        t = time.perf_counter()
        writer.write(payload)
        await reader.readexactly(len(payload))
        out.append(time.perf_counter() - t)
    writer.close()
    proc.kill()
    await proc.wait()
    return out


def engine_limit(tmp: Path, sweep: list[tuple[str, int]], gpu_layers: int = 0) -> None:
    """Raw llama.cpp decode steps: how a step's cost grows with the batch (the ceiling
    for continuous batching), and what a step of 16 sequences costs with adapters, for
    each (weights, threads) in `sweep`: 8 adapters mixed in one call with per-sequence
    adapters (the patched build), and the floor of llama.cpp's own way (one call per
    adapter present: 8 calls of 2); one adapter for all 16 through the stack and through
    llama.cpp's context-wide LoRA. Each point runs in a child process, so a crash (e.g.
    SIGILL from a CPU variant's kernels) is reported and the sweep goes on."""
    where = "the CPU" if gpu_layers == 0 else f"gpu_layers {gpu_layers}"
    print(f"\n== Engine limit: one llama.cpp decode step (fastest of 15), by batch size, "
          f"on {where} ({uptime()}) ==")
    for i in range(8):
        write_random_lora(packaged_model(), tmp / f"limit{i}.gguf", rank=8, seed=1 + i,
                          std=0.02)
    for weights, threads in sweep:
        label = f"{weights:>5} x{threads}"
        run = subprocess.run([sys.executable, __file__, "--step-costs", weights, str(threads),
                              str(tmp), str(gpu_layers)], capture_output=True, text=True)
        if run.returncode != 0:
            why = (f"signal {-run.returncode} ({signal.Signals(-run.returncode).name})"
                   if run.returncode < 0 else f"exit status {run.returncode}")
            print(f"{label}: crashed, {why}: {run.stderr.strip()[-200:]}")
            continue
        cost = json.loads(run.stdout.splitlines()[-1])
        base = cost["16"]
        print(f"{label}: batch 1 {cost['1'] * 1e3:6.2f} ms, batch 2 {cost['2'] * 1e3:6.2f} ms, "
              f"batch 16 {base * 1e3:6.2f} ms  -> 16 streams {16 * cost['1'] / base:.2f}x one")
        if not cost.get("mixed"):
            print("    adapters: n/a (a stock llama.cpp)")
            continue
        print(f"    x 16 base: 8 adapters mixed, one call {base / cost['mixed']:.2f}; "
              f"8 calls of 2 {base / (8 * cost['2']):.2f}; one adapter, stacked "
              f"{base / cost['one']:.2f}; one adapter, context-wide {base / cost['one-ctx']:.2f}")


def _step_costs(tmp: Path, weights: str, threads: int, gpu_layers: int) -> dict[str, float]:
    """{batch: seconds of its fastest decode step} for batches of 1, 2 and 16, and where
    the build can, 16 sequences: "mixed" on 8 adapters (2 each) in one call, "one" all
    on one adapter of the stack, "one-ctx" on that adapter set on the whole context."""
    import llama_cpp as ll

    from gpu_worker.engines.llama_model import LlamaModel
    from gpu_worker.models import converted

    lm = LlamaModel(converted(packaged_model(), weights), 4096, 16, threads, gpu_layers)
    for i in range(8):
        lm.load_adapter(f"a{i}", str(tmp / f"limit{i}.gguf"))
    prompt = lm.tokenize("A prompt of a few words to fill the cache.")
    cost = {}
    # (key, batch, each sequence's adapter from its number, llama.cpp's own path)
    shapes: list[tuple[str, int, Callable[[int], str | None], bool]] = [
        ("1", 1, lambda s: None, False), ("2", 2, lambda s: None, False),
        ("16", 16, lambda s: None, False)]
    if lm.per_seq:
        shapes += [("mixed", 16, lambda s: f"a{s // 2}", False), ("one", 16, lambda s: "a0", False),
                   ("one-ctx", 16, lambda s: "a0", True)]
    for key, b, adapter, own in shapes:
        for s in range(16):
            lm.forget(s)
        if lm.per_seq:
            lm.use_adapters([(s, None if own else adapter(s), 1.0) for s in range(16)])
        lm.use_adapter(adapter(0) if own else None, 1.0)
        lm.decode([(t, i, s, False) for s in range(b) for i, t in enumerate(prompt)])
        times = []
        for step in range(15):
            pos = len(prompt) + step
            t = time.perf_counter()
            lm.decode([(100, pos, s, True) for s in range(b)])
            ll.llama_synchronize(lm.ctx)  # a GPU's step ends when its kernels do
            times.append(time.perf_counter() - t)
        cost[key] = min(times)  # the step's own cost: other work only adds to it
    lm.close()
    return cost


def worker_config(tmp: Path, weights: str, threads: int) -> str:
    """A worker config serving only the chat model, with these weights and threads."""
    path = tmp / "worker.toml"
    path.write_text(f'[[models]]\nname = "{CHAT}"\nengine = "llamacpp"\n'
                    f'weights = "{weights}"\nthreads = {threads}\n')
    return str(path)


async def main(a: argparse.Namespace) -> None:
    # the LoRA files it writes (16, ~120 MB) go when the run ends, however it ends
    with tempfile.TemporaryDirectory(prefix="edgefn-bench-ai-") as folder:
        await run(a, Path(folder))


async def run(a: argparse.Namespace, tmp: Path) -> None:
    tokens, quick, repeat = a.tokens, a.quick, a.repeat
    print(f"worker: weights {a.weights}, {a.threads} threads (OpenMP: "
          f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}, GOMP_SPINCOUNT "
          f"{os.environ.get('GOMP_SPINCOUNT', 'unset')}); best of {repeat} runs each ({uptime()})")
    client = WorkerClient.spawning(str(tmp / "w.sock"),
                                   worker_config(tmp, a.weights, a.threads))
    await client.start()
    try:
        chat = next(m for m in await client.models() if m["id"] == CHAT)
        print(f"model {CHAT}: device {chat.get('details', {}).get('device', '?')}")
        print("== IPC round trip (Ping over the Unix socket, 2000 sequential) ==")
        n = 500 if quick else 2000
        base = await echo_baseline(str(tmp / "echo.sock"), n)
        ping = await ipc(client, n)
        bp50, pp50 = statistics.median(base), statistics.median(ping)
        print(f"bare echo (no framing)     p50 {bp50 * 1e6:7.1f} us  p99 "
              f"{pct(base, 0.99) * 1e6:7.1f} us")
        print(f"edgefn worker Ping         p50 {pp50 * 1e6:7.1f} us  p99 "
              f"{pct(ping, 0.99) * 1e6:7.1f} us   x bare = {pp50 / bp50:.2f}  "
              f"(target p50 <= 200 us)")

        await load(client, [CHAT], 8)  # warm-up
        print(f"\n== Continuous batching: {tokens} tokens per stream, temperature 0.8 ==")
        counts = (1, 4, 16)
        runs = await best_of(client, [[CHAT] * c for c in counts], tokens, repeat)
        one = runs[0][0]
        print(f"{'streams':>8} {'tokens/s':>10} {'x 1 stream':>11} {'TTFT p50':>10} "
              f"{'TTFT p99':>10}")
        for c, (rate, ttfts) in zip(counts, runs, strict=True):
            print(f"{c:>8} {rate:>10.1f} {rate / one:>11.2f} {pct(ttfts, .5) * 1e3:>8.1f}ms "
                  f"{pct(ttfts, .99) * 1e3:>8.1f}ms")
        m = await client.metrics()
        print(f"worker metrics: busy {m['busy_fraction']:.2f}, peak batch "
              f"{m['running_batch_peak']}, TTFT p50 {m['ttft'].get('p50_ms')} ms, "
              f"inter-token p50 {m['inter_token'].get('p50_ms')} ms")

        print("\n== 16 streams: 8 LoRA adapters mixed in vs base model only ==")
        names = []
        for i in range(8):
            path = tmp / f"lora{i}.gguf"
            write_random_lora(packaged_model(), path, rank=8, seed=100 + i, std=0.02)
            await client.add_lora(f"bench-{i}", str(path))
            names.append(f"bench-{i}")
        mixed = [names[i % 8] for i in range(16)]
        (base_rate, _), (mixed_rate, _), (one_adapter, _) = await best_of(
            client, [[CHAT] * 16, mixed, [names[0]] * 16], tokens, repeat)
        print(f"base only, 16 streams          {base_rate:8.1f} tok/s   x base = 1.00")
        print(f"one adapter, 16 streams        {one_adapter:8.1f} tok/s   x base = "
              f"{one_adapter / base_rate:.2f}")
        print(f"8 adapters mixed, 16 streams   {mixed_rate:8.1f} tok/s   x base = "
              f"{mixed_rate / base_rate:.2f}  (target >= 0.8)")
    finally:
        await client.close()
    if a.engine_limit:
        engine_sweep(a, tmp)
    print(f"({uptime()})")


def engine_sweep(a: argparse.Namespace, tmp: Path) -> None:
    """The engine limit: every weights format and 1 or 2 threads on the CPU; on a GPU
    (--gpu-layers) only --weights."""
    if a.gpu_layers:
        engine_limit(tmp, [(a.weights, a.threads)], a.gpu_layers)
    else:
        engine_limit(tmp, [(w, t) for w in ("as-is", "f16", "q8_0", "q4_0") for t in (1, 2)])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--step-costs"]:  # one point of engine_limit, in its own process
        print(json.dumps(_step_costs(Path(sys.argv[4]), sys.argv[2], int(sys.argv[3]),
                                     int(sys.argv[5]))))
        sys.exit(0)
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--weights", default="f16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-engine-limit", dest="engine_limit", action="store_false",
                    help="skip the decode-step sweep")
    ap.add_argument("--engine-only", action="store_true",
                    help="run only the decode-step sweep, not the worker")
    ap.add_argument("--gpu-layers", type=int, default=0,
                    help="the sweep's layers offloaded (-1: all, on a CUDA build)")
    a = ap.parse_args()
    if a.engine_only:
        with tempfile.TemporaryDirectory(prefix="edgefn-bench-ai-") as folder:
            engine_sweep(a, Path(folder))
        sys.exit(0)
    try:
        import uvloop

        uvloop.run(main(a))
    except ImportError:
        asyncio.run(main(a))
