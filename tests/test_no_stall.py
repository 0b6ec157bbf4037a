"""No function stalls the PoP, end to end over loopback: `/hello` keeps its p99 under
20 ms with 0 errors while reactors with a 60 s CPU budget spin, the admin API answers
while the public loop is blocked outright, and a function past `limits.concurrency`
is refused at once with 503 and Retry-After while others keep answering."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.executors.wasm.engine import THREAD_SHARE
from runtime.executors.wasm.function import INLINE_SLICE_MS, WasmFunction
from tests.executors.test_no_stall import sleeper
from tests.support import EXAMPLES, Running, function_dir, pop_thread, reactor

P99_MS = 20  # the target for other functions during any hostile one
ADMIN_MS = 50  # an admin call while they spin, less what the OS made its threads wait


@pytest.fixture
def pop(tmp_path: Path) -> Iterator[Running]:
    with pop_thread(tmp_path / "data") as running:
        running.deploy(EXAMPLES / "hello-wat")
        yield running


def get_in_thread(pop: Running, path: str, out: list[tuple[int, dict[str, str]]],
                  timeout: float = 30) -> threading.Thread:
    def go() -> None:
        status, headers, _ = pop.get(path, timeout=timeout)
        out.append((status, headers))
    t = threading.Thread(target=go)
    t.start()
    return t


def hello_latencies(pop: Running, seconds: float) -> tuple[list[float], list[int]]:
    """Sequential `/hello` requests on one keep-alive connection for `seconds`:
    their latencies (ms) and the statuses that were not 200."""
    conn = http.client.HTTPConnection(pop.host, pop.port, timeout=5)
    latencies, errors = [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.perf_counter()
        conn.request("GET", "/hello")
        resp = conn.getresponse()
        body = resp.read()
        latencies.append((time.perf_counter() - started) * 1000)
        if resp.status != 200 or not body.startswith(b"Hello"):
            errors.append(resp.status)
    conn.close()
    return latencies, errors


def p99(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.99)]


def runqueue_ms(tids: list[int]) -> float:
    """How long (ms) the threads `tids` have waited on a run queue for a CPU, from
    Linux's schedstat (its second field); 0 where the kernel does not keep it. That
    wait is the OS's: a thread that waits on the GIL or on a lock sleeps instead."""
    total = 0
    for tid in tids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[1])
    return total / 1e6


def admin_call_ms(pop: Running) -> tuple[float, float]:
    """An admin listing's latency (ms), and that less the time its two threads (the
    admin API's and this caller's) waited for a CPU meanwhile: on a loaded 2-core
    machine the spinning guests' threads and other processes' share the cores, and a
    runnable thread waited 0.1-0.4 s for one (tests/test_no_stall.py's own spinners
    plus load 7-9) with no lock or GIL held against it. A thread's wait is counted
    when it gets the CPU, so one that began just before the call can make the
    difference slightly negative; a thread waiting for the GIL sleeps and is not
    discounted (a guest run holding it made this 2994 ms of 3004)."""
    tids = [t.native_id for t in threading.enumerate()
            if t.name == "edgefn-admin" and t.native_id is not None]
    tids.append(threading.get_native_id())
    waited, started = runqueue_ms(tids), time.perf_counter()
    listing = pop.admin.request("GET", "/v1/functions")
    took = (time.perf_counter() - started) * 1000
    assert {f["name"] for f in listing["functions"]} == {"hello", "spin"}
    return took, took - (runqueue_ms(tids) - waited)


def test_hello_p99_stays_under_20ms_while_60s_budget_reactors_spin(pop: Running,
                                                                    tmp_path: Path) -> None:
    pop.deploy(function_dir(tmp_path, "spin", reactor("(loop $l (br $l))"),
                            limits="cpu_ms = 60000\nwall_ms = 3000"))
    spins: list[tuple[int, dict[str, str]]] = []
    threads = [get_in_thread(pop, "/spin", spins) for _ in range(THREAD_SHARE)]
    time.sleep(0.05)
    # the admin API answers too, and fast, while they spin: nothing of the PoP (the
    # GIL, its loop) makes it wait on them; only the OS's scheduling may
    admin_ms = [admin_call_ms(pop) for _ in range(5)]
    latencies, errors = hello_latencies(pop, 2.0)
    for t in threads:
        t.join()
    assert errors == []
    assert len(latencies) > 200, len(latencies)
    assert p99(latencies) <= P99_MS, (p99(latencies), max(latencies))
    assert max(own for _, own in admin_ms) < ADMIN_MS, admin_ms
    # each spin ran to its own limit, on a worker thread: the 3 s wall time
    assert [(s, h["x-edgefn-error"]) for s, h in spins] == [(504, "wall_limit")] * THREAD_SHARE


