"""`PopMetrics`: one PoP's metrics, in a `CollectorRegistry` of its own (never
prometheus_client's global one: several PoPs run in one test process).

    PopMetrics ─┬─ requests: RequestMetrics   an Observer of every event
                ├─ worker: WorkerFigures      the model worker's figures, per scrape
                └─ isolates: IsolateMetrics   Python isolates, per scrape
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from edgefn_core.errors import InvalidConfig
from runtime.observe.metrics import RequestMetrics
from runtime.observe.metrics_http import MetricsEndpoint
from runtime.observe.metrics_isolates import IsolateMetrics
from runtime.observe.metrics_worker import WorkerFigures
from runtime.observe.settings_metrics import MetricsSettings

type WorkerCall = Callable[[], Coroutine[Any, Any, dict[str, Any]]]


class PopMetrics:
    def __init__(self, pop: str, tier: str, geo: str, settings: MetricsSettings,
                 functions: Callable[[], Iterable[tuple[str, Any]]],
                 worker: WorkerCall | None = None) -> None:
        """`functions()`: (name, executor) of the deployed functions; `worker()`: the
        model worker's snapshot (run on the PoP's loop). Raises `InvalidConfig`
        naming ``metrics.token_file`` when that file cannot be read or is empty."""
        base = (pop, tier, geo)
        self.settings = settings
        self.token = settings.token or _read_token(settings.token_file)
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = RequestMetrics(pop, tier, geo, settings.max_series)
        self.isolates = IsolateMetrics(base, functions)
        self.worker_call = worker
        self.worker: WorkerFigures | None = None
        self.registry.register(self.requests)
        self.registry.register(self.isolates)

    def endpoint(self, pop_loop: asyncio.AbstractEventLoop | None,
                 admin_token: str | None = None) -> MetricsEndpoint:
        """What serves ``GET /metrics``; the worker is asked on `pop_loop` (None:
        the loop the endpoint runs on). `admin_token` is accepted besides the
        metrics token (on the admin listener)."""
        if self.worker_call is not None and self.worker is None:
            call = self.worker_call

            async def fetch() -> dict[str, Any]:
                if pop_loop is None or pop_loop is asyncio.get_running_loop():
                    return await call()
                return await asyncio.wrap_future(
                    asyncio.run_coroutine_threadsafe(call(), pop_loop))

            self.worker = WorkerFigures(self.requests.base, fetch, self.settings.worker_timeout)
            self.registry.register(self.worker)
        tokens = [self.token] if self.token else []
        if tokens and admin_token:
            tokens.append(admin_token)
        return MetricsEndpoint(self.registry, tokens,
                               self.worker.refresh if self.worker is not None else None)


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
