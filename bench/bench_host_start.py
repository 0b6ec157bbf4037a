"""Time from spawning a Python isolate host to its first isolate READY and warm
(the sandbox included: `runtime.executors.python.sandbox`).

    PYTHONPATH=. python bench/bench_host_start.py [-n 15]

Run from a checkout's root; prints the median and p90 in ms. To see what the
sandbox costs, run it in a checkout without it (before issue 10) alternately.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from edgefn_core.abi import encode_request
from runtime.executors.python.config import HostConfig
from runtime.executors.python.hosts import Host

HELLO = Path.cwd() / "functions" / "examples" / "python-hello"


class Quiet:
    def started(self, isolate: object) -> None: ...
    def finished(self, isolate: object) -> None: ...
    def call(self, isolate: object, msg: object) -> None: ...
    def retiring(self, isolate: object, why: str) -> None: ...


def once(cfg: HostConfig) -> float:
    sample = encode_request(b"GET", b"/", b"", [(b"host", b"bench")], b"", b"")
    t0 = time.perf_counter()
    host = Host(cfg, Quiet(), lambda h, why: None, generation=0, warm_request=sample)  # type: ignore[arg-type]
    host.wait_ready()
    took = time.perf_counter() - t0
    host.stop()
    return took * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=15)
    args = ap.parse_args()
    cfg = HostConfig(name="bench", version="v", function_dir=str(HELLO), module="main",
                     handler="handle", cpu_ms=50, wall_ms=2000, memory_mb=64,
                     recycle_after=10_000, min_isolates=1, max_isolates=1)
    once(cfg)  # warm the page cache
    runs = sorted(once(cfg) for _ in range(args.n))
    print(f"host spawn -> READY+warm, 1 isolate: median {statistics.median(runs):.1f} ms, "
          f"p90 {runs[int(len(runs) * 0.9) - 1]:.1f} ms (n={args.n})")


if __name__ == "__main__":
    main()
