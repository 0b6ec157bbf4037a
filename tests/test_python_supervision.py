"""Supervision of Python isolate hosts, end to end: an isolate stuck in C past its
wall limit gets its request answered 504, the warm standby takes the next request at
once, and the stuck host is killed; a request handed to an isolate whose fresh
interpreter fails to start is served by another host; a guest that shuts down its
host's sockets neither stalls the PoP's loop nor leaves it serving a dead host;
forged READY and RETIRE frames write no line of their own to the PoP's log and no
flood of lines (a frame the real guest cannot send ends its host); a restarted PoP
serves the same bodies."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from runtime.admin.client import AdminError
from runtime.executors.output import MAX_LINE
from runtime.executors.python.supervisor import KILL_GRACE
from tests.support import EXAMPLES, Running, host_pids, pop_thread, python_function, running

STUCK = """
import os, time
from edgefn import Response

def handle(request, env):
    if request.query.get("stuck"):
        time.sleep(60)  # in C: no watchdog can interrupt it
    return Response(f"served by {os.getpid()}")
"""
WALL_MS = 400


def wait_until(check: Callable[[], bool], within: float) -> float | None:
    """Seconds until `check()` is true, or None if it is not within `within` seconds."""
    began = time.monotonic()
    while time.monotonic() - began < within:
        if check():
            return time.monotonic() - began
        time.sleep(0.02)
    return None


def test_a_host_stuck_in_c_is_replaced_by_its_standby_and_killed(
        pop: Running, tmp_path: Path) -> None:
    deployed = pop.deploy(python_function(tmp_path, "stuck", STUCK, limits=f"wall_ms = {WALL_MS}",
                                          pool="min = 1\nmax = 1\nstandby = true"))
    hosts = host_pids("stuck")
    assert len(hosts) == 2  # the active host and its warm standby
    status, _, body = pop.get("/stuck")
    active = int(body.split()[-1])
    (standby,) = hosts - {active}

    sent = time.monotonic()
    status, headers, body = pop.get("/stuck?stuck=1", timeout=30)
    took = time.monotonic() - sent
    assert (status, headers["x-edgefn-error"]) == (504, "wall_limit"), body
    assert headers["x-edgefn-function"] == f"stuck@{deployed['version']}"
    assert json.loads(body) == {"error": {
        "kind": "wall_limit", "function": "stuck", "version": deployed["version"],
        "message": f"function 'stuck' exceeded its wall-time limit of {WALL_MS} ms"}}
    wall = WALL_MS / 1000  # at the wall limit, not once the host is killed (KILL_GRACE
    # later): half of that as slack (1.6x the limit failed once in a full run, at 0.76 s)
    assert wall <= took < wall + KILL_GRACE / 2, \
        f"answered after {took:.3f}s for wall_ms = {WALL_MS}"

    # the next request goes to the promoted standby at once, not after the kill
    sent = time.monotonic()
    status, _, body = pop.get("/stuck")
    assert (status, body) == (200, f"served by {standby}".encode())
    assert time.monotonic() - sent < KILL_GRACE / 4

    # the stuck host is killed KILL_GRACE after the timeout; a new standby replaces it
    gone_after = wait_until(lambda: active not in host_pids("stuck"), KILL_GRACE * 3)
    assert gone_after is not None, "the stuck host is still running"
    assert wait_until(lambda: len(host_pids("stuck") - {standby}) == 1, 30) is not None
    assert pop.get("/stuck")[2] == f"served by {standby}".encode()


WEDGE = """
import os, threading, time
from edgefn import Response

# set by ?wedge=1: from then on no fresh interpreter of this host can start (it stands
# in for what an interpreter left behind may hold, the room a fresh one needs, say)
if os.environ.get("WEDGED"):
    raise RuntimeError("a thread this host's function started never stopped")

def handle(request, env):
    if request.query.get("wedge"):
        os.environ["WEDGED"] = "1"
        threading.Thread(target=threading.Event().wait).start()  # blocked in C: unstoppable
        time.sleep(0.3)  # the next request queues behind this one meanwhile
    return Response(f"served by {os.getpid()}")
