"""Isolates as Prometheus metrics, read at scrape time from the deployed functions:
Python functions' pools (`runtime.executors.python`: their schedulers' isolate
states and counters) and WASM reactors' instantiation times (filled in C by the
call path: `runtime.executors.wasm.timing`). A function's counters start again
from 0 when a deploy replaces its version (Prometheus' `rate` reads that as a
counter reset).

    edgefn_isolates{function, state="warm|busy"}   idle (ready) and busy interpreters
    edgefn_isolates_recycled_total{function}       interpreters recycled after N jobs
    edgefn_isolates_crashed_total{function}        isolate hosts that died unexpectedly
    edgefn_isolates_sent_ahead_total{function}     requests sent ahead to a busy isolate
    edgefn_isolates_handed_back_total{function}    of those (and others), handed back unstarted
    edgefn_isolates_job_seconds{function}          pipeline "auto": the mean time a request
                                                   holds its isolate, as the scheduler follows it
    edgefn_isolates_pack_room{function}            pipeline "auto": requests a busy isolate is
                                                   packed up to now (0: its requests are long)
    edgefn_wasm_instantiate_seconds{function}      a fresh store + instance per request
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
STATES = {"idle": "warm", "busy": "busy"}


class IsolateMetrics:
    def __init__(self, base: tuple[str, str, str],
                 functions: Callable[[], Iterable[tuple[str, Any]]]) -> None:
        """`functions()`: (name, executor) of every deployed function; executors
        without a ``pool`` (WASM) are skipped."""
        self.base = base
        self.functions = functions

    def collect(self) -> Iterator[Metric]:
        isolates = GaugeMetricFamily("edgefn_isolates", "Python isolates per state.",
                                     labels=(*BASE, "function", "state"))
        recycled = CounterMetricFamily("edgefn_isolates_recycled_total", "Python isolates "
                                       "recycled after their jobs.", labels=(*BASE, "function"))
        crashed = CounterMetricFamily("edgefn_isolates_crashed_total", "Isolate hosts that "
                                      "died unexpectedly.", labels=(*BASE, "function"))
        ahead = CounterMetricFamily("edgefn_isolates_sent_ahead_total", "Python requests "
                                    "sent ahead to a busy isolate (pool.pipeline).",
                                    labels=(*BASE, "function"))
        back = CounterMetricFamily("edgefn_isolates_handed_back_total", "Python requests an "
                                   "isolate handed back unstarted, to run elsewhere.",
                                   labels=(*BASE, "function"))
        job = GaugeMetricFamily("edgefn_isolates_job_seconds", 'Python pipeline = "auto": the '
                                "mean time a request holds its isolate.",
                                labels=(*BASE, "function"))
        room = GaugeMetricFamily("edgefn_isolates_pack_room", 'Python pipeline = "auto": '
                                 "requests a busy isolate is packed up to (0: none, its "
                                 "requests take 0.5 ms or more).", labels=(*BASE, "function"))
        instantiate = HistogramMetricFamily(
            "edgefn_wasm_instantiate_seconds", "Time to a fresh store and instance of a WASM "
            "reactor, per request.", labels=(*BASE, "function"))
        for name, executor in self.functions():
            times = getattr(executor, "instantiate_times", None)
            if times is not None:
                bounds, counts, total = times.snapshot()
                instantiate.add_metric([*self.base, name], _cumulative(bounds, counts), total)
            pool = getattr(executor, "pool", None)
            if pool is None:
                continue
            counts = dict.fromkeys(STATES.values(), 0)
            for isolate in tuple(pool.scheduler.isolates):
                state = STATES.get(isolate.state)
                if state is not None:
                    counts[state] += 1
            for state, n in counts.items():
                isolates.add_metric((*self.base, name, state), n)
            recycled.add_metric((*self.base, name), pool.scheduler.recycled)
            crashed.add_metric((*self.base, name), pool.hosts.crashed)
            ahead.add_metric((*self.base, name), pool.scheduler.sent_ahead)
            back.add_metric((*self.base, name), pool.scheduler.requeued)
            if pool.scheduler.auto:
                job.add_metric((*self.base, name), pool.scheduler.service)
                room.add_metric((*self.base, name), pool.scheduler.room)
        return iter((isolates, recycled, crashed, ahead, back, job, room, instantiate))


def _cumulative(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    """Prometheus' buckets: cumulative counts by ``le``, +Inf last."""
    running, out = 0, []
    for bound, n in zip((*bounds, float("inf")), counts, strict=True):
        running += n
        out.append((floatToGoString(bound), float(running)))
    return out
