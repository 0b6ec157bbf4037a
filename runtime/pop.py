"""The PoP: everything one `PopConfig` describes, built in one place.

    config ─┬─ stores (KV, vectors)        bound to functions through bindings
            ├─ ai (model worker service)   when [ai] is enabled
            ├─ keys (API keys, hashed in DATA/keys.json)
            ├─ registry (deployed functions, router)
            ├─ http_cache (function responses; DATA/cache/http) when [http_cache] is on
            ├─ stores.ai_cache (model calls' answers, in memory) with a model worker
            ├─ observers (the events stage's fan-out of every request's `Event`: the ring,
            │  the dashboard's aggregator once watched, the JSONL file, metrics)
            ├─ tracer (OpenTelemetry spans of every request, an observer) when
            │  [tracing] is on
            ├─ pipeline (the stages, in config order): the public listener's app
            ├─ lane (the native lane: eligible targets' requests served in C)
            └─ metrics (Prometheus, `runtime.observe.metrics_pop`) when [metrics] is on

Nothing is patched in after construction; `runtime.app` starts and stops it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from edgefn_core.errors import OutOfRegion
from runtime.ai.service import AIService
from runtime.bindings import Stores
from runtime.cache.http.cache import HttpCache
from runtime.config import HttpCacheStage, PopConfig
from runtime.executors.base import WasmEngine
from runtime.executors.python import frame_budget, supervisor
from runtime.functions.manifest import Manifest
from runtime.functions.registry import Deployment, Registry
from runtime.observe.dashboard.aggregator import Rolling
from runtime.observe.metrics_pop import PopMetrics
from runtime.observe.observers import Observers
from runtime.observe.ring import Ring
from runtime.observe.samples import Sampler
from runtime.observe.sink import JsonlSink
from runtime.pipeline import build, lane, warm
from runtime.pipeline.lane import NativeLane
from runtime.security.keys import KeyRing, KeyStore
from runtime.security.settings import merge

if TYPE_CHECKING:
    from runtime.observe.tracing import Tracer

log = logging.getLogger("edgefn.pop")
# seconds a switch waits for a retired version's isolate hosts to exit (`PoP.warm`)
RETIRED_WAIT = 0.25


class PoP:
    def __init__(self, config: PopConfig) -> None:
        self.config = config
        self.data_dir = config.data_dir
        self.ai: AIService | None = None
        if config.ai.enabled:
            self.ai = AIService(self.data_dir, config.ai.worker_config, config.ai.socket,
                                config.ai.fallback)
        self.keys = KeyRing(KeyStore(self.data_dir))  # API keys (`edgefn keys`)
        self.stores = Stores(self.data_dir, self.ai, build.token_budgets(config),
                             config.ai_cache,  # stores.ai_cache: the AI caches (with `ai`)
                             config.residency, config.name, config.stores.binding_threads)
        self.stores.kv_quota = config.stores.kv_owner_quota_mb << 20
        self.stores.vectors_quota = config.stores.vectors_owner_quota_mb << 20
        self.stores.private_hosts = config.fetch.hosts()
        self.wasm = WasmEngine(self.data_dir / "cache",
                               keep_resident=config.wasm.keep_resident_kib << 10,
                               # PoP-wide: each of `workers` processes has its part
                               thread_memory_mb=max(64, config.wasm.thread_memory_mb()
                                                    // config.worker_count()))
        # PoP-wide as the WASM threads' memory: each worker's loop its part
        frame_budget.configure(max(64, config.python.frame_memory_mb()
                                   // config.worker_count()) << 20)
        self.registry = Registry(self.data_dir, self.wasm, self.stores,
                                 build.reserved_paths(config), config.insecure_python,
                                 self._vet)
        self.http_cache: HttpCache | None = None
        self.restored = False  # deployed functions are loaded (`runtime.app` sets it)
        events = config.events
        self.ring = Ring(events.ring_size, events.max_event_bytes)
        self.observers = Observers()  # every request's Event (the `events` stage)
        self.observers.add(self.ring)
        # the dashboard's last 60 s ([dashboard]); it observes from the first login on
        self.dashboard: Rolling | None = Rolling() if config.dashboard.enabled else None
        self.events_file: JsonlSink | None = None
        self.metrics: PopMetrics | None = None
        self.tracer: Tracer | None = None
        self.samples: Sampler | None = None  # [residency.samples]: to central
        try:
            if events.file:
                self.events_file = JsonlSink(self.data_dir / events.file, events.max_bytes,
                                             events.backups)
                self.observers.add(self.events_file)
            if config.metrics.enabled:
                self.metrics = self._metrics()
                self.observers.add(self.metrics.requests)
            if config.tracing.enabled:
                from runtime.observe.tracing import Tracer  # the SDK: only when on

                self.tracer = Tracer(config.name, config.tier, config.geo, config.tracing)
                self.observers.add(self.tracer)
            if config.residency.samples.rate > 0:
                self.samples = Sampler(config.residency.samples, config.residency.secret,
                                       config.region, self.data_dir / "samples" / "out")
                self.observers.add(self.samples)
            if config.http_cache.enabled and any(isinstance(s, HttpCacheStage)
                                                 for s in config.pipeline):
                self.http_cache = HttpCache(config.http_cache, self.data_dir,
                                            writers=config.worker_count())
            self.pipeline = build.build(self)
            # serves the public listener's requests for eligible targets in C
            self.lane: NativeLane | None = lane.for_pop(self)
            self.registry.switched = self.warm
        except BaseException:  # a stage that cannot start (the WAF without rules)
            self.close()
            raise

    async def warm(self, *fns: Deployment) -> None:
        """A quiet warm-up request to each of `fns` through the whole pipeline
        (`runtime.pipeline.warm`): at boot, and after each switch; then the lane's
        table is made for the new routes (`NativeLane.refresh`), and the isolate
        hosts of a retired version with nothing in flight are waited for (at most
        RETIRED_WAIT): their exit, 7-15 ms of the kernel's work each, took 0.2-0.3 ms
        from the first request to the new version when it overlapped it. Never raises."""
        live = self.registry.functions
        await warm.quiet(self.pipeline, list(fns),
                         frozenset(f.label for f in fns if live.get(f.name) is not f))
        if self.lane is not None:
            try:
                self.lane.refresh()
            except Exception:  # its next read makes it again (and says why it fails)
                log.exception("native lane: the table could not be made after a switch")
        if supervisor.stopping():  # a retired version's isolate hosts, exiting
            await asyncio.to_thread(supervisor.wait_stopped, RETIRED_WAIT)

    def watch_dashboard(self) -> None:
        """Make the dashboard's aggregator an observer, if it is not yet, first
        replaying the ring's events of its window: a PoP nobody watches pays nothing
        for it. Call on the PoP's loop (the observers run there)."""
        rolling = self.dashboard
        if rolling is None or rolling in self.observers:
            return
        self.observers.flush()  # events not yet delivered are in neither the ring nor it
        since = rolling.clock() - rolling.window
        for event in self.ring.events.copy():
            if event.ts >= since:
                rolling.observe(event)
        self.observers.add(rolling)

    def _metrics(self) -> PopMetrics:
        """Raises `InvalidConfig` for a metrics token file that cannot be read."""
        ai = self.ai
        return PopMetrics(self.config.name, self.config.tier, self.config.geo,
                          self.config.metrics,
                          self._deployed,
                          ai.client.metrics if ai is not None else None)

    def _deployed(self) -> list[tuple[str, str, Any]]:
        """(name, version, executor) of each live version and canary (metrics)."""
        registry = self.registry
        live = [(n, d.version, d.executor) for n, d in registry.functions.items()]
        return live + [(n, s.fn.version, s.fn.executor) for n, s in registry.canaries.items()]

    def _vet(self, m: Manifest) -> None:
        """Raises `DeployError` for a function asking for a WAF this PoP cannot run,
        `OutOfRegion` for one owned by a tenant pinned to another region ([residency])."""
        home = self.config.residency.tenants.get(m.tenant)
        if home is not None and home != self.config.region:
            raise OutOfRegion(f"function {m.name!r} belongs to tenant {m.tenant!r}, pinned to "
                              f"region {home!r}; PoP {self.config.name!r} is in region "
                              f"{self.config.region or '(none)'!r}")
        if m.waf is not None and m.waf.mode == "block":
            from runtime.security.waf import check_available

            check_available(merge(self.config.waf, m.waf), f"function {m.name!r}")

    def waiting_for(self) -> list[str]:
        """What keeps the PoP from being ready (``/readyz``): empty when ready."""
        waiting = [] if self.restored else ["functions"]
        if self.ai is not None and not self.ai.client.connected.is_set():
            waiting.append("model_worker")
        return waiting

    def close(self) -> None:
        """Release functions and stores (the model worker is closed by `runtime.app`)."""
        self.observers.flush()  # the last loop iteration's events reach the file and traces
        if self.events_file is not None:
            self.events_file.close()
        if self.tracer is not None:
            self.tracer.close()  # exports what is queued
        if self.samples is not None:
            self.samples.close()  # seals the open batch: shipped on the next start
        self.registry.close()
        self.wasm.close()
        self.stores.close()
        if self.http_cache is not None:
            self.http_cache.close()
