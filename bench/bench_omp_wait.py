"""What the worker's OpenMP spin (`gpu_worker.engines.BARRIER_SPINS`) buys and costs:
one chat at a time, quiet and beside busy-looping processes, against sleeping at once.

    .venv/bin/python bench/bench_omp_wait.py [--tokens 24] [--chats 6] [--busy 0,1,2]
                                             [--threads 2]

For each number of busy processes (`--busy`), a worker with the spin (the default) and
one with ``OMP_WAIT_POLICY=PASSIVE`` alone (no spin: the baseline) each answer `--chats`
chats of `--tokens` tokens in a row, taking turns (the order flips every round); the
median seconds a chat of each and their ratio are printed. The busy processes are
Python loops started by this script, stopped before it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_ai  # (also sets OpenMP's wait in this process, as the worker does)

from gpu_worker.client import WorkerClient
from gpu_worker.engines import BARRIER_SPINS

# GOMP_SPINCOUNT; None: unset
SETTINGS: dict[str, str | None] = {"spin": str(BARRIER_SPINS), "passive": None}


async def chats(tmp: Path, spins: str | None, a: argparse.Namespace) -> list[float]:
    """Seconds each of `a.chats` chats took, one after another, on a fresh worker whose
    libgomp reads this spin count (the passive policy either way)."""
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # the worker's children inherit these
    if spins is None:
        os.environ.pop("GOMP_SPINCOUNT", None)
    else:
        os.environ["GOMP_SPINCOUNT"] = spins
    client = WorkerClient.spawning(str(tmp / "w.sock"),
                                   bench_ai.worker_config(tmp, "f16", a.threads))
    await client.start()
    try:
        await bench_ai.stream(client, bench_ai.CHAT, 0, 8)  # warm-up
        return [(await bench_ai.stream(client, bench_ai.CHAT, i, a.tokens))[2]
                for i in range(a.chats)]
    finally:
        await client.close()


async def main(a: argparse.Namespace) -> None:
    print(f"one chat at a time, {a.tokens} tokens, {a.chats} in a row, {a.threads} threads; "
          f"median seconds a chat ({bench_ai.uptime()})")
    print(f"{'busy processes':>15} {'spin ' + str(SETTINGS['spin']):>10} {'passive':>10} "
          f"{'spin / passive':>15}")
    with tempfile.TemporaryDirectory(prefix="edgefn-bench-omp-") as folder:
        for n, busy in enumerate(int(b) for b in a.busy.split(",")):
            loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                     for _ in range(busy)]
            try:
                order = list(SETTINGS) if n % 2 == 0 else list(SETTINGS)[::-1]
                got = {name: statistics.median(await chats(Path(folder), SETTINGS[name], a))
                       for name in order}
            finally:
                for p in loops:
                    p.kill()
                    p.wait()
            print(f"{busy:>15} {got['spin']:>10.2f} {got['passive']:>10.2f} "
                  f"{got['spin'] / got['passive']:>15.2f}")
    print(f"({bench_ai.uptime()})")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--chats", type=int, default=6)
    ap.add_argument("--busy", default="0,1,2", help="busy processes, a round each")
    ap.add_argument("--threads", type=int, default=2)
    asyncio.run(main(ap.parse_args()))
