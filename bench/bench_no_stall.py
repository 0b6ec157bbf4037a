"""`/hello` latency while hostile functions run on the same PoP (issue 10, deliverable 4),
and one tenant's ``kv.put`` while another floods slow binding calls.

hello: three phases of SECONDS each on one keep-alive connection: quiet; while
THREAD_SHARE reactors with a 60 s CPU budget spin; while 8 WASI commands sleep
60 s in ``poll_oneoff`` (wall limit 200 ms, re-sent as they time out). Prints
p50/p99/max of `/hello` and its errors per phase, the admin API's worst answer
time, and the p99 ratio against the quiet phase (the target: p99 <= 20 ms, 0 errors).

tenants: tenant b's Python function times its ``kv.put`` calls (one every 20 ms for
SECONDS) while tenant a's functions flood the PoP with slow binding calls from
FLOODERS isolates (more than asyncio's default executor has threads): vector queries
whose filter nothing matches (Python-bound), then 1 MiB puts (fsync-bound, and
LMDB's one writer at a time). Each flood runs twice: "shared", every owner's calls
on asyncio's default executor as before `runtime.bindings.threads`, and "per owner"
(`[stores] binding_threads`). Prints b's put p50/p99 per phase and its ratio to the
quiet phase of the same run.

    python bench/bench_no_stall.py [SECONDS] [--only hello|tenants]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.executors.wasm.engine import THREAD_SHARE
from tests.executors.test_no_stall import sleeper
from tests.support import EXAMPLES, Running, function_dir, pop_thread, python_function, reactor
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


def hello(seconds: float) -> None:
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


# -- tenants: b's kv.put while a floods slow binding calls -------------------------------------
FLOODERS = min(32, (os.cpu_count() or 1) + 4) + 8  # asyncio's default executor + 8
ROWS = 4096  # a's index: searched exactly, and a filter nothing matches reads every row
FLOOD = """import time
from edgefn import Response

def handle(request, env):
    end = time.monotonic() + float(request.query["seconds"])
    value = "x" * (1 << 20)
    while time.monotonic() < end:
        if request.query["op"] == "query":
            env.vectors("docs").query([1.0, 0.0, 0.0, 0.0], k=10, filter={"tag": "none"})
        else:
            env.kv("bulk").put("big", value)
    return Response("ok")
"""
PUTS = """import time
from edgefn import Response

def handle(request, env):
    end, took = time.monotonic() + float(request.query["seconds"]), []
    while time.monotonic() < end:
        started = time.perf_counter()
        env.kv("notes").put("k", "v")
        took.append((time.perf_counter() - started) * 1000)
        time.sleep(0.02)
    return Response.json(took)
"""


class SharedDefault:
    """What `Stores.threads` did before per-owner threads: every owner's blocking calls
    on the loop's default executor, one queue for all."""

    def run(self, owner: str, work: Callable[[], Any]) -> Any:
        return asyncio.to_thread(work)

    def close(self) -> None:
        pass


def deploy_tenants(pop: Running, root: Path) -> None:
    limits = f"cpu_ms = 5000\nwall_ms = 60000\nconcurrency = {FLOODERS}"
    pop.deploy(python_function(
        root, "flood", FLOOD, limits=limits,
        pool=f"min = {FLOODERS}\nmax = {FLOODERS}\nstandby = false",
        extra='owner = "a"\n[bindings]\nvectors = ["docs"]\nkv = ["bulk"]'))
    pop.deploy(python_function(root, "puts", PUTS, limits="cpu_ms = 5000\nwall_ms = 60000",
                               extra='owner = "b"\n[bindings]\nkv = ["notes"]'))
    vectors = pop.pop.stores.vectors
    vectors.create("docs", 4)
    vectors.upsert("docs", [(f"v{i}", [1.0, i / ROWS, 0.0, 1.0], {"tag": "x"})
                            for i in range(ROWS)])


def b_puts(pop: Running, seconds: float, op: str | None) -> list[float]:
    """b's put latencies (ms, sorted) over `seconds`, while FLOODERS of a's requests
    loop on `op` (None: quiet)."""
    floods = [threading.Thread(target=pop.get, args=(
        f"/flood?op={op}&seconds={seconds + 1.5}",), kwargs={"timeout": 120})
        for _ in range(FLOODERS if op else 0)]
    for t in floods:
        t.start()
    time.sleep(1.0 if op else 0)  # a's queue is full
    status, _, body = pop.get(f"/puts?seconds={seconds}", timeout=120)
    for t in floods:
        t.join()
    assert status == 200, body
    return sorted(json.loads(body))


def tenants(seconds: float) -> None:
    print(f"tenant b's kv.put while tenant a floods from {FLOODERS} isolates "
          f"(asyncio's default executor: {min(32, (os.cpu_count() or 1) + 4)} threads)")
    with tempfile.TemporaryDirectory() as tmp, pop_thread(Path(tmp) / "data") as pop:
        deploy_tenants(pop, Path(tmp))
        b_puts(pop, 0.5, None)  # warm
        per_owner = pop.pop.stores.threads
        rows: list[tuple[str, list[float]]] = [("quiet", b_puts(pop, seconds, None))]
        for op, what in (("query", "vectors.query, filtered"), ("put", "kv.put 1 MiB")):
            for mode, threads in (("shared", SharedDefault()), ("per owner", per_owner)):
                pop.pop.stores.threads = threads  # type: ignore[assignment]
                rows.append((f"a: {what}, {mode}", b_puts(pop, seconds, op)))
        pop.pop.stores.threads = per_owner
    base50, base99 = pct(rows[0][1], 50), pct(rows[0][1], 99)
    for name, took in rows:
        p50, p99 = pct(took, 50), pct(took, 99)
        print(f"{name:38} n={len(took):4d} p50={p50:8.2f} ms ({p50 / base50:6.1f}x quiet) "
              f"p99={p99:8.2f} ms ({p99 / base99:6.1f}x quiet)")


def pct(sorted_values: list[float], p: int) -> float:
    return sorted_values[min(len(sorted_values) - 1, len(sorted_values) * p // 100)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("seconds", nargs="?", type=float, default=3.0)
    p.add_argument("--only", choices=["hello", "tenants"])
    args = p.parse_args()
    if args.only != "tenants":
        hello(args.seconds)
    if args.only != "hello":
        tenants(args.seconds)


if __name__ == "__main__":
    main()
