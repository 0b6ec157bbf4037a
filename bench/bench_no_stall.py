"""`/hello` latency while hostile functions run on the same PoP (issue 10, deliverable 4).

Three phases of SECONDS each on one keep-alive connection: quiet; while
THREAD_SHARE reactors with a 60 s CPU budget spin; while 8 WASI commands sleep
60 s in ``poll_oneoff`` (wall limit 200 ms, re-sent as they time out). Prints
p50/p99/max of `/hello` and its errors per phase, the admin API's worst answer
time, and the p99 ratio against the quiet phase (the target: p99 <= 20 ms, 0 errors).

    python bench/bench_no_stall.py [SECONDS]
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.executors.wasm.engine import THREAD_SHARE
from tests.executors.test_no_stall import sleeper
from tests.support import EXAMPLES, Running, function_dir, pop_thread, reactor
from tests.test_no_stall import hello_latencies


def hammer(pop: Running, path: str, n: int, stop: threading.Event) -> list[threading.Thread]:
    def go() -> None:
        while not stop.is_set():
            pop.get(path, timeout=30)
    threads = [threading.Thread(target=go, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def phase(pop: Running, name: str, seconds: float, path: str | None, n: int) -> float:
    stop = threading.Event()
    threads = hammer(pop, path, n, stop) if path else []
    time.sleep(0.1 if path else 0)
    admin = []
    for _ in range(5):
        started = time.perf_counter()
        pop.admin.request("GET", "/v1/functions")
        admin.append((time.perf_counter() - started) * 1000)
    lat, errors = hello_latencies(pop, seconds)
    stop.set()
    for t in threads:
        t.join()
    lat.sort()
    p99 = lat[int(len(lat) * 0.99)]
    print(f"{name:28} n={len(lat):6d} p50={lat[len(lat) // 2]:6.2f} ms p99={p99:6.2f} ms "
          f"max={lat[-1]:7.2f} ms errors={len(errors)} admin max={max(admin):6.2f} ms")
    return p99


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    with tempfile.TemporaryDirectory() as tmp, pop_thread(Path(tmp) / "data") as pop:
        pop.deploy(EXAMPLES / "hello-wat")
        pop.deploy(function_dir(Path(tmp), "spin", reactor("(loop $l (br $l))"),
                                limits="cpu_ms = 60000\nwall_ms = 3000"))
        pop.deploy(function_dir(Path(tmp), "sleepy", sleeper(60 * 10**9),
                                limits="cpu_ms = 60000\nwall_ms = 200"))
        quiet = phase(pop, "quiet", seconds, None, 0)
        spin = phase(pop, f"{THREAD_SHARE} x 60 s-budget spin", seconds, "/spin", THREAD_SHARE)
        sleepy = phase(pop, "8 x WASI sleep(60 s)", seconds, "/sleepy", 8)
        print(f"p99 ratio vs quiet: spin {spin / quiet:.2f}x, sleep {sleepy / quiet:.2f}x")


if __name__ == "__main__":
    main()
