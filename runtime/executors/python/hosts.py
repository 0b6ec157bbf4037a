"""One isolate-host process, as the PoP sees it: spawn it, wait until its first
isolates are warm, start more, notice it died, stop or kill it.

The process runs in its own process group, so a Ctrl-C meant for the PoP (the
terminal signals its whole foreground group) does not reach it; it exits when
its stdin closes, which is how the PoP stops it, and also what happens when the
PoP dies.

The PoP learns that it died from its pidfd (`attach`), not from its sockets: a
guest reaches every isolate socket of its host (they are its fds), and one that
shut them all down and exited left the PoP serving a host that was gone (504s).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable

from edgefn_core.abi import decode_response
from edgefn_core.errors import DeployError, FunctionError
from runtime.executors.output import escaped
from runtime.executors.python import host_output, sandbox, uids, wire
from runtime.executors.python.config import HostConfig
from runtime.executors.python.cpu_watch import outer_limit
from runtime.executors.python.host import IMPORT_ROOTS
from runtime.executors.python.isolate import Events, Isolate, read_json
from runtime.executors.python.job import Job
from runtime.executors.python.thread_clock import ProcessClock, ThreadClock

log = logging.getLogger("edgefn.isolates")
functions_log = logging.getLogger("edgefn.functions")

READY_TIMEOUT = 30.0
WARM_ROUNDS = 20
STOP_GRACE = 2.0  # after its stdin closes, how long a host gets before it is killed
# an isolate's socket closed while its host still runs: how long its job waits to learn
# whether the host is exiting (EOF can beat the exit status), on the loop's clock
EXIT_LAG = 0.05
# Every LOOK_EVERY seconds a host's other threads' CPU (`others`) is held to what its
# requests since the last look may have used (`outer_limit` each: the CPU watch charges
# a request its share of them) plus IDLE_SHARE of a core (the watchdogs' ticks, a thread
# winding down); past that, a thread no request accounts for runs (one a handler started
# through ctypes, which outlives its request: 46 of them spinning slowed every tenant's
# requests 50-fold for as long as they ran, charged to none) and the host is killed.
LOOK_EVERY = 1.0
IDLE_SHARE = 0.25


class Host:
    def __init__(self, cfg: HostConfig, events: Events, died: Callable[[Host, str], None], *,
                 generation: int, warm_request: bytes, check_imports: bool = False) -> None:
        """Spawn the process (it starts `cfg.min_isolates` isolates); `wait_ready`
        next. `died(host, why)` is called on the event loop when it dies.

        `warm_request` is a sample encoded request each isolate runs through its
        request path (not the handler) before it counts as ready. With
        `check_imports`, the host also looks for imports that cannot load in an
        isolate but run only at request time, and `wait_ready` logs them as warnings.
        """
        self.cfg = cfg
        self.events = events
        self.died = died
        self.generation = generation
        self.warm_request = warm_request
        self.dead = False
        self.retiring = False  # it asked to be replaced; the supervisor swaps it out
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pidfd = -1  # readable once the process exits (`attach`)
        # what its other threads may use a request (`_look`), and when it last looked:
        # (time, their CPU, jobs sent to its isolates, jobs they ran then)
        self.per_job = outer_limit(cfg.cpu_ms, cfg.wall_ms)
        self.looked: tuple[float, float, int, int] | None = None
        self.look: asyncio.TimerHandle | None = None
        self.killed_for: str | None = None  # why the PoP killed it, for its death's report
        # isolates starting (grown) or restarting (recycled) with no request: since when,
        # and the jobs sent to each then (`_look`)
        self.restarting: dict[Isolate, tuple[float, int]] = {}
        pairs = [socket.socketpair() for _ in range(cfg.max_isolates)]
        # as root the host makes a private tmpfs its scratch dir; otherwise it gets one here
        self.scratch = None if os.geteuid() == 0 else tempfile.mkdtemp(prefix="edgefn-scratch-")
        # as root, a uid of its own on this machine (released in `finish_stop`)
        self.uid, self.uid_lock = uids.claim() if os.geteuid() == 0 else (sandbox.UID_BASE, -1)
        try:
            self.proc = _spawn(cfg, [b.fileno() for _, b in pairs], check_imports, self.scratch,
                               self.uid)
        except BaseException:  # nothing started: give back what was made for it
            uids.release(self.uid_lock)
            for a, b in pairs:
                a.close()
                b.close()
            if self.scratch is not None:
                shutil.rmtree(self.scratch, ignore_errors=True)
            raise
        assert self.proc.stdout is not None and self.proc.stderr is not None
        # its stdout/stderr: never the PoP's
        host_output.relay(self.proc.stdout, self.proc.stderr, cfg.label)
        for _, b in pairs:
            b.close()
        self.isolates = [Isolate(self, a, "starting" if n < cfg.min_isolates else "unstarted")
                         for n, (a, _) in enumerate(pairs)]
        # its CPU, as the kernel counts it (`others`); its main thread's id is its pid
        self.cpu = ProcessClock(self.proc.pid)
        self.main: ThreadClock | None = None
        with contextlib.suppress(OSError):  # it exited already: `others` says so
            self.main = ThreadClock(self.proc.pid, self.proc.pid)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self) -> None:
        """Block until the initial isolates are ready and warm.

        Raises `DeployError` if the module cannot be imported in a subinterpreter
        or the host does not start (it is killed then).
        """
        try:
            for isolate in self.isolates[:self.cfg.min_isolates]:
                self._wait_ready(isolate)
        except BaseException:
            self.kill()
            self.stop()
            raise

    def _wait_ready(self, isolate: Isolate) -> None:
        sock, reader = isolate.channel.sock, isolate.channel.reader
        sock.settimeout(READY_TIMEOUT)
        pending: list[tuple[bytes, bytes]] = []
        try:
            f = wire.recv_frame(sock, reader, pending)
            if f is not None and f[0] == wire.THREAD:  # the host's, before the function's code
                if (why := isolate.thread(f[1])) is not None:
                    raise DeployError(f"{self.cfg.name}: the isolate host sent {why}")
                f = wire.recv_frame(sock, reader, pending)
        except TimeoutError:
            raise DeployError(f"{self.cfg.name}: isolate did not start within "
                              f"{READY_TIMEOUT:.0f}s: importing {self.cfg.module}.py (its "
                              "top-level code) did not finish; does it loop or wait at "
                              "import?") from None
        if f is not None and isolate.clock is None:
            raise DeployError(f"{self.cfg.name}: the isolate host did not name its thread "
                              "first (a THREAD frame)")
        if f is None or f[0] != wire.READY:
            try:
                how = f"exited while starting (status {self.proc.wait(5)})"
            except subprocess.TimeoutExpired:  # a bare 500 (the timeout escaped)
                how = "closed its isolate's socket while starting and did not exit"
            raise DeployError(f"{self.cfg.name}: the isolate host {how}: does {self.cfg.module}"
                              ".py's top-level code end the process (os._exit, os.close)? "
                              f"Its output is in the PoP's log, tagged {self.cfg.label}")
        info = read_json(f[1])
        if not info.get("ok"):
            raise DeployError(f"{self.cfg.name}: {self.cfg.module}.py "  # the guest's text:
                              f"{escaped(str(info.get('error', 'failed to start')))}")  # 1 line
        for warning in info.get("warnings") or ():
            functions_log.warning("%s: %s", self.cfg.label, escaped(str(warning)))  # see above
        for _ in range(WARM_ROUNDS):  # the request path, minus the handler, in both processes
            sock.sendall(wire.frame(wire.WARM, self.warm_request))
            f = wire.recv_frame(sock, reader, pending)
            if f is None or f[0] != wire.RESPONSE:
                raise DeployError(f"{self.cfg.name}: isolate failed while warming up")
            decode_response(f[1])
        isolate.state = "idle"
        assert not pending

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read its isolates' sockets on `loop`, and call `died` there when the
        process exits, whatever its sockets did."""
        self.loop = loop
        for isolate in self.isolates:
            isolate.attach(loop)
        if self.proc.returncode is not None:  # reaped already: its pid may be another's
            loop.call_soon(self._exited)
            return
        self.pidfd = os.pidfd_open(self.proc.pid)  # unreaped, the pid is still this process
        loop.add_reader(self.pidfd, self._exited)
        self.look = loop.call_later(LOOK_EVERY, self._look)

    def _unwatch(self) -> None:
        if self.look is not None:
            self.look.cancel()
            self.look = None
        if self.pidfd >= 0:
            if self.loop is not None:
                self.loop.remove_reader(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = -1

    def _exited(self) -> None:
        """The process exited (its pidfd is readable): report it once."""
        self._unwatch()
        if self.dead:
            return
        self.dead = True
        code = self.proc.poll()
        why = ("exited" if code is None  # another thread is reaping it right now
               else f"signal {signal.Signals(-code).name}" if code < 0
               else f"exit status {code}")
        if self.killed_for is not None:
            why = f"{why}: {self.killed_for}"
        self.died(self, why)

    def _look(self) -> None:
        """Kill the host if its other threads used more CPU since the last look than
        its requests since then may have, and `IDLE_SHARE` of a core (see
        `LOOK_EVERY`), or if an isolate has been starting or restarting, with no
        request, for `READY_TIMEOUT` (its module's top-level code, run again as its
        interpreter recycled, spun: two cores for a minute, every request a 504); else
        look again in `LOOK_EVERY`."""
        self.look = None
        others = None if self.dead else self.others()
        if others is None or self.loop is None:
            return
        now = self.loop.time()
        for isolate in self.isolates:
            if isolate.state in ("starting", "recycling") and isolate.job is None:
                since, sent = self.restarting.get(isolate, (now, isolate.sent))
                if sent != isolate.sent:  # it ran a job since: another start
                    since, sent = now, isolate.sent
                self.restarting[isolate] = (since, sent)
                if now - since > READY_TIMEOUT:
                    return self._kill_for(f"an isolate did not start within {READY_TIMEOUT:g} "
                                          "s (its module's top-level code did not end)")
            else:
                self.restarting.pop(isolate, None)
        sent = sum(i.sent for i in self.isolates)
        running = sum(1 for i in self.isolates if i.job is not None)
        last, self.looked = self.looked, (now, others, sent, running)
        if last is not None:
            then, before, sent_before, running_before = last
            may = IDLE_SHARE * (now - then) + self.per_job * (sent - sent_before + running_before)
            if others - before > may:
                return self._kill_for(f"its threads used {others - before:.2f} s of CPU in "
                                      f"{now - then:.1f} s, past the {may:.2f} s its requests "
                                      "then may have: a thread no request accounts for")
        self.look = self.loop.call_later(LOOK_EVERY, self._look)

    def _kill_for(self, why: str) -> None:
        """Kill it, logged; its death is reported saying `why`."""
        self.killed_for = why
        log.error("%s: host %d killed: %s", self.cfg.label, self.pid, why)
        self.kill()

    def others(self) -> float | None:
        """Seconds of CPU used by its threads other than its main thread and those
        of its isolates, ended ones included: those its handlers started (and the
        watchdogs' ticks). None once it is gone. Its isolates' threads are read
        first, so a read errs high, by what ran meanwhile."""
        if self.dead or self.main is None:
            return None
        mine = 0.0
        for isolate in self.isolates:
            if isolate.clock is not None:
                isolate.clock.read()  # an ended or closed one keeps its last count
                mine += isolate.clock.last
        main, total = self.main.read(), self.cpu.read()
        if main is None or total is None:
            return None
        return total - main - mine

    def grow(self) -> None:
        """Start its next isolate (the host starts them in order)."""
        if self.dead:
            return
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"grow\n")
            self.proc.stdin.flush()
        except OSError:
            pass  # it died: `_exited` reports that

    def lost(self, isolate: Isolate) -> None:
        """An isolate's socket closed: that isolate alone ended, or the host is
        exiting (`_exited` reports that). Never blocks: a guest can shut down
        every socket of its host, and a wait here ran once per socket."""
        job = isolate.job
        isolate.close()
        if self.dead:
            return
        if self.proc.poll() is not None:
            return self._exited()
        if all(i.state == "dead" for i in self.isolates):  # it can serve nothing more
            self.kill()  # its exit promotes the standby (`_exited`)
        if job is not None and self.loop is not None:
            self.loop.call_later(EXIT_LAG, self._isolate_ended, isolate, job)
        for never in reversed(self._settle_queue(isolate, "its isolate ended unexpectedly")):
            self.events.requeue(isolate, never)

    def _settle_queue(self, isolate: Isolate, why: str) -> list[Job]:
        """The jobs sent ahead to `isolate`, which ended: those that cannot have
        started (`Isolate.unstarted`), to run elsewhere; the others fail."""
        never = isolate.unstarted()
        for job in isolate.queue:
            job.fail(FunctionError("crash", 502, f"crashed: {why}"))
        isolate.queue.clear()
        return never

    def _isolate_ended(self, isolate: Isolate, job: Job) -> None:
        """`EXIT_LAG` after `isolate`'s socket closed under `job`: the host did not
        die meanwhile (that failed the job, saying why)."""
        if isolate.job is job and not job.done:
            job.fail(FunctionError("crash", 502, "crashed: its isolate ended unexpectedly"))

    def fail_jobs(self, why: str) -> list[Job]:
        """Fail the jobs its isolates were running (it died), and those sent ahead
        that may have started; those sent ahead that cannot have, to run elsewhere."""
        never: list[Job] = []
        for isolate in self.isolates:
            never += self._settle_queue(isolate, f"its isolate host died ({why})")
            if isolate.job is not None:
                isolate.job.fail(FunctionError("crash", 502,
                                               f"crashed: its isolate host died ({why})"))
                isolate.job = None
        return never

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def close_isolates(self) -> None:
        """Forget the isolates' sockets and its exit (call on the event loop's thread)."""
        self.dead = True
        self._unwatch()
        for isolate in self.isolates:
            isolate.close()
        if self.main is not None:
            self.main.close()

    def begin_stop(self) -> None:
        """Close its stdin: the host exits. Call `close_isolates` first when not on
        the event loop's thread."""
        self.close_isolates()
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass  # its reader is gone: a broken pipe on flush

    def finish_stop(self, grace: float = STOP_GRACE) -> None:
        """Wait up to `grace` seconds for it to exit after `begin_stop`, then kill it."""
        try:
            self.proc.wait(max(grace, 0))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        uids.release(self.uid_lock)  # it is gone: its uid may go to another host
        self.uid_lock = -1

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop it (`begin_stop`, `finish_stop`); for a host that already died,
        release what it left behind."""
        self.begin_stop()
        self.finish_stop(grace)


def _spawn(cfg: HostConfig, fds: list[int], check_imports: bool,
           scratch: str | None, uid: int) -> subprocess.Popen[bytes]:
    """Start `python -P -m runtime.executors.python.host` serving `fds`, in its own
    process group (see the module docstring), with a scrubbed environment and its
    sandbox settings: a uid of its own (used when the PoP runs as root) and its
    scratch dir (`scratch`, or None: a private /tmp). ``-P`` and a working directory
    of ``/``: `-m` put the working directory first on sys.path, and it was the
    function's folder, so a ``random.py`` there ran as the PoP's user, unsandboxed,
    when the host imported `tempfile` (the host enters the folder once sandboxed)."""
    box = {"uid": uid, "insecure": cfg.insecure, "scratch": scratch or "/tmp"}
    config = {**cfg.__dict__, "fds": fds, "initial": cfg.min_isolates,
              "check_imports": check_imports, "sandbox": box}
    env = sandbox.host_environment(IMPORT_ROOTS)
    shared = [cfg.kv_generation_fd] if cfg.kv_generation_fd >= 0 else []
    # the config (the function's [env] values included) in a memfd, not on the command
    # line, which any local user reads in /proc/PID/cmdline
    config_fd = os.memfd_create("edgefn-host-config", os.MFD_CLOEXEC)
    try:
        os.write(config_fd, json.dumps(config).encode())
        return subprocess.Popen(
            [sys.executable, "-P", "-m", "runtime.executors.python.host", f"fd:{config_fd}",
             cfg.name],  # the name only says in `ps` whose host it is
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=[*fds, *shared, config_fd], env=env, cwd="/", process_group=0)
    finally:
        os.close(config_fd)
