"""A Python function version's pool of isolates: the parts wired together.

    Pool ── Scheduler (scheduler.py)     which isolate takes a job
        ├── CpuWatch (cpu_watch.py)      limits.cpu_ms, from the kernel's count
        ├── Supervisor (supervisor.py)   active + standby host processes
        │     └── Host (hosts.py)        one isolate-host process
        │           └── Isolate (isolate.py) → Channel (channel.py)
        └── HostCalls (calls.py)         a guest's calls into the PoP

Lifetimes: a `Pool` lives as long as its function version (a deploy makes a new
one and retires the old, which drains and stops). A `Host` is one isolate-host
process; an `Isolate` one subinterpreter's socket; a `Job` one request.
"""

from __future__ import annotations

import asyncio
from typing import Any

from runtime.bindings.fetch import Lineage
from runtime.executors.python.calls import Bindings, HostCalls
from runtime.executors.python.config import HostConfig
from runtime.executors.python.cpu_watch import CpuWatch, outer_limit
from runtime.executors.python.isolate import Isolate
from runtime.executors.python.job import Job
from runtime.executors.python.scheduler import Scheduler
from runtime.executors.python.supervisor import Supervisor
from runtime.net.message import Response

__all__ = ["HostConfig", "Pool"]


class Pool:
    def __init__(self, cfg: HostConfig, standby: bool, warm_request: bytes,
                 bindings: Bindings | None = None) -> None:
        """A pool whose hosts `start` starts. `warm_request` is a sample encoded
        request each isolate runs through its request path (not the handler) before
        it counts as ready."""
        self.cfg = cfg
        self.loop: asyncio.AbstractEventLoop | None = None
        self.cpu = CpuWatch(outer_limit(cfg.cpu_ms, cfg.wall_ms), over=self._overran,
                            excused=self._restarting)
        self.scheduler: Scheduler[Isolate] = Scheduler(
            cfg.wall_ms, cfg.recycle_after, grow=self._grow, stuck=self._stuck,
            drained=self._drained, watch=self.cpu.watch, cpu_ms=cfg.cpu_ms,
            unwatch=self.cpu.forget, depth=cfg.pipeline)
        self.calls = HostCalls(cfg, bindings)
        self.hosts = Supervisor(cfg, standby, warm_request, self.scheduler, self)

    def start(self) -> None:
        """Start the active host (and a warm standby). Blocks; raises `DeployError`
        (also when `close`, from another thread, stopped the start)."""
        self.hosts.start()

    def activate(self) -> None:
        """Attach to the running loop (call on the loop's thread, before routing)."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
            self.hosts.attach(self.loop)

    def submit(self, payload: bytes, tenant: str | None = None,
               lineage: Lineage | None = None) -> asyncio.Future[Response]:
        """Run a request on an idle isolate (waiting for one if all are busy), now;
        its response to come.

        That raises `FunctionError`: the guest's own errors, `wall_limit` (504) when
        no answer came in time, `crash` (502) when its host died, `bad_response`
        (502) for a response over `limits.max_response_mb`, `replaced` (503) when
        this version's hosts had already stopped (see `Scheduler.submit`), or its
        isolate stopped before running it and none is left (`Scheduler.requeue`).
        """
        assert self.loop is not None, "pool not activated"
        job = Job(self.loop, payload, tenant, lineage)
        self.scheduler.submit(job)
        return job.future

    def submit_frame(self, frame: bytes, lineage: Lineage | None = None
                     ) -> asyncio.Future[Response | bytes]:
        """`submit` of a request the native lane encoded and framed (`frame`: the
        whole REQUEST frame), whose whole response comes back as the guest's
        RESPONSE frame's payload (bytes, neither decoded nor checked: `response_of`
        does that), a streamed one as a `Response`. Raises as `submit` does."""
        assert self.loop is not None, "pool not activated"
        job = Job(self.loop, frame, None, lineage, framed=True, raw=True)
        self.scheduler.submit(job)
        return job.future

    # -- isolate events (`isolate.Events`) ------------------------------------------------------
    def started(self, isolate: Isolate) -> None:
        self.scheduler.started(isolate)

    def begun(self, isolate: Isolate, job: Job) -> None:
        self.scheduler.begun(isolate, job)

    def finished(self, isolate: Isolate) -> None:
        self.scheduler.finished(isolate)
        self.hosts.finished(isolate)

    def call(self, isolate: Isolate, msg: dict[str, Any]) -> None:
        self.calls.handle(isolate, msg)

    def retiring(self, isolate: Isolate, why: str) -> None:
        self.hosts.retiring(isolate, why)

    def requeue(self, isolate: Isolate, job: Job) -> None:
        self.scheduler.requeue(job)

    # -- scheduler callbacks ---------------------------------------------------------------------
    def _grow(self, isolate: Isolate) -> None:
        self.hosts.grow(isolate)

    def _stuck(self, isolate: Isolate, job: Job) -> None:
        self.hosts.stuck(isolate, job)

    def _drained(self) -> None:
        self.hosts.stop_hosts()

    def _overran(self, job: Job) -> None:
        self.scheduler.overran(job)

    def _restarting(self, job: Job) -> bool:
        """Whether `job`'s host asked to be replaced: its thread may be starting a fresh
        interpreter under it (`cpu_watch`)."""
        return isinstance(job.isolate, Isolate) and job.isolate.owner.retiring

    # -- lifecycle -------------------------------------------------------------------------------
    def retire(self) -> None:
        """Stop taking requests; stop the hosts once in-flight requests finish."""
        self.scheduler.retire()

    def close(self) -> None:
        """Stop everything now (PoP shutdown)."""
        self.scheduler.retired = True
        self.cpu.close()
        self.hosts.close()
