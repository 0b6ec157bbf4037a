"""One isolate-host process as the PoP sees it (`hosts.Host`), with real host
processes and no pool: its start (the first isolates warm, the rest unstarted) and
the deploy errors of a module that fails, exits or hangs at import; its death
reported once, with its cause, whatever its sockets did; its other threads' CPU;
`grow`; an isolate lost under a job, and a dead host's jobs; its stop."""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edgefn_core.abi import encode_pairs, encode_request
from edgefn_core.errors import DeployError, FunctionError
from runtime.executors.python import hosts, uids
from runtime.executors.python.config import HostConfig
from runtime.executors.python.hosts import Host
from runtime.executors.python.isolate import Isolate
from runtime.executors.python.job import Job
from runtime.executors.python.sandbox import UID_BASE

WARM = encode_request(b"GET", b"/", b"", [(b"host", b"prewarm")], encode_pairs([]), b"")

HELLO = """\
from edgefn import Response


def handle(request, env):
    return Response("hello")
"""

# a module that shuts down every socket of its host as it is imported
def each_socket(do: str) -> str:
    """Module code that runs `do` (Python, on `s`) on a copy of every socket its host
    holds, as /proc/self/fd shows them."""
    return f"""\
import os, socket, struct
for fd in sorted(map(int, os.listdir("/proc/self/fd"))):
    try:
        if os.readlink(f"/proc/self/fd/{{fd}}").startswith("socket:"):
            s = socket.socket(fileno=os.dup(fd))
            {do}
            s.close()
    except OSError:
        pass
"""


# a module that shuts down every socket of its host as it is imported
SHUT = each_socket("s.shutdown(socket.SHUT_RDWR)")


class Events:
    """The pool's side of an isolate's news, recorded."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    def started(self, isolate: Isolate) -> None:
        self.log.append(("started", isolate))

    def finished(self, isolate: Isolate) -> None:
        self.log.append(("finished", isolate))

    def call(self, isolate: Isolate, msg: dict[str, Any]) -> None:
        self.log.append(("call", msg))

    def retiring(self, isolate: Isolate, why: str) -> None:
        self.log.append(("retiring", why))

    def requeue(self, isolate: Isolate, job: Job) -> None:
        self.log.append(("requeue", (isolate, job)))

    def begun(self, isolate: Isolate, job: Job) -> None:
        self.log.append(("begun", job))


@pytest.fixture
def function_dir() -> Iterator[Callable[[str], str]]:
    """A function folder holding `main.py` with the given source, readable by the
    host's own uid (pytest's tmp_path is not: its base is the test user's alone)."""
    made: list[str] = []

    def make(source: str) -> str:
        folder = tempfile.mkdtemp(prefix="edgefn-test-hosts-")
        os.chmod(folder, 0o755)
        (Path(folder) / "main.py").write_text(source)
        made.append(folder)
        return folder

    yield make
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


def config(folder: str, first: int = 1, isolates: int = 2, **changes: Any) -> HostConfig:
    """A host config for the function in `folder`: `pool.min` = `first` of `isolates`."""
    cfg = HostConfig(name="hosted", version="v1", function_dir=folder, module="main",
                     handler="handle", cpu_ms=1000, wall_ms=5000, memory_mb=0,
                     recycle_after=1000, min_isolates=first, max_isolates=isolates)
    return dataclasses.replace(cfg, **changes)


class Started:
    """A host of `cfg`, its deaths recorded as the pool would handle them."""

    def __init__(self, cfg: HostConfig, warm_request: bytes = WARM,
                 check_imports: bool = False) -> None:
        self.cfg = cfg
        self.events = Events()
        self.deaths: list[str] = []
        # (the default when not asked: so a test without it checks the default)
        asked = {"check_imports": True} if check_imports else {}
        self.host = Host(cfg, self.events, self._died, generation=1,
                         warm_request=warm_request, **asked)

    def _died(self, host: Host, why: str) -> None:
        """What the pool does (`Supervisor.host_died`): its jobs fail, saying why."""
        self.deaths.append(why)
        for job in host.fail_jobs(why):
            self.events.requeue(host.isolates[0], job)


