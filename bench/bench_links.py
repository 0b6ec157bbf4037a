"""The emulated link's accuracy: the delay it adds against the delay configured.

    python bench/bench_links.py [--n 200]

For each one-way delay (the seeds' client-edge, edge-regional and long-haul
halves), a `Link` in this process relays to an echo server on loopback; a client
sends a line and waits for it back, N times on one kept-alive connection (a round
trip: 2 x delay configured) and N times on a fresh connection (set-up + round trip:
4 x delay). Printed: the error (measured - configured) p50 / p99 in ms, and the
same round trip without the link (the loopback floor) measured in the same run.
No jitter, no loss.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.topology.links import Link, LinksConfig, LinkSpec, Route
from runtime.topology.load import percentile

DELAYS_MS = [2.5, 10.0, 15.0, 50.0, 90.0]


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while line := await reader.readline():
        writer.write(line)
    writer.close()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _times(port: int, n: int, fresh: bool) -> list[float]:
    out = []
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"x\n")  # the set-up, not timed: each fresh connection below times its own
    await reader.readline()
    for _ in range(n):
        t = time.perf_counter()
        if fresh:
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"x\n")
        await reader.readline()
        out.append(time.perf_counter() - t)
    writer.close()
    return out


async def main(n: int) -> None:
    echo_port = _port()
    server = await asyncio.start_server(_echo, "127.0.0.1", echo_port)
    floor = percentile(await _times(echo_port, n, False), 0.5) * 1000
    print(f"loopback round trip without a link: p50 {floor:.3f} ms")
    print(f"{'one-way':>8} {'kept-alive RTT':>15} {'error p50':>10} {'p99':>8}"
          f" {'fresh conn':>11} {'error p50':>10} {'p99':>8}")
    for delay in DELAYS_MS:
        spec = LinkSpec(name="b", port=_port(), routes=[Route(name="e", port=echo_port,
                                                              delay_ms=delay)])
        link = Link(spec, LinksConfig(), random.Random(0))
        await link.start()
        kept = [t * 1000 - 2 * delay for t in await _times(spec.port, n, False)]
        fresh = [t * 1000 - 4 * delay for t in await _times(spec.port, n // 4, True)]
        print(f"{delay:>6.1f}ms {2 * delay:>12.1f} ms {percentile(kept, .5):>+9.2f} "
              f"{percentile(kept, .99):>+8.2f} {4 * delay:>8.1f} ms {percentile(fresh, .5):>+9.2f}"
              f" {percentile(fresh, .99):>+8.2f}")
        assert link.server is not None
        link.server.close()
    server.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200)
    import uvloop

    uvloop.run(main(ap.parse_args().n))