"""


HOG = """
import os, threading, time
from edgefn import Response

def hold():
    held = bytearray(280 << 20)  # what the interpreter left behind keeps
    threading.Event().wait()  # blocked in C: unstoppable

def handle(request, env):
    if request.query.get("wedge"):
        threading.Thread(target=hold).start()
        time.sleep(0.5)  # the next request queues behind this one meanwhile
    return Response(f"served by {os.getpid()}")
"""


@pytest.mark.parametrize("standby", [True, False])
@pytest.mark.parametrize(("name", "source", "limits"), [
    ("wedge", WEDGE, "wall_ms = 10000"),
    # its thread's CPU (zeroing 280 MiB, ~100 ms) counts against the request: past 50 ms
    ("hog", HOG, "wall_ms = 10000\nmemory_mb = 64\ncpu_ms = 2000")])
def test_a_request_queued_for_an_isolate_whose_interpreter_cannot_restart_is_served(
        pop: Running, tmp_path: Path, standby: bool, name: str, source: str,
        limits: str) -> None:
    """A handler left a thread running that could not be stopped: its interpreter is
    left behind and the host asks to be replaced. The request that had queued behind
    it was handed to that isolate as the handler returned. When the fresh interpreter
    failed to start (wedge) it waited there to its wall limit (504); when what the
    thread holds left no room for one (hog), the isolate stopped and the request got
    a 502 ("its isolate ended unexpectedly"). It is served by the standby, or by the
    new host once it is warm, and the old host stops."""
    pop.deploy(python_function(tmp_path, name, source, limits=limits,
                               pool=f"min = 1\nmax = 1\nstandby = {str(standby).lower()}"))
    status, _, body = pop.get(f"/{name}")
    assert status == 200, body
    wedged = int(body.split()[-1])
    answers: dict[str, tuple[int, dict[str, str], bytes]] = {}
    first = threading.Thread(target=lambda: answers.setdefault("w", pop.get(
        f"/{name}?wedge=1")))
    first.start()
    time.sleep(0.2)
    sent = time.monotonic()
    status, headers, body = pop.get(f"/{name}", timeout=30)
    took = time.monotonic() - sent
    first.join()
    assert answers["w"][::2] == (200, f"served by {wedged}".encode())
    assert status == 200, (headers.get("x-edgefn-error"), body)
    assert int(body.split()[-1]) != wedged
    assert took < 8, f"answered after {took:.1f}s"
    assert wait_until(lambda: wedged not in host_pids(name), 15) is not None, \
        "the host whose interpreter could not restart is still running"


CLOSER = """
import os, socket, time
from edgefn import Response

def handle(request, env):
    if request.query.get("hello"):
        return Response(f"served by {os.getpid()}")
    sockets = []  # every isolate socket of this host, as /proc/self/fd shows them
    for fd in sorted(map(int, os.listdir("/proc/self/fd"))):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                sockets.append(fd)
        except OSError:
            pass  # the listing's own fd, closed meanwhile
    keep = 1 if request.query.get("keep") else 0  # its exit closes that one
    for fd in sockets[:len(sockets) - keep]:
        s = socket.socket(fileno=os.dup(fd))
        s.shutdown(socket.SHUT_RDWR)
        s.close()
    time.sleep(float(request.query.get("then", "0.4")))  # in C: no watchdog stops it
    os._exit(0)
