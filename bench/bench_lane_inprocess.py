"""The PoP's own CPU per request on the native lane, without sockets or a load
generator: a real PoP (its public server's connections, its lane, its stages,
real wasmtime) fed whole requests through `HttpProtocol.data_received` on
`--connections` connections whose transport only keeps what is written, as a
loop iteration of a loaded PoP reads them; then one turn of the loop (the
responses' flush, the lane's drain: events, metrics, access log). Sub-microsecond
changes to the front, the lane or the drain show here (the access log's lines are
made and written to /dev/null); over loopback, the kernel's
share (several microseconds a request, and varying with the machine's load) hides them.

    python bench/bench_lane_inprocess.py [--n 200000] [--rounds 5] [--connections 18]
                                         [--function functions/examples/hello-wat]
                                         [--path /hello]

Prints, per round, CPU microseconds per request of this process (its thread CPU
clock) and the best and median over the rounds. The responses are checked: each
request must get one 200 whose body the function wrote.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime import config  # noqa: E402
from runtime.admin.client import AdminClient  # noqa: E402
from runtime.app import running_pop  # noqa: E402
from runtime.net.protocol import HttpProtocol  # noqa: E402
from runtime.pipeline.stages.access_log import AccessLog  # noqa: E402


class CountingTransport(asyncio.Transport):
    """A connection's transport that keeps what is written until `count` reads it."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port
        self.written: list[bytes | bytearray | memoryview] = []
        self.responses = 0
        self.last = b""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(data)

    def count(self) -> int:
        """The 200s written so far (read outside the timed loop)."""
        for data in self.written:
            self.responses += bytes(data).count(b"HTTP/1.1 200 OK\r\n")
            self.last = bytes(data)
        self.written.clear()
        return self.responses

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", self.port), "sockname": ("127.0.0.1", 8080)}.get(
            name, default)

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None
                                ) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        overrides: dict[str, Any] = {"public.port": 0, "ai.enabled": False}
        cfg = config.load(None, data=tmp, **overrides)
        async with running_pop(cfg) as (pop, public, _admin):
            await asyncio.to_thread(AdminClient(Path(tmp)).deploy, Path(args.function))
            devnull = open(os.devnull, "wb")  # noqa: SIM115 (closed below)
            for observer in pop.observers:  # the access log's lines written, to nowhere
                if isinstance(observer, AccessLog):
                    observer.stream = devnull
            state = public.state
            assert state is not None
            conns = []
            for i in range(args.connections):
                proto = HttpProtocol(public.app, state)
                transport = CountingTransport(40000 + i)
                proto.connection_made(transport)
                conns.append((proto, transport))
            request = (f"GET {args.path} HTTP/1.1\r\nHost: localhost\r\n"
                       f"User-Agent: bench\r\n\r\n").encode()
            per_turn = len(conns)
            turns = max(1, args.n // per_turn)
            results, total = [], 0
            for r in range(args.rounds + 1):  # the first round warms up
                started = time.thread_time()
                for _ in range(turns):
                    for proto, _t in conns:
                        proto.data_received(request)
                    await asyncio.sleep(0)  # the flush and the drain: the loop's turn
                took = time.thread_time() - started
                total += turns * per_turn
                answered = sum(t.count() for _, t in conns)
                if answered != total:  # each request one 200, none left waiting
                    raise RuntimeError(f"{answered} 200s to {total} requests; the last "
                                       f"write: {conns[0][1].last[:300]!r}")
                if r:
                    results.append(took / (turns * per_turn) * 1e6)
                    print(f"round {r}: {results[-1]:.2f} us CPU per request "
                          f"({turns * per_turn} requests, {per_turn} per loop turn)",
                          flush=True)
            for proto, _t in conns:
                proto.connection_lost(None)
            devnull.close()
    print(f"\n== {args.path} ({Path(args.function).name}), in process, "
          f"{args.connections} connections ==")
    print(f"CPU us per request: best {min(results):.2f}, median "
          f"{statistics.median(results):.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--connections", type=int, default=18)
    p.add_argument("--function", default=str(ROOT / "functions" / "examples" / "hello-wat"))
    p.add_argument("--path", default="/hello")
    uvloop.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
