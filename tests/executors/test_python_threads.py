"""Threads a Python function starts may not outlive its request: once the response
is sent they are stopped (work after it would run outside every limit), and one
that cannot be stopped (blocked in C code) costs a recycle, never the function."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.support import Running, host_pids, python_function

SPINNER = """
import threading
from edgefn import Response

def spin():
    while True:
        pass

def handle(request, env):
    threading.Thread(target=spin, name="spinner").start()
    return Response("started")
"""

SLEEPER = """
import os, threading, time
from edgefn import Response

def handle(request, env):
    threading.Thread(target=time.sleep, args=(3600,), name="sleeper").start()
    return Response(str(os.getpid()))
"""

TO_THREAD = """
import asyncio, os
from edgefn import Response

async def handle(request, env):
    pid = await asyncio.to_thread(os.getpid)
    return Response(str(pid))
"""


LEFT_TASK = """
import asyncio, time
from edgefn import Response

TASKS = set()
SEEN = []

async def spin_later():
    await asyncio.sleep(0.01)
    started = time.thread_time()
    while time.thread_time() - started < 0.5:
        pass

async def record_later():
    try:
        await asyncio.sleep(0.02)
        SEEN.append("ran on")
    finally:
        SEEN.append("ended")

async def handle(request, env):
    if request.query.get("t") == "spin":
        TASKS.add(asyncio.create_task(spin_later()))
        return Response("started")
    if request.query.get("t") == "record":
        TASKS.add(asyncio.create_task(record_later()))
        return Response("started")
    await asyncio.sleep(0.05)
    return Response(",".join(SEEN) or "-")
"""


def test_an_asyncio_task_left_pending_is_cancelled_when_its_request_ends(
        pop: Running, tmp_path: Path) -> None:
    """A task one request left ran during the next one's awaits: that request, which
    spun nothing, got a 503 `cpu_limit` (3 times in 3); and a task saw (and wrote)
    what the next request held."""
    pop.deploy(python_function(tmp_path, "asy", LEFT_TASK, limits="cpu_ms = 100",
                               pool="min = 1\nmax = 1\nstandby = false"))
    for _ in range(3):
        assert pop.get("/asy?t=spin")[::2] == (200, b"started")
        assert pop.get("/asy")[::2] == (200, b"-")
    assert pop.get("/asy?t=record")[::2] == (200, b"started")
    assert pop.get("/asy")[::2] == (200, b"ended")  # cancelled: its finally ran, not its work


def cpu_seconds(pid: int) -> float:
    """utime + stime of process `pid`, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_thread_left_spinning_is_stopped_after_the_response(pop: Running,
                                                               tmp_path: Path) -> None:
    pool = "min = 1\nmax = 1\nrecycle_after = 2\nstandby = false"
    pop.deploy(python_function(tmp_path, "spinner", SPINNER, pool=pool))
    for _ in range(5):  # two recycles: each interpreter closes, no thread holds it open
        began = time.monotonic()
        status, _, body = pop.get("/spinner")
        assert (status, body) == (200, b"started")
        assert time.monotonic() - began < 2.5  # the wall limit is 5 s: nothing waited for it
    (host,) = host_pids("spinner")
    before = cpu_seconds(host)
    time.sleep(1.0)
    # a spinner still running would burn most of a core meanwhile (the host idles)
    assert cpu_seconds(host) - before < 0.3


def test_a_thread_blocked_in_c_costs_a_recycle_and_a_new_host(pop: Running,
                                                              tmp_path: Path) -> None:
    pop.deploy(python_function(tmp_path, "sleeper", SLEEPER,
                               pool="min = 1\nmax = 1\nstandby = false"))
    pids = []
    for _ in range(6):
        status, _, body = pop.get("/sleeper")
        assert status == 200, body
        pids.append(int(body))
    # its interpreter cannot close while `sleeper` sleeps: the host asks to be replaced
    assert len(set(pids)) >= 2, pids
    deadline = time.monotonic() + 10
    while pids[0] in host_pids("sleeper") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pids[0] not in host_pids("sleeper")


def test_an_async_handler_may_use_threads_for_its_own_work(pop: Running,
                                                           tmp_path: Path) -> None:
    pop.deploy(python_function(tmp_path, "to-thread", TO_THREAD,
                               pool="min = 1\nmax = 1\nstandby = false"))
    bodies = {pop.get("/to-thread")[2] for _ in range(5)}
    assert len(bodies) == 1  # one host served them all: nothing had to be replaced


RAW = """
import _thread, threading
from edgefn import Response

def spin():
    while True:
        pass

def handle(request, env):
    out = []
    for start in (lambda: _thread.start_new_thread(spin, ()),
                  lambda: _thread.start_joinable_thread(spin)):
        try:
            start()
            out.append("started")
        except RuntimeError as e:
            out.append(str(e))
    return Response("\\n".join(out))
"""


def test_a_thread_the_reaper_cannot_see_is_refused(pop: Running, tmp_path: Path) -> None:
    """Threads started with `_thread` are no `threading.Thread`: 16 of them burned the
    host's CPU for good after their request was answered."""
    pop.deploy(python_function(tmp_path, "raw", RAW, pool="min = 1\nmax = 1\nstandby = false"))
    status, _, body = pop.get("/raw")
    assert status == 200 and body.decode().splitlines() == [
        "a function starts threads with threading.Thread (each must end before its request "
        "does); _thread is not available"] * 2
    (host,) = host_pids("raw")
    before = cpu_seconds(host)
    time.sleep(1.0)
    assert cpu_seconds(host) - before < 0.3


HIDDEN = """
import threading
from edgefn import Response

def spin():
    while True:
        pass

class Unlisted(threading.Thread):
    def _bootstrap_inner(self):  # never enters threading's registry
        self._started.set()
        self.run()

def handle(request, env):
    t = threading.Thread(target=spin)
    t.start()
    threading._active.pop(t.ident)  # out of threading.enumerate()
    Unlisted(target=spin).start()
    return Response(str(threading.active_count()))
"""


def test_a_thread_taken_out_of_threadings_registry_is_stopped_all_the_same(
        pop: Running, tmp_path: Path) -> None:
    """The reaper listed `threading.enumerate()`, which the function may edit."""
    pop.deploy(python_function(tmp_path, "hidden", HIDDEN,
                               pool="min = 1\nmax = 1\nstandby = false"))
    status, _, body = pop.get("/hidden")
    assert status == 200, body
    (host,) = host_pids("hidden")
    time.sleep(0.5)  # the reaper's grace
    before = cpu_seconds(host)
    time.sleep(1.0)
    assert cpu_seconds(host) - before < 0.3
