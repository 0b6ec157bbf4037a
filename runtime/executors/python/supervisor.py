"""Supervision of one function version's isolate-host processes.

The supervisor keeps an active host and, if the pool wants one, a pre-warmed
standby. When the active host dies (a segfault in ctypes, an isolate stuck in
native code past its limit) its jobs fail, the standby takes over at once (a
new generation for the scheduler) and a new standby is started in the
background; without a standby, new jobs wait for a new host, whose start is
tried again every `RESPAWN_DELAY` until one is up. When a host asks to be
replaced (recycled interpreters have eaten into its memory cap: `budget`), it is
swapped gracefully instead: the standby, or else a new host once it is warm,
takes new jobs, and the old host is stopped when its jobs in flight have ended.
Stopping is parallel: every host's stdin closes first, then they share one grace
period.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time

from runtime.executors.python.config import HostConfig
from runtime.executors.python.hosts import READY_TIMEOUT, STOP_GRACE, Host
from runtime.executors.python.isolate import Events, Isolate
from runtime.executors.python.job import Job
from runtime.executors.python.scheduler import Scheduler

log = logging.getLogger("edgefn.isolates")

KILL_GRACE = 1.0  # after a wall-limit timeout, how long a stuck isolate gets before its host dies
DRAIN_CHECK = 1.0  # how often a host being replaced is checked for jobs still in flight
RESPAWN_DELAY = 1.0  # a replacement for a retiring host failed to start: try again after this
# the threads stopping retired hosts, until each has reaped its host (`stopping`)
_stopping: set[threading.Thread] = set()
_stopping_lock = threading.Lock()


def stopping() -> bool:
    """Whether a retired host is still being stopped (its process not yet reaped)."""
    with _stopping_lock:
        return bool(_stopping)


def wait_stopped(timeout: float) -> None:
    """Block until every host being stopped now has exited and been reaped, or
    `timeout` seconds pass. Call off the event loop."""
    with _stopping_lock:
        threads = list(_stopping)
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


class Supervisor:
    def __init__(self, cfg: HostConfig, standby: bool, warm_request: bytes,
                 scheduler: Scheduler[Isolate], events: Events) -> None:
        """Nothing starts until `start()`."""
        # Global state
        self.cfg = cfg
        self.want_standby = standby
        self.warm_request = warm_request
        self.scheduler = scheduler
        self.events = events
        self.loop: asyncio.AbstractEventLoop | None = None
        self.generations = itertools.count(1)
        self.replacements = 0
        self.crashed = 0  # hosts that died unexpectedly (for the metrics)
        self.closing = False  # the PoP is shutting down: abort hosts still starting
        self.stopped = False
        # Per-host state
        self.active: Host | None = None
        self.standby: Host | None = None
        self.spawning: list[threading.Thread] = []
        self.pending = 0  # spawns not landed yet (on the loop's thread)
        self.starting: set[Host] = set()  # spawned, not ready yet
        self.draining: set[Host] = set()  # replaced while serving; stopped once their jobs end

    def start(self) -> None:
        """Start the active host (and a warm standby). Blocks; raises `DeployError`."""
        self.active = self._spawn(check_imports=True)  # at deploy: warn once, not per host
        if self.want_standby:
            try:
                self.standby = self._spawn()
            except BaseException:
                self.active.stop()
                raise

    def _spawn(self, check_imports: bool = False) -> Host:
        """A new host, ready. Blocks; raises `DeployError`."""
        host = Host(self.cfg, self.events, self.host_died, generation=next(self.generations),
                    warm_request=self.warm_request, check_imports=check_imports)
        self.starting.add(host)
        try:
            if self.closing:  # `close` may have looked at `starting` just before the add
                host.kill()
            host.wait_ready()
        finally:
            self.starting.discard(host)
        return host

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the hosts' sockets on `loop` and serve from the active host."""
        self.loop = loop
        for host in (self.active, self.standby):
            if host is not None:
                host.attach(loop)
        if self.active is not None:
            self.scheduler.use(self.active.generation, self.active.isolates)

    def grow(self, isolate: Isolate) -> None:
        """Start `isolate` (the scheduler picked the active host's next unstarted one)."""
        if self.active is not None and isolate.generation == self.active.generation:
            self.active.grow()

    # -- failures -------------------------------------------------------------------------------
    def stuck(self, isolate: Isolate, job: Job) -> None:
        """`job` timed out on `isolate`: move new jobs to the standby meanwhile, and
        kill the host if the isolate is still stuck after `KILL_GRACE`."""
        active, standby = self.active, self.standby
        if (active is not None and isolate.generation == active.generation
                and standby is not None and not standby.dead and not self.scheduler.retired):
            # the stuck host is drained, never the standby: swapped back in, a second
            # stuck request made it active again, and new requests died with it (502)
            self.active, self.standby = standby, None
            self.scheduler.use(standby.generation, standby.isolates)
            self._drain(active)
            self._replace()
        assert self.loop is not None
        self.loop.call_later(KILL_GRACE, self._kill_if_stuck, isolate, job)

    def _kill_if_stuck(self, isolate: Isolate, job: Job) -> None:
        if isolate.job is job and isolate.state != "dead":
            log.warning("%s: isolate stuck in native code past its limit; restarting its host",
                        self.cfg.label)
            isolate.owner.kill()

    def _promote(self) -> None:
        standby = self.standby
        assert standby is not None
        self.active, self.standby = standby, self.active
        self.scheduler.use(standby.generation, standby.isolates)

    def host_died(self, host: Host, why: str) -> None:
        """Fail its jobs, promote the standby, and start a new standby; jobs sent
        ahead that had not started run elsewhere."""
        log.warning("%s: isolate host %d died (%s)", self.cfg.label, host.pid, why)
        self.crashed += not self.closing
        never = host.fail_jobs(why)
        host.stop()
        self._replace_dead(host)
        for job in reversed(never):  # each goes first in line: the first sent ends first
            self.scheduler.requeue(job)

    def _replace_dead(self, host: Host) -> None:
        if host in self.draining:  # already replaced
            self.draining.discard(host)
            return
        if self.scheduler.retired:
            return
        if host is self.active:
            self.scheduler.clear()
            if self.standby is not None and not self.standby.dead:
                self._promote()
                self.standby = None
            else:
                self.active = None
        elif host is self.standby:
            self.standby = None
        self._replace()

    # -- replacing a host that runs out of room -------------------------------------------------
    def retiring(self, isolate: Isolate, why: str) -> None:
        """`isolate`'s host asks to be replaced (recycling has used up its memory
        cap): new jobs go to the standby at once, or to a new host once it is warm
        (the old one serves meanwhile); the old host stops when its jobs in flight
        have ended. No job fails for it."""
        active, standby = self.active, self.standby
        if self.scheduler.retired:
            return
        if active is not None and isolate.owner is active and not active.retiring:
            log.info("%s: replacing isolate host %d (%s)", self.cfg.label, active.pid, why)
            active.retiring = True
            if standby is not None and not standby.dead:
                self.active, self.standby = standby, None
                self.scheduler.use(standby.generation, standby.isolates)
                self._drain(active)
            self._replace()  # the new standby, or the new active (`_adopt`)
        elif standby is not None and isolate.owner is standby and not standby.retiring:
            log.info("%s: replacing standby isolate host %d (%s)", self.cfg.label, standby.pid,
                     why)
            self.standby = None
            self._drain(standby)
            self._replace()

    def _drain(self, host: Host) -> None:
        """Stop `host` once none of its isolates has a job in flight (it gets no new
        ones): checked when one of its jobs ends, and every `DRAIN_CHECK` seconds
        for the jobs that end otherwise (timed out, their isolate lost)."""
        host.retiring = True
        self.draining.add(host)
        self._check_drained(host)

    def _check_drained(self, host: Host) -> None:
        if host not in self.draining:
            return
        if self._stop_if_idle(host):
            return
        assert self.loop is not None
        self.loop.call_later(DRAIN_CHECK, self._check_drained, host)

    def finished(self, isolate: Isolate) -> None:
        """`isolate`'s job ended: stop its host if that was the last one it drained."""
        for host in self.draining:
            if isolate.owner is host:
                self._stop_if_idle(host)
                return

    def _stop_if_idle(self, host: Host) -> bool:
        if any(i.job is not None and not i.job.done for i in host.isolates):
            return False
        self.draining.discard(host)
        self._stop_later(host)
        return True

    # -- starting hosts in the background --------------------------------------------------------
    def _replace(self) -> None:
        """Start a host in the background: the new active if there is none (or the
        active is retiring), else a standby."""
        self.replacements += 1
        self.pending += 1
        loop = self.loop
        assert loop is not None

        def spawn() -> None:
            host: Host | None = None
            try:
                host = self._spawn()
            except Exception as e:
                if not self.closing:
                    log.error("%s: cannot restart its isolate host: %s", self.cfg.name, e)
            try:
                if self.scheduler.retired:
                    raise RuntimeError("retired meanwhile")
                loop.call_soon_threadsafe(self._landed, host)
            except RuntimeError:  # the pool was retired or the loop closed meanwhile
                if host is not None:
                    host.stop()

        t = threading.Thread(target=spawn, name="edgefn-host-spawn", daemon=True)
        self.spawning = [s for s in self.spawning if s.is_alive()] + [t]
        t.start()

    def _landed(self, host: Host | None) -> None:
        """A background spawn ended: with `host` ready, or failed (None: tried again
        after `RESPAWN_DELAY` while the pool still needs a host to serve)."""
        self.pending -= 1
        if host is not None:
            return self._adopt(host)
        if self._needs_successor():
            assert self.loop is not None
            self.loop.call_later(RESPAWN_DELAY, self._respawn)

    def _respawn(self) -> None:
        if self._needs_successor():
            self._replace()

    def _needs_successor(self) -> bool:
        """Whether a pool that serves on (not retired, not closing) waits for a host
        no spawn is starting: it has no active host (the active one died, with no
        standby to take over), or the active one asked to be replaced. (A function
        whose host died and whose replacement failed to start had no host until its
        next deploy: its requests waited to their wall limit.) A missing standby is
        not retried: the active host serves."""
        active = self.active
        return (not self.scheduler.retired and not self.closing and self.pending == 0
                and (active is None or active.retiring))

    def _adopt(self, host: Host) -> None:
        if self.scheduler.retired:
            return self._stop_later(host)
        assert self.loop is not None
        host.attach(self.loop)
        old = self.active
        if old is None or old.retiring:
            self.active = host
            self.scheduler.use(host.generation, host.isolates)
            if old is not None:
                self._drain(old)
        elif self.standby is None and self.want_standby:
            self.standby = host
        else:  # a standby arrived meanwhile: one is enough
            self._stop_later(host)
        if self.want_standby and self.standby is None and self.pending == 0:
            self._replace()

    # -- stopping -------------------------------------------------------------------------------
    def _stop_later(self, host: Host) -> None:
        host.close_isolates()  # loop state, on the loop's thread

        def stop() -> None:
            try:
                host.stop()
            finally:
                with _stopping_lock:
                    _stopping.discard(thread)

        thread = threading.Thread(target=stop, daemon=True)
        with _stopping_lock:
            _stopping.add(thread)
        thread.start()

    def stop_hosts(self) -> None:
        """Stop the hosts without blocking (a retired pool drained; on the loop's thread)."""
        if self.stopped:
            return
        self.stopped = True
        draining, self.draining = self.draining, set()
        for host in (self.active, self.standby, *draining):
            if host is not None:
                self._stop_later(host)

    def close(self) -> None:
        """Stop everything now, in parallel (PoP shutdown). Blocks up to `STOP_GRACE`;
        a host still starting is killed first."""
        self.closing = True
        for host in list(self.starting):
            host.kill()
        for t in self.spawning:
            t.join(READY_TIMEOUT)
        hosts = [h for h in (self.active, self.standby, *self.draining) if h is not None]
        for host in hosts:
            host.begin_stop()
        deadline = time.monotonic() + STOP_GRACE
        for host in hosts:
            host.finish_stop(deadline - time.monotonic())
