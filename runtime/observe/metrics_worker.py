"""The model worker's own figures (`gpu_worker.metrics.Metrics.snapshot`, what
`edgefn ai metrics` prints) as Prometheus gauges and counters.

`WorkerFigures.refresh` is awaited by the metrics endpoint before each scrape: it
asks the worker with a short timeout, and a worker that is slow or gone leaves
the last figures in place (``edgefn_ai_worker_up`` 0, and their age grows), so a
scrape never waits longer than `timeout`. The worker keeps one set of figures
for all its models, so these have no model label.

    metric (vLLM's name it maps to)
    edgefn_ai_num_requests_running   (vllm:num_requests_running)
    edgefn_ai_num_requests_waiting   (vllm:num_requests_waiting)
    edgefn_ai_batch_size             sequences in the largest decode step since the
                                     previous scrape (no vLLM equivalent)
    edgefn_ai_busy_fraction          share of the time since the previous scrape spent
                                     decoding: the saturation figure (no vLLM equivalent;
                                     vllm:kv_cache_usage_perc is the nearest)
    edgefn_ai_worker_tokens_total, edgefn_ai_worker_prompt_tokens_total,
    edgefn_ai_worker_requests_total, edgefn_ai_worker_errors_total
                                     every model call, the ``ai`` binding's included
    edgefn_ai_worker_decode_calls_total
                                     llama.cpp decode calls: tokens_total over it is
                                     the tokens a call yields (a batch mixing LoRA
                                     adapters is one call per adapter on a stock
                                     llama.cpp, one on edgefn's patched build)
    edgefn_ai_worker_preemptions_total
                                     running sequences that gave up their slot (the
                                     KV cache filled, another client waited, or a slow
                                     reader held a slot others waited for)
    edgefn_ai_worker_recomputes_total (vllm:num_preemptions_total)
                                     preempted sequences whose KV cells were taken
                                     back (a preempted one keeps them while they fit):
                                     each is recomputed when readmitted
    edgefn_ai_worker_up, edgefn_ai_worker_figures_age_seconds
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger("edgefn.metrics")
BASE = ("pop", "tier", "geo")
GAUGES = (("edgefn_ai_num_requests_running", "running_batch",
           "Sequences the worker is decoding (vllm:num_requests_running)."),
          ("edgefn_ai_num_requests_waiting", "queue_depth",
           "Requests waiting for a slot (vllm:num_requests_waiting)."),
          ("edgefn_ai_batch_size", "running_batch_peak",
           "Sequences in the largest decode step since the previous scrape."),
          ("edgefn_ai_busy_fraction", "busy_fraction",
           "Share of the time since the previous scrape spent decoding (saturation)."))
COUNTERS = (("edgefn_ai_worker_tokens_total", "tokens_total", "Tokens the worker generated."),
            ("edgefn_ai_worker_prompt_tokens_total", "prompt_tokens_total",
             "Prompt tokens the worker read."),
            ("edgefn_ai_worker_requests_total", "requests_total", "Model calls the worker ran."),
            ("edgefn_ai_worker_errors_total", "errors_total", "Model calls that failed."),
            ("edgefn_ai_worker_decode_calls_total", "decode_calls_total",
             "llama.cpp decode calls the worker made."),
            ("edgefn_ai_worker_preemptions_total", "preemptions_total",
             "Running sequences that gave up their slot (preempted)."),
            ("edgefn_ai_worker_recomputes_total", "recomputes_total",
             "Preempted sequences whose KV cells were dropped, recomputed later."))


class WorkerFigures:
    def __init__(self, base: tuple[str, str, str],
                 fetch: Callable[[], Awaitable[dict[str, Any]]], timeout: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`fetch()` returns the worker's snapshot (it may raise anything: the worker
        is a separate process)."""
        self.base = base
        self.fetch = fetch
        self.timeout = timeout
        self.clock = clock
        self.last: dict[str, Any] | None = None
        self.at = 0.0
        self.up = False

    async def refresh(self) -> None:
        """Ask the worker, waiting at most `timeout`; keeps the last figures if it
        does not answer. Never raises (but for cancellation)."""
        try:
            snapshot = await asyncio.wait_for(self.fetch(), self.timeout)
        except Exception as e:  # slow, dead, restarting: the last figures stay
            log.debug("model worker figures: %r", e)
            self.up = False
            return
        if isinstance(snapshot, dict):
            self.last, self.at, self.up = snapshot, self.clock(), True

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("edgefn_ai_worker_up", "1 if the model worker answered the "
                               "last scrape in time.", labels=BASE)
        up.add_metric(self.base, 1.0 if self.up else 0.0)
        yield up
        last = self.last
        if last is None:
            return
        age = GaugeMetricFamily("edgefn_ai_worker_figures_age_seconds", "Age of the model "
                                "worker's figures below.", labels=BASE)
        age.add_metric(self.base, max(0.0, self.clock() - self.at))
        yield age
        for name, key, doc in GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=BASE)
            gauge.add_metric(self.base, float(last.get(key, 0)))
            yield gauge
        for name, key, doc in COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=BASE)
            counter.add_metric(self.base, float(last.get(key, 0)))
            yield counter