@pytest.fixture
def started(function_dir: Callable[[str], str]) -> Iterator[Callable[..., Started]]:
    """Starts a host of `source` (`first` of `isolates` started; `changes` to its
    config; the rest as `Started` takes it), stopped at the end of the test
    whatever it did."""
    made: list[Started] = []

    def start(source: str = HELLO, first: int = 1, isolates: int = 2, *,
              warm_request: bytes = WARM, check_imports: bool = False,
              **changes: Any) -> Started:
        s = Started(config(function_dir(source), first, isolates, **changes), warm_request,
                    check_imports)
        made.append(s)
        return s

    yield start
    for s in made:
        s.host.stop(grace=0)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A loop whose callbacks must not fail: what one raised fails the test."""
    loop = asyncio.new_event_loop()
    failed: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda loop, context: failed.append(context))
    yield loop
    loop.close()
    assert failed == []


def turn_until(loop: asyncio.AbstractEventLoop, done: Callable[[], bool],
               within: float = 5.0) -> None:
    """Run `loop` until `done()`; fails past `within` seconds."""
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, "timed out"
        loop.run_until_complete(asyncio.sleep(0.005))


def crash_of(job: Job) -> str:
    """The message `job` failed with, a 502 ``crash`` (fails otherwise)."""
    err = job.future.exception()
    assert isinstance(err, FunctionError), err
    assert (err.code, err.status) == ("crash", 502)
    return str(err)


def uid_free(uid: int) -> bool:
    """Whether `uid` can be claimed again (its host released its lock)."""
    fd = os.open(uids.lock_dir() / str(uid - UID_BASE), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def test_a_host_starts_its_first_isolates_warm_and_the_rest_unstarted(
        started: Callable[..., Started]) -> None:
    s = started(first=2, isolates=3)
    host = s.host
    host.wait_ready()
    assert [i.state for i in host.isolates] == ["idle", "idle", "unstarted"]
    assert all(i.clock is not None for i in host.isolates[:2])  # named by THREAD frames
    assert host.isolates[2].clock is None
    assert host.pid == host.proc.pid and host.proc.poll() is None
    assert host.generation == 1 and all(i.generation == 1 for i in host.isolates)
    assert host.retiring is False and host.dead is False
    if os.geteuid() == 0:  # a uid of its own, held until it is gone; a private tmpfs
        assert host.uid >= UID_BASE and not uid_free(host.uid)
        assert host.scratch is None
    host.stop()
    assert host.proc.returncode == 0  # its stdin closed: it exited on its own
    assert host.dead and s.deaths == []  # a stop is no death
    assert host.uid_lock == -1
    if os.geteuid() == 0:
        assert uid_free(host.uid)


ENDS = ("does main.py's top-level code end the process (os._exit, os.close)? Its output "
        "is in the PoP's log, tagged hosted@v1")


@pytest.mark.parametrize(("source", "says"), [
    ("raise ValueError('no config here')\n",
     "hosted: main.py importing `main` failed: main.py:1: ValueError: no config here"),
    ("import os\nos._exit(3)\n",
     f"hosted: the isolate host exited while starting (status 3): {ENDS}"),
    (SHUT + "import time\ntime.sleep(30)\n",
     f"hosted: the isolate host closed its isolate's socket while starting and did not "
     f"exit: {ENDS}"),
])
def test_a_module_that_fails_at_import_is_refused_and_its_host_stopped(
        started: Callable[..., Started], monkeypatch: pytest.MonkeyPatch,
        source: str, says: str) -> None:
    s = started(source, first=1, isolates=1)
    real_wait, waits = s.host.proc.wait, []

    def wait(timeout: float | None = None) -> int:  # a host that will not exit: 5 s cut short
        waits.append(timeout)
        return real_wait(min(timeout or 0.5, 0.5))

    monkeypatch.setattr(s.host.proc, "wait", wait)
    with pytest.raises(DeployError) as e:
        s.host.wait_ready()
    assert str(e.value) == says
    if "isolate host" in says:  # its status waited for, 5 s at most
        assert waits[0] == 5
    assert s.host.proc.returncode is not None and s.host.uid_lock == -1


def test_a_module_that_hangs_at_import_is_refused_after_the_ready_timeout(
        started: Callable[..., Started], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hosts, "READY_TIMEOUT", 1.0)
    s = started("import time\ntime.sleep(60)\n", first=1, isolates=1)
    began = time.monotonic()
    with pytest.raises(DeployError) as e:
        s.host.wait_ready()
    assert str(e.value) == ("hosted: isolate did not start within 1s: importing main.py (its "
                            "top-level code) did not finish; does it loop or wait at import?")
    assert 1.0 <= time.monotonic() - began < 3.0
    assert s.host.proc.returncode == -signal.SIGKILL


def request(query: bytes = b"") -> bytes:
    return encode_request(b"GET", b"/", query, [(b"host", b"test")], encode_pairs([]), b"")


EXITER = """\
import os
from edgefn import Response


