"""One scrape for a PoP of ``workers = N``: each worker counts its own requests
(`RequestMetrics` is per process), so the admin worker asks the others for their
metric families at each scrape (over the control channel: `runtime.workers.control`)
and serves the sum.

How series merge (as prometheus_client's multiprocess mode does for its default
modes): samples with the same name and labels are added up. That is exact for
counters and histograms (every worker uses the same buckets), and for the gauges
the workers report (``edgefn_isolates``: the PoP's isolates in each state). The
model worker's figures (``edgefn_ai_num_requests_running`` ...) come from the admin
worker only: the model worker is one process, and only the admin worker asks it.

A worker that does not answer within ``[metrics] worker_timeout`` counts with its
last answer in that scrape (`PopMetrics`: never waited for longer, never killed for
it) and in ``edgefn_scrape_workers_missing``; what a worker that restarted had counted
is carried into the sum (`runtime.observe.metrics_continuity`): a sum that fell
reads as a reset to Prometheus, which then counts the whole sum again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

type Wire = list[list[Any]]  # [[name, doc, type, unit, [[sample, {labels}, value], ...]], ...]


def to_wire(families: Iterable[Metric]) -> Wire:
    """Metric families as JSON-able lists (what a worker sends the admin worker)."""
    return [[f.name, f.documentation, f.type, f.unit,
             [[s.name, s.labels, s.value] for s in f.samples]] for f in families]


def from_wire(wire: Wire) -> list[Metric]:
    """The families `to_wire` made. Raises ValueError (or TypeError) for lists that
    are not families."""
    out = []
    for name, doc, typ, unit, samples in wire:
        family = Metric(name, doc, typ, unit)
        for sample, labels, value in samples:
            family.add_sample(str(sample), {str(k): str(v) for k, v in labels.items()},
                              float(value))
        out.append(family)
    return out


def merge(groups: Iterable[Iterable[Metric]]) -> list[Metric]:
    """One family per name, each sample the sum of the samples with its name and
    labels across `groups`; families and series in the order first seen."""
    families: dict[str, Metric] = {}
    sums: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    labels_of: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, str]] = {}
    for group in groups:
        for family in group:
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation,
                                               family.type, family.unit)
                sums[family.name] = {}
            into = sums[family.name]
            for s in family.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                into[key] = into.get(key, 0.0) + s.value
                labels_of.setdefault(key, s.labels)
    for name, family in families.items():
        for key, value in sums[name].items():
            family.add_sample(key[0], labels_of[key], value)
    return list(families.values())


class Merged:
    """What the encoder reads for one scrape: this worker's families (`local`)
    plus the other workers' (`peers`), summed; `missing` workers did not answer."""

    def __init__(self, local: list[Metric], peers: list[list[Metric]], missing: int,
                 base: tuple[str, str, str]) -> None:
        self.local = local
        self.peers = peers
        self.missing = missing
        self.base = base

    def collect(self) -> Iterator[Metric]:
        yield from merge([self.local, *self.peers])
        gauge = GaugeMetricFamily("edgefn_scrape_workers_missing", "Workers whose metrics "
                                  "this scrape lacks (they did not answer in time).",
                                  labels=("pop", "tier", "geo"))
        gauge.add_metric(self.base, self.missing)
        yield gauge
