"""Short requests mixed with slow ones on one Python function: what packing costs
the short ones' latency when some requests of the same function run long.

    python bench/bench_python_mix.py [--pool KEY=VALUE,...]... [--slow-every 50]
                                     [--slow-ms 20] [--connections 16] [--seconds 5]
                                     [--rounds 2] [--rate REQ_PER_S]

A PoP (`edgefn serve`) with a Python function whose handler answers at once, or
sleeps `--slow-ms` when asked (`?slow=1`). A load generator in this process keeps
`--connections` keep-alive connections busy (one request at a time each); every
`--slow-every`th request is a slow one. Printed for each [pool] variant (the
defaults first: ``pipeline = "auto"``), in alternating rounds, medians: req/s, the
short requests' p50 / p99 / max latency, and each figure's ratio to the first
variant (of the medians, and paired within each round: `_variants.paired`), and how
many slow requests are in flight on average (when that reaches
the pool's max, every isolate sleeps and short requests wait whatever the
scheduler does). A short request packed behind a slow one waits until it is taken
back (within ~2 ms with "auto"); with ``pipeline = 0`` none ever waits behind one.

Closed loop (the default): each connection sends its next request once the last is
answered, so a variant that answers faster is also sent more slow requests. `--rate
R`: open loop, R requests a second in all at fixed times, each on a connection that
is free (up to `--connections`); a request's latency runs from the time it was due,
so one that waited for a free connection counts that wait. Variants then see the
same load; past what one can serve, its latencies grow without bound (and the
req/s printed falls short of R).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import _variants  # noqa: E402
import bench_runtime  # noqa: E402

from runtime.admin.client import AdminClient  # noqa: E402

HANDLER = """
import time
from edgefn import Response

def handle(request, env):
    if request.query.get("slow"):
        time.sleep(float(request.query["slow"]) / 1000)
    return Response("ok")
"""


def function(work: Path, pool: str) -> Path:
    d = work / "mix"
    d.mkdir()
    (d / "main.py").write_text(HANDLER)
    table = "".join(f"{k.strip()} = {v.strip()}\n"
                    for k, v in (item.split("=", 1) for item in pool.split(",") if item))
    (d / "edgefn.toml").write_text('name = "mix"\nruntime = "python"\nentry = "main.py"\n'
                                   'routes = ["/mix"]\n[limits]\nwall_ms = 5000\n'
                                   f"[pool]\n{table}")
    return d


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                   path: str) -> None:
    """GET `path` on a keep-alive connection and read the whole answer. Raises
    RuntimeError when it is not a 200."""
    writer.write(f"GET {path} HTTP/1.1\r\nhost: b\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"got {head[:40]!r}")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    await reader.readexactly(length)


async def load(port: int, connections: int, seconds: float, slow_every: int,
               slow_ms: int) -> tuple[int, list[float]]:
    """Requests answered, and each short request's latency (seconds)."""
    count = issued = 0
    short: list[float] = []
    end = time.monotonic() + seconds

    async def connection() -> None:
        nonlocal count, issued
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.monotonic() < end:
                # one count for all connections: every slow_every-th request sent is slow,
                # whichever connection sends it (a count per connection made only a few
                # connections send slow ones, whatever slow_every said)
                issued += 1
                slow = issued % slow_every == 0
                sent = time.monotonic()
                await exchange(reader, writer, f"/mix?slow={slow_ms}" if slow else "/mix")
                if not slow:
                    short.append(time.monotonic() - sent)
                count += 1
        finally:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(connections)))
    return count, short