"""
SOCKETS = 32  # pool.max: one socket per isolate


@contextmanager
def loop_stalls(pop: Running) -> Iterator[list[float]]:
    """The gaps (s) between turns of the PoP's loop while the block runs, ticked
    every millisecond."""
    loop = pop.loop
    assert loop is not None
    gaps: list[float] = []
    last = [0.0]
    done = threading.Event()

    def tick() -> None:
        now = time.monotonic()
        if last[0]:
            gaps.append(now - last[0])
        last[0] = now
        if not done.is_set():
            loop.call_later(0.001, tick)

    loop.call_soon_threadsafe(tick)
    time.sleep(0.05)
    try:
        yield gaps
    finally:
        done.set()
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(5)


def test_a_guest_shutting_down_its_hosts_sockets_never_stalls_the_loop(
        pop: Running, tmp_path: Path) -> None:
    """Each isolate socket that closed while its host still ran slept 10 ms on the
    loop (waiting for the exit status): a guest that shut down 31 of them froze every
    tenant for ~310 ms per request, and again on the standby that took over."""
    pop.deploy(python_function(tmp_path, "closer", CLOSER, limits="wall_ms = 5000",
                               pool=f"min = 1\nmax = {SOCKETS}\nstandby = true"))
    for _ in range(2):
        attacker = int(pop.get("/closer?hello=1")[2].split()[-1])
        with loop_stalls(pop) as gaps:
            status, headers, body = pop.get("/closer?keep=1", timeout=10)
            assert (status, headers["x-edgefn-error"]) == (502, "crash"), body
            assert wait_until(lambda pid=attacker: not running(pid), 5) is not None
            time.sleep(0.1)  # its exit is reported meanwhile
        stall = max(gaps)
        # it was 10 ms a socket; what is left is this machine's noise
        assert stall < 0.01 * (SOCKETS - 1) / 3, f"the loop stalled {stall * 1000:.0f} ms"
        status, _, body = pop.get("/closer?hello=1")  # the standby serves at once
        assert status == 200 and int(body.split()[-1]) != attacker
        assert wait_until(lambda: len(host_pids("closer")) == 2, 30) is not None  # a new standby


@pytest.mark.parametrize("then", ["exit", "linger"])
def test_a_host_whose_guest_shut_down_every_socket_is_replaced(
        pop: Running, tmp_path: Path, then: str) -> None:
    """A guest shut down all its host's sockets, then exited (or slept in C): no socket
    was left to tell the PoP, which kept the dead host and answered every later
    request 504 at its wall limit. Its exit is watched now (its pidfd), and a host
    without a socket left is killed."""
    pop.deploy(python_function(tmp_path, "closer", CLOSER, limits="wall_ms = 1000",
                               pool="min = 1\nmax = 4\nstandby = true"))
    attacker = int(pop.get("/closer?hello=1")[2].split()[-1])
    status, headers, body = pop.get(f"/closer?then={0.4 if then == 'exit' else 60}",
                                    timeout=10)
    assert (status, headers["x-edgefn-error"]) == (502, "crash"), body
    time.sleep(0.6)  # it has exited, or would have
    status, headers, body = pop.get("/closer?hello=1", timeout=10)
    assert status == 200, (headers.get("x-edgefn-error"), body)
    assert int(body.split()[-1]) != attacker
    assert wait_until(lambda: not running(attacker), 5) is not None


FORGER = """
import gc, os, sys, threading, time
from edgefn import Response

FORGED = "\\n2026-12-02 08:00:00,000 CRITICAL edgefn.pop: FORGED LINE"

def handle(request, env):
    kind = request.query.get("kind")
    if kind == "wedge":  # a thread it cannot stop: the interpreter restarts after this
        threading.Thread(target=threading.Event().wait).start()  # blocked in C
        time.sleep(0.3)  # the next request queues behind this one meanwhile
    if kind in (None, "wedge"):
        return Response(f"served by {os.getpid()}")
    # past the SDK: frames straight onto its socket
    wire = sys.modules["runtime.executors.python.wire"]
    session = next(o for o in gc.get_objects() if type(o).__name__ == "Session")
    if kind == "retire":
        frame = wire.json_frame(wire.RETIRE, {"why": "low" + FORGED})
    else:
        frame = wire.json_frame(wire.READY, {
            "ok": {"ok": True}, "recycling": {"ok": False, "recycling": True},
            "error": {"ok": False, "error": "boom" + FORGED + "x" * 100_000},
            "stopped": {"ok": False, "stopped": "out" + FORGED}}[kind])
    session._send(frame * int(request.query.get("n", "1")))
    return Response(f"sent by {os.getpid()}")