@pytest.mark.parametrize("lane", ["auto", "off"])
def test_a_reactor_cut_at_the_slice_runs_inline_twice_then_on_a_thread(
        tmp_path: Path, lane: str) -> None:
    """The rule is the same whichever path parses the request: the native lane's
    inline run is the first of the two (it ran three times inline, 15 ms of the
    loop: 18.6 ms longest loop lag against 12.6 without the lane)."""
    # spins on a long request only: the deploy's warm-up (a short GET) keeps it inline
    spin = reactor("(if (i32.gt_u (local.get $n) (i32.const 300)) (then (loop $l (br $l))))")
    lane_setting: dict[str, Any] = {"http.native_lane": lane}
    with pop_thread(tmp_path / "data", **lane_setting) as pop:
        pop.deploy(function_dir(tmp_path, "spin", spin,
                                limits="cpu_ms = 60000\nwall_ms = 300"))
        assert (pop.pop.lane is not None) == (lane == "auto")
        executor = pop.pop.registry.functions["spin"].executor
        assert isinstance(executor, WasmFunction) and not executor.threaded

        def runs() -> int:
            return sum(executor.instantiate_times.snapshot()[1])

        before = runs()
        status, headers, _ = pop.get("/spin?" + "x" * 400)
        assert (status, headers["x-edgefn-error"]) == (504, "wall_limit")
        assert runs() - before == 3  # inline twice, cut at the slice; once on a thread
        assert executor.threaded and not executor.lane_cut


def test_requests_to_a_reactor_awaiting_its_verdict_skip_the_loop(tmp_path: Path) -> None:
    """40 requests at once to a reactor cut at the slice: while the first one's run on a
    thread says whether it needs the threads, the others go there too. Each took two
    slices of the loop: 175-190 ms of its CPU (load 7), 400-485 ms of lag; now ~21."""
    spin = reactor("(if (i32.gt_u (local.get $n) (i32.const 300)) (then (loop $l (br $l))))")
    with pop_thread(tmp_path / "data") as pop:
        pop.deploy(function_dir(tmp_path, "spin", spin,
                                limits="cpu_ms = 60000\nwall_ms = 1000\nconcurrency = 64"))
        assert pop.loop is not None
        tid = asyncio.run_coroutine_threadsafe(_native_id(), pop.loop).result()
        socks = [socket.create_connection((pop.host, pop.port)) for _ in range(40)]
        # ~20 ms alone. A full collection of the whole suite's heap, on whichever thread
        # trips it, is not the PoP's (122-129 ms in full runs were logging's: cli/logs.py)
        gc.collect()
        gc.disable()
        try:
            cpu = _cpu_ms(tid)
            for s in socks:
                s.sendall(f"GET /spin?{'x' * 400} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
            answers = [s.recv(4096) for s in socks]
            used = _cpu_ms(tid) - cpu
        finally:
            gc.enable()
        for s in socks:
            s.close()
    assert {a[:12] for a in answers} == {b"HTTP/1.1 504"}, {a[:12] for a in answers}
    # two slices, then the parsing and waiting of 40 requests: 300+ when each took two
    assert used < 4 * INLINE_SLICE_MS + 40, used


async def _native_id() -> int:
    return threading.get_native_id()


def _cpu_ms(tid: int) -> float:
    """The CPU time (ms) thread `tid` of this process has run (schedstat's first field)."""
    return int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0]) / 1e6


def test_the_admin_api_answers_while_the_public_loop_is_blocked(pop: Running) -> None:
    assert pop.loop is not None
    pop.loop.call_soon_threadsafe(time.sleep, 1.5)  # stands for any stall of that loop
    time.sleep(0.05)
    hello: list[tuple[int, dict[str, str]]] = []
    blocked = get_in_thread(pop, "/hello", hello)
    started = time.perf_counter()
    listing = pop.admin.request("GET", "/v1/functions")
    took = time.perf_counter() - started
    assert [f["name"] for f in listing["functions"]] == ["hello"]
    assert took < 0.1, took  # the public loop sleeps for 1.5 s meanwhile
    assert hello == []  # ... as this public request shows: it has no answer yet
    blocked.join()
    assert hello[0][0] == 200


def test_a_function_past_its_concurrency_limit_gets_503_with_retry_after(
        pop: Running, tmp_path: Path) -> None:
    pop.deploy(function_dir(tmp_path, "nap", sleeper(500 * 10**6), entry="main.wat",
                            limits="cpu_ms = 2000\nconcurrency = 2"))
    naps: list[tuple[int, dict[str, str]]] = []
    threads = [get_in_thread(pop, "/nap", naps) for _ in range(2)]
    time.sleep(0.2)  # both are asleep in the function now
    started = time.perf_counter()
    status, headers, body = pop.get("/nap")
    refused_in = time.perf_counter() - started
    assert (status, headers["x-edgefn-error"], headers["retry-after"]) == (
        503, "concurrency_limit", "1")
    assert json.loads(body)["error"]["message"] == (
        "function 'nap' has 2 requests in flight, its limit (limits.concurrency = 2)")
    assert refused_in < 0.1, refused_in  # refused at once, not queued
    assert pop.get("/hello")[0] == 200  # others are not limited by it
    for t in threads:
        t.join()
    assert [s for s, _ in naps] == [200, 200]
    assert pop.get("/nap")[0] == 200  # the two that ended gave their places back