def handle(request, env):
    os._exit(int(request.query.get("status", "7")))
"""


@pytest.mark.parametrize("status", [7, 0])
def test_its_death_is_reported_once_with_its_exit_status(
        started: Callable[..., Started], loop: asyncio.AbstractEventLoop, status: int) -> None:
    """Its socket's EOF and its pidfd both say so: `died` hears it once, and the job
    it ran fails saying why (the pool's `fail_jobs`), not as an isolate that ended."""
    s = started(EXITER)
    s.host.wait_ready()
    s.host.attach(loop)
    job = Job(loop, request(b"status=%d" % status))
    s.host.isolates[0].run(job)
    turn_until(loop, lambda: bool(s.deaths))
    loop.run_until_complete(asyncio.sleep(hosts.EXIT_LAG * 2))
    assert s.deaths == [f"exit status {status}"]
    assert s.host.dead and s.host.pidfd == -1 and s.host.others() is None
    assert crash_of(job) == f"crashed: its isolate host died (exit status {status})"
    s.host.grow()  # dead: nothing is written to its closed stdin


def test_a_killed_host_is_reported_by_its_signal(
        started: Callable[..., Started], loop: asyncio.AbstractEventLoop) -> None:
    s = started()
    s.host.wait_ready()
    s.host.attach(loop)
    pidfd = s.host.pidfd
    s.host.kill()
    turn_until(loop, lambda: bool(s.deaths))
    assert s.deaths == ["signal SIGKILL"]
    assert s.host.pidfd == -1 and loop.remove_reader(pidfd) is False  # unwatched, closed
    s.host.kill()  # reaped: not sent again (its pid may be another process's now)


def test_a_host_reaped_before_it_is_attached_is_reported_at_once(
        started: Callable[..., Started], loop: asyncio.AbstractEventLoop) -> None:
    """Its pid may be another process's by then: no pidfd is opened for it."""
    s = started()
    s.host.wait_ready()
    s.host.kill()
    s.host.proc.wait(5)
    s.host.attach(loop)
    assert s.host.pidfd == -1
    turn_until(loop, lambda: bool(s.deaths))
    loop.run_until_complete(asyncio.sleep(0.05))
    assert s.deaths == ["signal SIGKILL"]


SLOW = """\
import time
from edgefn import Response


def handle(request, env):
    time.sleep(float(request.query.get("s", "0")))
    return Response("slept")
"""


def test_an_isolate_lost_under_a_job_hands_back_those_sent_ahead_and_fails_its_own(
        started: Callable[..., Started], loop: asyncio.AbstractEventLoop) -> None:
    """Its socket closed while the host lives: the jobs sent ahead that cannot have
    started go back to the pool, last first (each goes first in line); the one it
    ran fails `EXIT_LAG` later, unless the host's death said why meanwhile. The
    host serves on with its other isolates."""
    s = started(SLOW, first=2, isolates=2)
    s.host.wait_ready()
    s.host.attach(loop)
    isolate = s.host.isolates[0]
    running, ahead, behind = Job(loop, request(b"s=1")), Job(loop, request()), Job(loop, request())
    isolate.run(running)
    loop.run_until_complete(asyncio.sleep(0.1))  # it started
    isolate.run(ahead)
    isolate.run(behind)
    isolate.channel.sock.shutdown(socket.SHUT_RD)  # the PoP reads its EOF
    turn_until(loop, lambda: bool(s.events.log))
    assert s.events.log == [("requeue", (isolate, behind)), ("requeue", (isolate, ahead))]
    assert isolate.state == "dead" and not running.done
    began = time.monotonic()
    turn_until(loop, lambda: running.done)
    assert time.monotonic() - began < hosts.EXIT_LAG + 0.1
    assert crash_of(running) == "crashed: its isolate ended unexpectedly"
    assert s.deaths == [] and s.host.proc.poll() is None  # one isolate left: it lives


def test_a_host_whose_every_isolate_ended_is_killed(
        started: Callable[..., Started], loop: asyncio.AbstractEventLoop) -> None:
    s = started(first=1, isolates=2)
    s.host.wait_ready()
    s.host.attach(loop)
    s.host.isolates[0].channel.sock.shutdown(socket.SHUT_RD)
    loop.run_until_complete(asyncio.sleep(0.2))
    assert s.deaths == [] and s.host.proc.poll() is None  # one unstarted isolate left
    s.host.isolates[1].channel.sock.shutdown(socket.SHUT_RD)
    turn_until(loop, lambda: bool(s.deaths))
    assert s.deaths == ["signal SIGKILL"]  # it could serve nothing more


def test_a_dead_hosts_jobs_fail_and_those_that_cannot_have_started_go_elsewhere(
        started: Callable[..., Started], loop: asyncio.AbstractEventLoop) -> None:
    s = started(first=2, isolates=2)
    s.host.wait_ready()
    s.host.attach(loop)
    first, second = s.host.isolates
    jobs = [Job(loop, request()) for _ in range(5)]
    first.job, second.job = jobs[0], jobs[1]
    first.queue.extend(jobs[2:4])  # nothing unread: neither can have started
    second.queue.append(jobs[4])
    second.channel.unread = lambda: True  # type: ignore[method-assign]  # it may have
    never = s.host.fail_jobs("signal SIGKILL")
    assert never == jobs[2:4]
    assert first.job is None and second.job is None and not first.queue and not second.queue
    for job in (jobs[0], jobs[1], jobs[4]):
        assert crash_of(job) == "crashed: its isolate host died (signal SIGKILL)"
    assert not any(job.done for job in jobs[2:4])


THREADS = """\
import threading
import time
from edgefn import Response


def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def handle(request, env):
    seconds = float(request.query.get("s", "0"))
    if request.query.get("where") == "thread":
        t = threading.Thread(target=spin, args=(seconds,))
        t.start()
        t.join()
    else:
        spin(seconds)
    return Response("spun")
"""


def test_other_threads_cpu_is_what_threads_a_handler_started_used(
        started: Callable[..., Started], loop: asyncio.AbstractEventLoop) -> None:
    """Not its main thread's, nor its isolates' own threads' (their requests are
    counted by their own clocks): what a thread a handler started used."""
    s = started(THREADS, first=1, isolates=1)
    s.host.wait_ready()
    s.host.attach(loop)
    isolate = s.host.isolates[0]

    def served(query: bytes) -> float:
        before = s.host.others()
        assert before is not None
        job = Job(loop, request(query))
        isolate.run(job)
        turn_until(loop, lambda: job.done)
        after = s.host.others()
        assert after is not None
        return after - before

    assert served(b"s=0.3") < 0.1  # on the isolate's own thread
    assert 0.3 <= served(b"s=0.3&where=thread") < 0.4


LEAVES_A_THREAD = """\
import ctypes
import mmap
from edgefn import Response

KEEP = []


def handle(request, env):
    code = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    code.write(b"\\xeb\\xfe")  # jmp $: a thread of its own no watchdog stops
    KEEP.append(code)
    start = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(code)))
    ctypes.CDLL(None).pthread_create(ctypes.byref(ctypes.c_ulong()), None, start, None)
    return Response("armed")
"""


def test_a_host_whose_threads_use_cpu_no_request_accounts_for_is_killed(
        started: Callable[..., Started], loop: asyncio.AbstractEventLoop,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A thread a handler started through ctypes outlives its request (46 of them
    slowed every tenant 50-fold, charged to none): killed within two looks."""
    monkeypatch.setattr(hosts, "LOOK_EVERY", 0.2)
    s = started(LEAVES_A_THREAD, first=1, isolates=1, cpu_ms=50, wall_ms=1000)
    s.host.wait_ready()
    s.host.attach(loop)
    job = Job(loop, request())
    s.host.isolates[0].run(job)
    turn_until(loop, lambda: job.done)
    assert job.future.result().body == b"armed" and not s.deaths
    armed = time.monotonic()
    with caplog.at_level(logging.ERROR, "edgefn.isolates"):
        turn_until(loop, lambda: bool(s.deaths), within=3)
    assert time.monotonic() - armed < 0.8  # the look after the request's, and one more
    (why,) = s.deaths
    assert why.startswith("signal SIGKILL: its threads used ") and why.endswith(
        "its requests then may have: a thread no request accounts for"), why
    interval = float(why.split(" s of CPU in ")[1].split(" s,")[0])
    assert 0.1 <= interval <= 0.5  # between two looks 0.2 s apart
    assert [r.getMessage() for r in caplog.records if "killed" in r.getMessage()] == [
        f"hosted@v1: host {s.host.pid} killed: {why.removeprefix('signal SIGKILL: ')}"]


def test_a_host_whose_requests_threads_stay_within_their_limits_is_not_killed(
        started: Callable[..., Started], loop: asyncio.AbstractEventLoop,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread a handler started and joined, within its request's CPU; an idle host."""
    monkeypatch.setattr(hosts, "LOOK_EVERY", 0.1)
    s = started(THREADS, first=1, isolates=1, cpu_ms=400, wall_ms=2000)
    s.host.wait_ready()
    s.host.attach(loop)
    for _ in range(3):
        job = Job(loop, request(b"s=0.3&where=thread"))
        s.host.isolates[0].run(job)
        turn_until(loop, lambda job=job: job.done)
    monkeypatch.setattr(hosts, "READY_TIMEOUT", 0.3)  # idle is not starting
    loop.run_until_complete(asyncio.sleep(0.5))  # idle: five looks
    assert not s.deaths and not s.host.dead and s.host.looked is not None
    assert s.host.main is not None
    s.host.main.close()  # its count is gone (it is exiting): no more looks
    s.host._look()
    assert s.host.look is None and not s.deaths


SPINS_WHEN_IMPORTED_AGAIN = """\
import os
from edgefn import Response

if os.path.exists("/tmp/imported"):  # its recycled interpreter's import: it never ends
    while True:
        pass
open("/tmp/imported", "w").close()


def handle(request, env):
    return Response("ok")
"""


@pytest.mark.parametrize("how", ["recycled", "grown"])
def test_a_host_whose_isolate_does_not_restart_within_the_ready_timeout_is_killed(
        started: Callable[..., Started], loop: asyncio.AbstractEventLoop,
        monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Its module's top-level code spun as its interpreter recycled (two cores for a
    minute, every request a 504), or as an isolate was added: killed once it has
    started for READY_TIMEOUT with no request."""
    s = started(SPINS_WHEN_IMPORTED_AGAIN, first=1, isolates=2, recycle_after=1)
    s.host.wait_ready()
    monkeypatch.setattr(hosts, "LOOK_EVERY", 0.1)
    monkeypatch.setattr(hosts, "READY_TIMEOUT", 0.5)
    s.host.attach(loop)
    if how == "recycled":
        isolate = s.host.isolates[0]
        job = Job(loop, request())
        isolate.run(job)
        turn_until(loop, lambda: job.done)
        assert job.future.result().body == b"ok"
        isolate.state = "recycling"  # as the scheduler has it after its last job
    else:
        s.host.isolates[1].state = "starting"  # as the scheduler has it, then grows it
        s.host.grow()
    restarted = time.monotonic()
    turn_until(loop, lambda: bool(s.deaths), within=3)
    assert 0.5 <= time.monotonic() - restarted < 1.0
    assert s.deaths == ["signal SIGKILL: an isolate did not start within 0.5 s (its "
                        "module's top-level code did not end)"]


def test_an_isolate_that_ran_a_request_since_the_last_look_starts_anew(
        started: Callable[..., Started], loop: asyncio.AbstractEventLoop,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Restarting at two looks READY_TIMEOUT apart, with a request between them (one
    interpreter per request, `recycle_after = 1`): two starts, neither too long."""
    monkeypatch.setattr(hosts, "LOOK_EVERY", 100.0)  # the looks are this test's
    s = started(first=1, isolates=1)
    s.host.wait_ready()
    monkeypatch.setattr(hosts, "READY_TIMEOUT", 0.3)  # (its start waited the real one)
    s.host.attach(loop)
    isolate = s.host.isolates[0]
    isolate.state = "recycling"
    s.host._look()
    loop.run_until_complete(asyncio.sleep(0.2))
    job = Job(loop, request())
    isolate.run(job)
    turn_until(loop, lambda: job.done)
    isolate.state = "recycling"  # it restarts again after this one
    s.host._look()  # a new start: since now
    loop.run_until_complete(asyncio.sleep(0.2))  # 0.4 s since the first look
    s.host._look()
    assert not s.deaths and not s.host.dead and isolate in s.host.restarting
    isolate.state = "idle"  # it started: forgotten
    s.host._look()
    assert isolate not in s.host.restarting
    loop.run_until_complete(asyncio.sleep(0.4))
    isolate.state = "recycling"  # another start, long after the last, with no request
    s.host._look()
    assert not s.deaths and not s.host.dead


def test_a_fresh_hosts_other_threads_have_used_next_to_nothing(
        started: Callable[..., Started]) -> None:
    """Its main thread's start (the imports, the compile) and its isolates' (an
    interpreter each) are not the other threads'; once its main thread's clock is
    gone, it has no count."""
    s = started(first=2, isolates=2)
    s.host.wait_ready()
    assert all(i.clock is not None and (i.clock.read() or 0) > 0.02 for i in s.host.isolates)
    others = s.host.others()
    assert others is not None and 0.0 <= others < 0.02
    assert s.host.main is not None
    s.host.main.close()
    assert s.host.others() is None


def test_grow_starts_the_next_isolate_and_a_stopped_host_grows_no_more(
        started: Callable[..., Started], loop: asyncio.AbstractEventLoop) -> None:
    s = started(first=1, isolates=3)
    s.host.wait_ready()
    s.host.attach(loop)
    second = s.host.isolates[1]
    second.state = "starting"  # as the supervisor marks it
    s.host.grow()
    turn_until(loop, lambda: ("started", second) in s.events.log)
    loop.run_until_complete(asyncio.sleep(0.2))
    assert s.events.log == [("started", second)]  # that one, not the next
    s.host.begin_stop()
    s.host.grow()  # its stdin is closed: nothing written, nothing raised


def test_a_host_that_does_not_exit_within_its_grace_is_killed(
        started: Callable[..., Started]) -> None:
    s = started()
    s.host.wait_ready()
    s.host.close_isolates()
    began = time.monotonic()
    s.host.finish_stop(grace=0)  # its stdin still open: it would not exit on its own
    assert time.monotonic() - began < 0.5
    assert s.host.proc.returncode == -signal.SIGKILL and s.host.uid_lock == -1


def test_a_pop_not_running_as_root_gives_its_host_a_scratch_dir_and_removes_it(
        started: Callable[..., Started], monkeypatch: pytest.MonkeyPatch) -> None:
    """Without root the host cannot mount a tmpfs or take a uid of its own: it gets
    a scratch dir of the PoP's, removed once it is gone, and the base uid. Stopping
    it again finds nothing left to do."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    s = started()
    monkeypatch.undo()
    scratch = s.host.scratch
    assert scratch is not None and os.path.isdir(scratch)
    assert Path(scratch).name.startswith("edgefn-scratch-")
    assert (s.host.uid, s.host.uid_lock) == (UID_BASE, -1)
    s.host.wait_ready()
    s.host.stop()
    assert not os.path.exists(scratch)
    s.host.stop()


def test_a_host_runs_in_its_own_process_group_with_only_its_own_environment(
        started: Callable[..., Started], monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C meant for the PoP (its terminal's foreground group) does not reach
    it; the PoP's environment (a secret in it) does not either; the descriptor the
    owners' generation is read from is passed down, the PoP's others are not."""
    monkeypatch.setenv("EDGEFN_TEST_SECRET", "hunter2")
    r, w = os.pipe()
    try:
        s = started(kv_generation_fd=r)
        s.host.wait_ready()
        pid = s.host.pid
        assert os.getpgid(pid) == pid != os.getpgid(0)
        assert len(s.host.isolates) == 2
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
        assert b"EDGEFN_TEST_SECRET" not in environ and b"hunter2" not in environ
        fds = {int(n) for n in os.listdir(f"/proc/{pid}/fd")}
        assert r in fds and w not in fds
    finally:
        os.close(r)
        os.close(w)


def test_imports_that_fail_only_at_request_time_are_logged_when_asked(
        started: Callable[..., Started], caplog: pytest.LogCaptureFixture) -> None:
    source = "def handle(request, env):\n    import msgspec\n"
    for check in (False, True):
        caplog.clear()
        started(source, check_imports=check).host.wait_ready()
        warned = [r.getMessage() for r in caplog.records if r.name == "edgefn.functions"]
        assert bool(warned) == check, warned
        assert all(w.startswith("hosted@v1: ") and "msgspec" in w for w in warned)


def test_an_isolate_that_fails_its_warm_up_is_refused(started: Callable[..., Started]) -> None:
    s = started(warm_request=b"not an encoded request")
    with pytest.raises(DeployError) as e:
        s.host.wait_ready()
    assert str(e.value) == "hosted: isolate failed while warming up"
    assert s.host.proc.returncode is not None


@pytest.mark.parametrize(("thread", "says"), [
    ("a THREAD frame naming no thread of its host", "hosted: the isolate host sent a "
                                                   "THREAD frame naming no thread of its host"),
    (None, "hosted: the isolate host did not name its thread first (a THREAD frame)"),
])
def test_a_host_that_does_not_name_its_isolates_thread_is_refused(
        started: Callable[..., Started], monkeypatch: pytest.MonkeyPatch,
        thread: str | None, says: str) -> None:
    """What `Isolate.thread` finds wrong with the THREAD frame (or a thread it did
    not take): the host is not the one edgefn started."""
    monkeypatch.setattr(Isolate, "thread", lambda self, payload: thread)
    s = started(first=1, isolates=1)
    with pytest.raises(DeployError) as e:
        s.host.wait_ready()
    assert str(e.value) == says


def test_closing_its_isolates_forgets_them_and_its_exit(
        started: Callable[..., Started], loop: asyncio.AbstractEventLoop) -> None:
    s = started(first=1, isolates=2)
    s.host.wait_ready()
    s.host.attach(loop)
    assert s.host.pidfd >= 0
    s.host.close_isolates()
    assert s.host.dead and s.host.pidfd == -1
    assert [i.state for i in s.host.isolates] == ["dead", "dead"]
    assert s.host.main is not None and s.host.main.fd == -1
    s.host.kill()
    s.host.proc.wait(5)
    loop.run_until_complete(asyncio.sleep(0.1))
    assert s.deaths == []  # its exit is no one's news now


def test_a_death_whose_status_another_thread_is_reaping_is_reported_as_an_exit(
        started: Callable[..., Started], loop: asyncio.AbstractEventLoop,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its pidfd said it exited while another thread held its status (a stop's
    `wait`): `poll()` has none to give, and the death is reported all the same."""
    s = started()
    s.host.wait_ready()
    s.host.attach(loop)
    monkeypatch.setattr(s.host.proc, "poll", lambda: None)
    os.kill(s.host.pid, signal.SIGKILL)
    turn_until(loop, lambda: bool(s.deaths))
    assert s.deaths == ["exited"]


def test_an_isolate_lost_while_a_job_sent_ahead_may_have_started_fails_it(
        started: Callable[..., Started], loop: asyncio.AbstractEventLoop) -> None:
    """Something it sent waits unread: the job before may have ended and the next
    begun, so none of those sent ahead runs elsewhere (it could run twice)."""
    s = started(SLOW, first=2, isolates=2)
    s.host.wait_ready()
    s.host.attach(loop)
    isolate = s.host.isolates[0]
    running, ahead = Job(loop, request(b"s=1")), Job(loop, request())
    isolate.run(running)
    isolate.run(ahead)
    isolate.channel.unread = lambda: True  # type: ignore[method-assign]
    isolate.channel.sock.shutdown(socket.SHUT_RD)
    turn_until(loop, lambda: ahead.done and running.done)
    assert crash_of(ahead) == crash_of(running) == "crashed: its isolate ended unexpectedly"
    assert s.events.log == []


def test_its_first_isolates_are_starting_and_the_rest_unstarted_until_ready(
        started: Callable[..., Started]) -> None:
    s = started(first=1, isolates=2)
    assert [i.state for i in s.host.isolates] == ["starting", "unstarted"]


def test_what_it_prints_is_logged_under_the_functions_name(
        started: Callable[..., Started], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "edgefn.functions")
    s = started("print('hello from its import', flush=True)\n" + HELLO)
    s.host.wait_ready()
    deadline = time.monotonic() + 5
    while not any("hello from its import" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, "not logged"
        time.sleep(0.01)
    line = next(r.getMessage() for r in caplog.records if "hello from its import" in r.getMessage())
    assert "hosted@v1" in line


def test_a_host_that_dies_before_naming_its_thread_is_refused(
        started: Callable[..., Started]) -> None:
    s = started()
    os.kill(s.host.pid, signal.SIGKILL)  # before its imports end: no THREAD frame yet
    with pytest.raises(DeployError) as e:
        s.host.wait_ready()
    assert str(e.value) == f"hosted: the isolate host exited while starting (status -9): {ENDS}"


@pytest.mark.parametrize("root", [True, False])
def test_a_host_that_cannot_be_spawned_gives_back_what_was_made_for_it(
        function_dir: Callable[[str], str], monkeypatch: pytest.MonkeyPatch, root: bool) -> None:
    """Its isolates' socket pairs, its uid (as root), its scratch dir (not as root):
    nothing is left behind (before, the sockets waited for the garbage collector and
    the scratch dir stayed)."""
    if root and os.geteuid() != 0:
        pytest.skip("a uid of its own is claimed only as root")
    claimed: list[int] = []
    made: list[str] = []
    real_claim, real_mkdtemp = uids.claim, tempfile.mkdtemp

    def claim() -> tuple[int, int]:
        uid, fd = real_claim()
        claimed.append(uid)
        return uid, fd

    def mkdtemp(**kwargs: Any) -> str:
        made.append(real_mkdtemp(**kwargs))
        return made[-1]

    def fail(*args: object) -> None:
        raise OSError("no more processes")

    cfg = config(function_dir(HELLO))
    monkeypatch.setattr(uids, "claim", claim)
    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(hosts, "_spawn", fail)
    if not root:
        monkeypatch.setattr(os, "geteuid", lambda: 1000)
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError, match="no more processes") as failed:
        Started(cfg)
    # closed, not left to the garbage collector (the traceback holds the frame's locals)
    assert failed.traceback and len(os.listdir("/proc/self/fd")) == fds
    if root:
        assert len(claimed) == 1 and uid_free(claimed[0]) and made == []
    else:
        assert claimed == [] and len(made) == 1 and not os.path.exists(made[0])


def test_a_host_gone_before_its_main_thread_is_read_has_no_count(
        started: Callable[..., Started], monkeypatch: pytest.MonkeyPatch) -> None:
    def gone(pid: int, tid: int) -> None:
        raise OSError("no such thread")

    monkeypatch.setattr(hosts, "ThreadClock", gone)
    s = started()
    assert s.host.main is None and s.host.others() is None


# a module that sends a READY of its own, {"ok": false} and no error, as it is imported
FORGER = each_socket('s.sendall(struct.pack("<I", 14) + b"S" + b\'{"ok": false}\')') + (
    "import time\ntime.sleep(30)\n")


def test_a_ready_frame_forged_at_import_without_an_error_says_it_failed_to_start(
        started: Callable[..., Started]) -> None:
    s = started(FORGER, first=1, isolates=1)
    with pytest.raises(DeployError) as e:
        s.host.wait_ready()
    assert str(e.value) == "hosted: main.py failed to start"