async def load_at(port: int, connections: int, seconds: float, slow_every: int,
                  slow_ms: int, rate: float) -> tuple[int, list[float]]:
    """`load` open-loop: `rate` requests a second, each due at a fixed time and sent
    on a free connection (waiting for one when all are busy, which its latency
    counts); requests answered, each short request's latency from when it was due."""
    free: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for _ in range(connections):
        free.put_nowait(await asyncio.open_connection("127.0.0.1", port))
    count = 0
    short: list[float] = []
    running: set[asyncio.Task[None]] = set()

    async def one(n: int, due: float) -> None:
        nonlocal count
        reader, writer = await free.get()
        slow = n % slow_every == 0
        await exchange(reader, writer, f"/mix?slow={slow_ms}" if slow else "/mix")
        if not slow:
            short.append(time.monotonic() - due)
        count += 1
        free.put_nowait((reader, writer))

    start = time.monotonic()
    n = 0
    while (due := start + n / rate) < start + seconds:
        if due > time.monotonic():
            await asyncio.sleep(due - time.monotonic())
        n += 1
        task = asyncio.create_task(one(n, due))
        running.add(task)
        task.add_done_callback(running.discard)
    await asyncio.gather(*running)
    while not free.empty():
        free.get_nowait()[1].close()
    return count, short


def one_round(pool: str, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        proc, port = bench_runtime.start_edgefn(data)
        try:
            AdminClient(data).deploy(function(Path(tmp), pool))
            asyncio.run(load(port, args.connections, 1, args.slow_every, args.slow_ms))
            t0 = time.monotonic()
            if args.rate:
                count, short = asyncio.run(load_at(port, args.connections, args.seconds,
                                                   args.slow_every, args.slow_ms, args.rate))
            else:
                count, short = asyncio.run(load(port, args.connections, args.seconds,
                                                args.slow_every, args.slow_ms))
            wall = time.monotonic() - t0
        finally:
            proc.terminate()
            proc.wait(20)
    short.sort()
    return {"rps": count / wall, "p50": short[len(short) // 2] * 1e3,
            "p99": short[int(len(short) * 0.99)] * 1e3, "max": short[-1] * 1e3}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--pool", action="append", help='[pool] keys, "pipeline=0" (more than once: '
                   'variants; "": the defaults)')
    p.add_argument("--slow-every", type=int, default=50)
    p.add_argument("--slow-ms", type=int, default=20)
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--rate", type=float, help="open loop: requests a second in all (default: "
                   "closed loop, each connection sends its next once answered)")
    args = p.parse_args()
    variants = args.pool or ["", "pipeline=0"]

    def report(n: int, pool: str, r: dict[str, float]) -> None:
        print(f"round {n} [{pool or 'defaults'}]: {r['rps']:.0f} req/s, short p50 "
              f"{r['p50']:.2f} ms, p99 {r['p99']:.2f} ms, max {r['max']:.1f} ms", flush=True)

    results = _variants.alternate(variants, args.rounds, lambda pool: one_round(pool, args),
                                  report)
    offered = f"open loop at {args.rate:g} req/s, up to " if args.rate else ""
    print(f"\n== one request in {args.slow_every} sleeps {args.slow_ms} ms; {offered}"
          f"{args.connections} connections, {args.seconds:g} s, medians of {args.rounds} rounds "
          f"(x: to the first) ==")
    print(f"{'[pool]':<28}{'req/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}"
          f"{'x req/s':>9}{'x p50':>7}{'x p99':>7}{'slow held':>11}")
    for pool, m, x in _variants.medians(results, ("rps", "p50", "p99", "max")):
        held = m["rps"] / args.slow_every * args.slow_ms / 1000
        print(f"{pool or 'defaults (auto)':<28}{m['rps']:>8.0f}{m['p50']:>8.2f}{m['p99']:>8.2f}"
              f"{m['max']:>8.1f}{x['rps']:>9.2f}{x['p50']:>7.2f}{x['p99']:>7.2f}{held:>11.1f}")
    print("(slow held: slow requests in flight on average, req/s / slow-every x slow-ms; at "
          "pool.max = 4 or more of them every isolate sleeps)")
    _variants.print_paired(results, {"req/s": "rps", "p50": "p50", "p99": "p99"},
                           lambda pool: f"[{pool or 'defaults (auto)'}]")
    print(f"(load average {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