"""


def isolate_lines(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "edgefn.isolates" and r.getMessage().startswith(name)]


@pytest.mark.parametrize("kind", ["ok", "recycling"])
def test_a_flood_of_forged_ready_frames_ends_its_host_after_one_line(
        pop: Running, tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str) -> None:
    """50,000 READY frames ok sent during a request logged "isolate restarted during a
    request" 50,000 times (in 2 s, on the loop, past the function log's 20 lines a
    second). The real guest says READY once per fresh interpreter: the first is taken
    for one (a job's thread it could not stop ends an interpreter unannounced: the
    next test), the second ends the host; so does a second recycling READY."""
    caplog.set_level(logging.INFO, logger="edgefn.isolates")
    pop.deploy(python_function(tmp_path, "forger", FORGER,
                               pool="min = 1\nmax = 1\nstandby = true"))
    attacker = int(pop.get("/forger")[2].split()[-1])
    status, headers, body = pop.get(f"/forger?kind={kind}&n=50000")
    assert (status, headers.get("x-edgefn-error")) == (502, "crash"), body
    status, _, body = pop.get("/forger")  # the standby took over
    assert status == 200 and int(body.split()[-1]) != attacker
    assert wait_until(lambda: not running(attacker), 5) is not None
    lines = isolate_lines(caplog, "forger")
    assert len(lines) <= 3, lines[:5]  # restarted (ok), garbage; then the host died
    assert sum("isolate sent garbage (a" in line for line in lines) == 1, lines


def test_an_interpreter_restarted_under_a_queued_request_serves_it(
        pop: Running, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """What the READY check must let through: a handler left a thread it could not
    stop, so its interpreter restarts after the response, and the request queued
    behind it was handed to the isolate meanwhile: its READY comes during that
    request, which the fresh interpreter serves, in the same host."""
    pop.deploy(python_function(tmp_path, "forger", FORGER, limits="wall_ms = 10000",
                               pool="min = 1\nmax = 1\nstandby = true"))
    host = int(pop.get("/forger")[2].split()[-1])
    answers: list[tuple[int, dict[str, str], bytes]] = []
    first = threading.Thread(target=lambda: answers.append(pop.get("/forger?kind=wedge")))
    first.start()
    time.sleep(0.1)
    status, _, body = pop.get("/forger", timeout=30)
    first.join()
    assert answers[0][::2] == (200, f"served by {host}".encode())
    assert (status, body) == (200, f"served by {host}".encode())
    assert "forger: isolate restarted during a request" in isolate_lines(caplog, "forger")
    assert not any("garbage" in line for line in isolate_lines(caplog, "forger"))


@pytest.mark.parametrize("kind", ["error", "stopped", "retire"])
def test_guest_text_in_the_pops_log_cannot_start_a_line(
        pop: Running, tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str) -> None:
    """A READY's error or stopped text and RETIRE's why were logged verbatim: a newline
    in them started a forged CRITICAL line of the PoP's log."""
    caplog.set_level(logging.INFO, logger="edgefn.isolates")
    pop.deploy(python_function(tmp_path, "forger", FORGER, limits="wall_ms = 1000",
                               pool="min = 1\nmax = 1\nstandby = true"))
    pop.get(f"/forger?kind={kind}")  # (its isolate ends without it: a 504)
    forged = [line for line in isolate_lines(caplog, "forger") if "FORGED LINE" in line]
    assert forged, isolate_lines(caplog, "forger")
    for line in forged:
        assert "\n" not in line and "\\n2026-12-02 08:00:00,000 CRITICAL" in line, line
        assert len(line) < 2 * MAX_LINE, len(line)  # cut: one frame made a 64 MiB line


