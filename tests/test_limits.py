"""Python function limits end to end: the pool scales up to `pool.max` under
concurrent load and no further, and the wall-time limit stops a pure-Python loop
inside its isolate (the isolate and its host live on)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from tests.support import Running, host_pids, python_function

# Each isolate imports main.py into its own interpreter, so ISOLATE names the isolate.
SLEEPER = """
import os, time
from edgefn import Response

ISOLATE = os.urandom(8).hex()

def handle(request, env):
    began = time.time()
    time.sleep(float(request.query.get("s", "0")))
    return Response(f"{ISOLATE} {os.getpid()} {began} {time.time()}")
"""

POOL_MAX = 3
HOLD = 0.6  # seconds each request keeps its isolate busy


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The largest number of (start, end) spans that overlap at one instant."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = peak = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        now += step
        peak = max(peak, now)
    return peak


# (pool.max, memory_mb): every isolate of the largest pool gets its share under the
# host's address-space cap, at the largest memory_mb too
@pytest.mark.parametrize(("pool_max", "memory_mb"), [(POOL_MAX, 64), (4, 1024)])
def test_the_pool_scales_up_to_pool_max_under_load_and_not_beyond(
        pop: Running, tmp_path: Path, pool_max: int, memory_mb: int) -> None:
    pop.deploy(python_function(tmp_path, "scale", SLEEPER,
                               limits=f"wall_ms = 20000\nmemory_mb = {memory_mb}",
                               pool=f"min = 1\nmax = {pool_max}\nstandby = false"))
    # idle: the one isolate `pool.min` started serves everything
    alone = {pop.get("/scale")[2].split()[0] for _ in range(5)}
    assert len(alone) == 1

    n = 3 * pool_max  # three waves' worth
    results: dict[int, tuple[int, bytes]] = {}

    def call(i: int) -> None:
        status, _, body = pop.get(f"/scale?s={HOLD}", timeout=30)
        results[i] = (status, body)

    began = time.monotonic()
    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - began
    assert [s for s, _ in results.values()] == [200] * n, results  # they waited, none failed
    fields = [body.split() for _, body in results.values()]
    isolates = {f[0] for f in fields}
    spans = [(float(f[2]), float(f[3])) for f in fields]
    assert len(isolates) == pool_max, isolates
    assert alone <= isolates  # the first isolate kept serving; the others joined it
    assert len({f[1] for f in fields}) == 1 == len(host_pids("scale"))  # one host process
    assert most_at_once(spans) == pool_max
    assert took >= (n // pool_max) * HOLD * 0.95, "more requests ran at once than pool.max"


LOOP = """
import os
from edgefn import Response

SERVED = 0

def handle(request, env):
    global SERVED
    SERVED += 1
    if request.query.get("loop"):
        n = 0
        while True:
            n += 1
    return Response(f"{os.getpid()} {SERVED}")
"""

WALL_MS = 500


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


def test_the_wall_limit_stops_a_pure_python_loop_inside_the_isolate(
        pop: Running, tmp_path: Path) -> None:
    # cpu_ms far above wall_ms: only the wall limit can stop the loop
    deployed = pop.deploy(python_function(tmp_path, "loop", LOOP,
                                          limits=f"cpu_ms = 60000\nwall_ms = {WALL_MS}"))
    status, _, body = pop.get("/loop")
    assert status == 200
    pid = int(body.split()[0])

    sent = time.monotonic()
    status, headers, body = pop.get("/loop?loop=1", timeout=30)
    took = time.monotonic() - sent
    assert (status, headers["x-edgefn-error"]) == (504, "wall_limit"), body
    assert json.loads(body) == {"error": {
        "kind": "wall_limit", "function": "loop", "version": deployed["version"],
        "message": f"function 'loop' exceeded its wall-time limit of {WALL_MS} ms"}}
    wall = WALL_MS / 1000
    # the watchdog looks every quarter of the limit (at most 100 ms)
    assert wall <= took < wall * 1.6, f"answered after {took:.3f}s for wall_ms = {WALL_MS}"

    # The loop was stopped in the isolate, not abandoned: the host burns no more CPU...
    before = cpu_seconds(pid)
    time.sleep(0.5)
    assert cpu_seconds(pid) - before < 0.1, "the loop is still running"
    # ...and the same interpreter in the same process serves the next request at once
    sent = time.monotonic()
    assert pop.get("/loop")[2] == f"{pid} 3".encode()
    assert time.monotonic() - sent < wall / 2
    assert host_pids("loop") == {pid}


def test_the_cpu_limit_stops_a_pure_python_loop_and_the_error_names_the_limit(
        pop: Running, tmp_path: Path) -> None:
    deployed = pop.deploy(python_function(tmp_path, "spin", LOOP,
                                          limits="cpu_ms = 50\nwall_ms = 20000"))
    pid = int(pop.get("/spin")[2].split()[0])
    status, headers, body = pop.get("/spin?loop=1", timeout=30)
    assert (status, headers["x-edgefn-error"]) == (503, "cpu_limit"), body
    assert json.loads(body) == {"error": {
        "kind": "cpu_limit", "function": "spin", "version": deployed["version"],
        "message": "function 'spin' exceeded its CPU limit of 50 ms"}}
    assert pop.get("/spin")[2] == f"{pid} 3".encode()  # the same interpreter serves on
