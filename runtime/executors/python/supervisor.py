"""Supervision of one function version's isolate-host processes.

The supervisor keeps an active host and, if the pool wants one, a pre-warmed
standby. When the active host dies (a segfault in ctypes, an isolate stuck in
native code past its limit) its jobs fail, the standby takes over at once (a
new generation for the scheduler) and a new standby is started in the
background. Stopping is parallel: every host's stdin closes first, then they
share one grace period.
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
        self.closing = False  # the PoP is shutting down: abort hosts still starting
        self.stopped = False
        # Per-host state
        self.active: Host | None = None
        self.standby: Host | None = None
        self.spawning: list[threading.Thread] = []
        self.starting: set[Host] = set()  # spawned, not ready yet

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
        active = self.active
        if (active is not None and isolate.generation == active.generation
                and self.standby is not None and not self.standby.dead):
            self._promote()
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
        """Fail its jobs, promote the standby, and start a new standby."""
        log.warning("%s: isolate host %d died (%s)", self.cfg.label, host.pid, why)
        host.fail_jobs(why)
        host.stop()
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

    def _replace(self) -> None:
        """Start a host in the background: the new active if there is none, else a standby."""
        self.replacements += 1
        loop = self.loop
        assert loop is not None

        def spawn() -> None:
            try:
                host = self._spawn()
            except Exception as e:
                if not self.closing:
                    log.error("%s: cannot restart its isolate host: %s", self.cfg.name, e)
                return
            try:
                if self.scheduler.retired:
                    raise RuntimeError("retired meanwhile")
                loop.call_soon_threadsafe(self._adopt, host)
            except RuntimeError:  # the pool was retired or the loop closed meanwhile
                host.stop()

        t = threading.Thread(target=spawn, name="edgefn-host-spawn", daemon=True)
        self.spawning = [s for s in self.spawning if s.is_alive()] + [t]
        t.start()

    def _adopt(self, host: Host) -> None:
        if self.scheduler.retired:
            return self._stop_later(host)
        assert self.loop is not None
        host.attach(self.loop)
        if self.active is None:
            self.active = host
            self.scheduler.use(host.generation, host.isolates)
            if self.want_standby:
                self._replace()
        elif self.standby is None:
            self.standby = host
        else:  # a standby arrived meanwhile: one is enough
            self._stop_later(host)

    # -- stopping -------------------------------------------------------------------------------
    def _stop_later(self, host: Host) -> None:
        host.close_isolates()  # loop state, on the loop's thread
        threading.Thread(target=host.stop, daemon=True).start()

    def stop_hosts(self) -> None:
        """Stop the hosts without blocking (a retired pool drained; on the loop's thread)."""
        if self.stopped:
            return
        self.stopped = True
        for host in (self.active, self.standby):
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
        hosts = [h for h in (self.active, self.standby) if h is not None]
        for host in hosts:
            host.begin_stop()
        deadline = time.monotonic() + STOP_GRACE
        for host in hosts:
            host.finish_stop(deadline - time.monotonic())
