"""Isolates as Prometheus metrics, read at scrape time from the deployed functions:
Python functions' pools (`runtime.executors.python`: their schedulers' isolate
states and counters) and WASM reactors' instantiation times (filled in C by the
call path: `runtime.executors.wasm.timing`). Each series is one version's
(``version``: the live one, and a canary's beside it); a new version's counters
start from 0 (a series of its own: `sum by (function)` adds the versions up).

    (each labelled function, version)
    edgefn_isolates{state="warm|busy"}             idle (ready) and busy interpreters
    edgefn_isolates_recycled_total                 interpreters recycled after N jobs
    edgefn_isolates_crashed_total                  isolate hosts that died unexpectedly
    edgefn_isolates_sent_ahead_total               requests sent ahead to a busy isolate
    edgefn_isolates_handed_back_total              of those (and others), handed back unstarted
    edgefn_isolates_job_seconds                    pipeline "auto": the mean time a request
                                                   holds its isolate, as the scheduler follows it
    edgefn_isolates_pack_room                      pipeline "auto": requests a busy isolate is
                                                   packed up to now (0: its requests are long)
    edgefn_wasm_instantiate_seconds                a fresh store + instance per request
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

BASE = ("pop", "tier", "geo")
LABELS = (*BASE, "function", "version")
STATES = {"idle": "warm", "busy": "busy"}


class IsolateMetrics:
    def __init__(self, base: tuple[str, str, str],
                 functions: Callable[[], Iterable[tuple[str, str, Any]]]) -> None:
        """`functions()`: (name, version, executor) of every deployed function's live
        version and canary; executors without a ``pool`` (WASM) are skipped."""
        self.base = base
        self.functions = functions

    def collect(self) -> Iterator[Metric]:
        isolates = GaugeMetricFamily("edgefn_isolates", "Python isolates per state.",
                                     labels=(*LABELS, "state"))
        recycled = CounterMetricFamily("edgefn_isolates_recycled_total", "Python isolates "
                                       "recycled after their jobs.", labels=LABELS)
        crashed = CounterMetricFamily("edgefn_isolates_crashed_total", "Isolate hosts that "
                                      "died unexpectedly.", labels=LABELS)
        ahead = CounterMetricFamily("edgefn_isolates_sent_ahead_total", "Python requests "
                                    "sent ahead to a busy isolate (pool.pipeline).",
                                    labels=LABELS)
        back = CounterMetricFamily("edgefn_isolates_handed_back_total", "Python requests an "
                                   "isolate handed back unstarted, to run elsewhere.",
                                   labels=LABELS)
        job = GaugeMetricFamily("edgefn_isolates_job_seconds", 'Python pipeline = "auto": the '
                                "mean time a request holds its isolate.",
                                labels=LABELS)
        room = GaugeMetricFamily("edgefn_isolates_pack_room", 'Python pipeline = "auto": '
                                 "requests a busy isolate is packed up to (0: none, its "
                                 "requests take 0.5 ms or more).", labels=LABELS)
        instantiate = HistogramMetricFamily(
            "edgefn_wasm_instantiate_seconds", "Time to a fresh store and instance of a WASM "
            "reactor, per request.", labels=LABELS)
        for name, version, executor in self.functions():
            labels = (*self.base, name, version)
            times = getattr(executor, "instantiate_times", None)
            if times is not None:
                bounds, counts, total = times.snapshot()
                instantiate.add_metric(list(labels), _cumulative(bounds, counts), total)
            pool = getattr(executor, "pool", None)
            if pool is None:
                continue
            counts = dict.fromkeys(STATES.values(), 0)
            for isolate in tuple(pool.scheduler.isolates):
                state = STATES.get(isolate.state)
                if state is not None:
                    counts[state] += 1
            for state, n in counts.items():
                isolates.add_metric((*labels, state), n)
            recycled.add_metric(labels, pool.scheduler.recycled)
            crashed.add_metric(labels, pool.hosts.crashed)
            ahead.add_metric(labels, pool.scheduler.sent_ahead)
            back.add_metric(labels, pool.scheduler.requeued)
            if pool.scheduler.auto:
                job.add_metric(labels, pool.scheduler.service)
                room.add_metric(labels, pool.scheduler.room)
        return iter((isolates, recycled, crashed, ahead, back, job, room, instantiate))


def _cumulative(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    """Prometheus' buckets: cumulative counts by ``le``, +Inf last."""
    running, out = 0, []
    for bound, n in zip((*bounds, float("inf")), counts, strict=True):
        running += n
        out.append((floatToGoString(bound), float(running)))
    return out