def test_a_forged_import_warning_cannot_start_a_line(
        pop: Running, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The first READY's import warnings go to the function log at deploy; a module
    whose top-level code sends its own READY first wrote them verbatim."""
    forger = """
import json, os, socket, struct
frame = b"S" + json.dumps({"ok": True, "warnings": [
    "x\\n2026-12-02 08:00:00,000 CRITICAL edgefn.pop: FORGED LINE"]}).encode()
for fd in map(int, os.listdir("/proc/self/fd")):
    try:
        with socket.socket(fileno=os.dup(fd)) as s:
            s.sendall(struct.pack("<I", len(frame)) + frame)
    except OSError:
        pass  # not a socket
def handle(request, env):
    pass
"""
    with pytest.raises(AdminError):  # its real READY came while it was warming up
        pop.deploy(python_function(tmp_path, "forger", forger))
    forged = [r.getMessage() for r in caplog.records if "FORGED LINE" in r.getMessage()]
    assert forged and all("\n" not in line for line in forged), forged


STATE = """
from edgefn import Response

def handle(request, env):
    return Response.json({"greeting": env.vars["GREETING"], "query": request.query,
                          "version": env.deployment()["version"]})
"""


def served(pop: Running, path: str) -> tuple[int, str, bytes]:
    status, headers, body = pop.get(path)
    return status, headers.get("x-edgefn-function", ""), body


def test_a_restarted_pop_serves_the_same_bodies_from_the_same_versions(tmp_path: Path) -> None:
    data = tmp_path / "data"
    paths = ["/py/hello?name=Ada", "/hello", "/state?a=1"]
    with pop_thread(data) as first:
        first.deploy(EXAMPLES / "python-hello")
        first.deploy(EXAMPLES / "hello-wat")
        first.deploy(python_function(tmp_path, "state", STATE, env='GREETING = "first"'))
        current = first.deploy(python_function(tmp_path, "state", STATE,
                                               env='GREETING = "second"'))["version"]
        before = [served(first, p) for p in paths]
    with pop_thread(data) as second:  # no deploys: everything comes back from the data dir
        after = [served(second, p) for p in paths]
    assert after == before
    assert after[0][::2] == (200, b"Hello, Ada, from a Python isolate!\n")
    assert after[1][::2] == (200, b"Hello from edgefn (WASM)!\n")
    assert after[2][:2] == (200, f"state@{current}")  # the version serving, not the first
    assert json.loads(after[2][2]) == {"greeting": "second", "query": {"a": "1"},
                                       "version": current}


def test_a_deploy_answers_once_the_retired_versions_hosts_have_exited(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A retired version with nothing in flight has its isolate hosts stopped at the
    switch, and the deploy answers once they have exited and been reaped (`PoP.warm`,
    at most RETIRED_WAIT): their exit, 7-15 ms of the kernel's work each, overlapped
    the first request to the new version and cost it 0.2-0.3 ms (bench: README "Cold
    starts"). Each stop is made 0.1 s slower here, so that a deploy that did not wait
    would answer before it ends."""
    from runtime.executors.python.hosts import Host

    finish_stop = Host.finish_stop

    def slower(self: Host, grace: float = 2.0) -> None:
        time.sleep(0.1)
        finish_stop(self, grace)

    monkeypatch.setattr(Host, "finish_stop", slower)
    with pop_thread(tmp_path / "data") as pop:
        fn = python_function(tmp_path, "retiring", STUCK,
                             pool="min = 1\nmax = 1\nstandby = true")
        pop.deploy(fn)
        old = host_pids("retiring")
        assert len(old) == 2  # the active host and its standby
        with open(fn / "edgefn.toml", "a") as f:
            f.write('ROUND = "2"\n')  # (under [env], the manifest's last table)
        assert pop.deploy(fn)["changed"]
        # exited and reaped (no zombie left either) before the deploy answered
        assert not any(Path(f"/proc/{pid}").exists() for pid in old)
        new = host_pids("retiring")
        assert len(new) == 2 and not new & old
        status, _, body = pop.get("/retiring")
        assert status == 200 and int(body.split()[-1]) in new


def test_an_isolate_host_is_the_kernels_first_choice_when_memory_runs_out(
        pop: Running, tmp_path: Path) -> None:
    """What no limit of a tenant counts (its isolates' memory_mb added up past the
    machine's memory; kernel socket buffers, in no process's RSS) must cost a host,
    never the PoP: hosts run with the highest `oom_score_adj`, the PoP as it was."""
    pop.deploy(python_function(tmp_path, "oom", 'from edgefn import Response\n\n'
                               'def handle(request, env):\n    return Response("ok")\n'))
    assert pop.get("/oom")[0] == 200
    hosts = host_pids("oom")
    assert hosts
    for pid in hosts:
        assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() == "1000", pid
    assert Path("/proc/self/oom_score_adj").read_text().strip() != "1000"
