"""The workers' shared table of rate-limit windows (``workers = N``: see
runtime/security/ratelimit/native_src/counters_table.c.h) as Prometheus metrics,
read from the table at scrape time. Served by the admin worker alone: the table is
one for the PoP, so the other workers' copies of it would be summed N times.

    edgefn_ratelimit_table_evictions_total   live windows given up for another key
                                             (a group's 8 slots were full): past a
                                             trickle, raise ``[ratelimit] shared_keys``
    edgefn_ratelimit_table_recovered_total   group locks taken over from a worker that
                                             died holding one
    edgefn_ratelimit_table_keys              the windows it can hold (8 a group)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

BASE = ("pop", "tier", "geo")


class TableMetrics:
    def __init__(self, base: tuple[str, str, str], stats: Callable[[], dict[str, Any] | None]
                 ) -> None:
        """`stats()`: the table's ``{"evictions", "recovered", "groups"}`` (a shared
        `Counters`' `table_stats`), None without one."""
        self.base = base
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self.stats()
        if stats is None:
            return
        labels = list(self.base)
        evictions = CounterMetricFamily(
            "edgefn_ratelimit_table_evictions", "Live rate-limit windows the workers' shared "
            "table gave up for another key (its group was full).", labels=BASE)
        evictions.add_metric(labels, stats["evictions"])
        recovered = CounterMetricFamily(
            "edgefn_ratelimit_table_recovered", "Locks of the shared table taken over from a "
            "worker that died holding one.", labels=BASE)
        recovered.add_metric(labels, stats["recovered"])
        keys = GaugeMetricFamily("edgefn_ratelimit_table_keys", "Windows the workers' "
                                 "shared table can hold.", labels=BASE)
        keys.add_metric(labels, 8 * stats["groups"])
        yield evictions
        yield recovered
        yield keys
