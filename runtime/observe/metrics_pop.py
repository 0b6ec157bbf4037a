"""`PopMetrics`: one PoP's metrics, in a `CollectorRegistry` of its own (never
prometheus_client's global one: several PoPs run in one test process).

    PopMetrics ─┬─ requests: RequestMetrics   an Observer of every event
                ├─ worker: WorkerFigures      the model worker's figures, per scrape
                ├─ isolates: IsolateMetrics   Python isolates, per scrape
                ├─ FrontMetrics               what the HTTP front refused itself, per scrape
                └─ peers                      ``workers = N``: the other workers' families,
                                              asked at each scrape and summed in
                                              (`runtime.observe.metrics_merge`)
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from edgefn_core.errors import InvalidConfig
from runtime.net.server import ServerState
from runtime.observe.metrics import RequestMetrics
from runtime.observe.metrics_continuity import Continuity
from runtime.observe.metrics_front import FrontMetrics
from runtime.observe.metrics_http import MetricsEndpoint
from runtime.observe.metrics_isolates import IsolateMetrics
from runtime.observe.metrics_merge import Merged, Wire, from_wire
from runtime.observe.metrics_worker import WorkerFigures
from runtime.observe.settings_metrics import MetricsSettings

type WorkerCall = Callable[[], Coroutine[Any, Any, dict[str, Any]]]
# (timeout) -> each other worker's (pid, `to_wire` families), None where it did not answer
type PeersCall = Callable[[float], Awaitable[list[tuple[int, Wire] | None]]]
log = logging.getLogger("edgefn.metrics")


class PopMetrics:
    def __init__(self, pop: str, tier: str, geo: str, settings: MetricsSettings,
                 functions: Callable[[], Iterable[tuple[str, str, Any]]],
                 worker: WorkerCall | None = None) -> None:
        """`functions()`: (name, version, executor) of the deployed functions' live
        versions and canaries; `worker()`: the model worker's snapshot (run on the
        PoP's loop). Raises `InvalidConfig`
        naming ``metrics.token_file`` when that file cannot be read or is empty."""
        base = (pop, tier, geo)
        self.settings = settings
        self.token = settings.token or _read_token(settings.token_file)
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = RequestMetrics(pop, tier, geo, settings.max_series)
        self.isolates = IsolateMetrics(base, functions)
        self.worker_call = worker
        self.worker: WorkerFigures | None = None
        self.peers: PeersCall | None = None  # set before `endpoint` (runtime.app)
        self.last: dict[int, list[Any]] = {}  # each other worker's last decoded families
        # what restarted workers had counted (runtime.app keeps it in the data dir)
        self.continuity = Continuity(None)
        self.pid = os.getpid()
        self.listener: Callable[[], ServerState | None] = lambda: None  # set by runtime.app
        self.registry.register(self.requests)
        self.registry.register(self.isolates)
        self.registry.register(FrontMetrics(base, lambda: self.listener()))

    def endpoint(self, pop_loop: asyncio.AbstractEventLoop | None,
                 admin_token: str | None = None,
                 settle: Callable[[], None] | None = None) -> MetricsEndpoint:
        """What serves ``GET /metrics``; the worker is asked on `pop_loop` (None:
        the loop the endpoint runs on). `admin_token` is accepted besides the
        metrics token (on the admin listener). `settle()` runs on `pop_loop` before
        each scrape (the PoP delivers its events in batches: see
        `runtime.observe.observers`), so a scrape counts every response already sent."""
        if self.worker_call is not None and self.worker is None:
            self.worker = WorkerFigures(self.requests.base, _on(pop_loop, self.worker_call),
                                        self.settings.worker_timeout)
            self.registry.register(self.worker)
        tokens = [self.token] if self.token else []
        if tokens and admin_token:
            tokens.append(admin_token)
        steps = [_on(pop_loop, _coroutine(settle))] if settle is not None else []
        if self.worker is not None:
            steps.append(self.worker.refresh)

        async def before() -> None:
            for step in steps:
                await step()

        return MetricsEndpoint(self.registry, tokens, before if steps else None,
                               self._merged if self.peers is not None else None)

    async def _merged(self) -> CollectorRegistry:
        """This worker's families and the other workers', summed, for one scrape. A
        worker that does not answer (or whose answer does not decode) counts with
        its last answer: left out, its counters fell by all it had counted for one
        scrape and came back, which ``rate()`` and ``increase()`` read as traffic.
        What a restarted worker had counted is carried (`Continuity`), for the
        same reason."""
        assert self.peers is not None
        answers = await self.peers(self.settings.worker_timeout)
        own = list(self.registry.collect())
        self.continuity.follow("0", self.pid, own)
        families, missing = [], 0
        for index, answer in enumerate(answers, start=1):
            if answer is None:  # did not answer in time
                missing += 1
            else:
                try:
                    pid, wire = answer
                    self.last[index] = from_wire(wire)
                    self.continuity.follow(str(index), int(pid), self.last[index])
                except (ValueError, TypeError, AttributeError) as e:
                    log.warning("a worker's metrics did not decode: %r", e)
                    missing += 1
            if index in self.last:
                families.append(self.last[index])
            else:  # none since this worker started: what the saved state says it had
                families.append(self.continuity.stand_in(str(index)))
        families.append(self.continuity.carried_families())
        self.continuity.save()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(Merged(own, families, missing, self.requests.base))
        return registry


def _coroutine(fn: Callable[[], None]) -> Callable[[], Coroutine[Any, Any, None]]:
    async def run() -> None:
        fn()

    return run


def _on[T](loop: asyncio.AbstractEventLoop | None,
           call: Callable[[], Coroutine[Any, Any, T]]) -> Callable[[], Coroutine[Any, Any, T]]:
    """`call`, run on `loop` (None: the caller's loop) when awaited from any loop."""
    async def run() -> T:
        if loop is None or loop is asyncio.get_running_loop():
            return await call()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), loop))

    return run


def _read_token(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidConfig("pop.toml", f"cannot read {path}: {e}", "metrics.token_file") \
            from None
    if len(token) < 16:
        raise InvalidConfig("pop.toml", f"{path} holds no token of at least 16 characters",
                            "metrics.token_file")
    return token
