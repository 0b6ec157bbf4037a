"""Counters that never fall when one of ``workers = N`` restarts.

The admin worker serves the sum of every worker's counters (`metrics_merge`). A
worker that restarts counts from 0 again, so the sum fell by what it had counted:
Prometheus reads any fall as a reset to zero and adds the whole new value to
``increase()`` and ``rate()`` (40 requests read as 107 after one worker was killed).
prometheus_client's multiprocess mode keeps a dead process's counts; so does this:
what a worker's previous life counted is carried into the sum from then on.

Each source (the admin worker itself, and each other worker by index) is known by
its process id. When a source answers with another pid, the counter, histogram
and summary samples it last reported are carried. The state is saved beside the
PoP's data at each scrape, so a restart of the admin worker itself carries the
same way; a new PoP (another parent process) starts from zero, as its counters do.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import msgspec
from prometheus_client.metrics_core import Metric

log = logging.getLogger("edgefn.metrics")

MONOTONIC = frozenset({"counter", "histogram", "summary"})
SKIPPED_SUFFIXES = ("_created",)  # a timestamp, not a count
# (family name, family type, documentation, unit, sample name, sorted labels)
type Key = tuple[str, str, str, str, str, tuple[tuple[str, str], ...]]


class _Saved(msgspec.Struct):
    parent: int
    carried: list[tuple[Key, float]]
    seen: dict[str, tuple[int, list[tuple[Key, float]]]]


class Continuity:
    """Per scrape: `follow` each source's families, then `carried_families` is what
    to add to their sum; `save` keeps it for a restarted admin worker."""

    def __init__(self, path: Path | None, parent: int | None = None) -> None:
        """`path`: where the state is kept (None: in memory only); `parent`: the
        pid the workers share as their parent (a saved state of another is a
        previous PoP's, not read)."""
        self.path = path
        self.parent = os.getppid() if parent is None else parent
        self.carried: dict[Key, float] = {}
        self.seen: dict[str, tuple[int, dict[Key, float]]] = {}
        if path is not None:
            self._load(path)

    def follow(self, source: str, pid: int, families: list[Metric]) -> None:
        """`source` (its pid now) reported `families`; a new pid carries what the
        previous one reported last."""
        previous = self.seen.get(source)
        if previous is not None and previous[0] != pid:
            for key, value in previous[1].items():
                self.carried[key] = self.carried.get(key, 0.0) + value
        self.seen[source] = (pid, _monotonic(families))

    def carried_families(self) -> list[Metric]:
        """The carried samples as families, to be summed with the live ones."""
        families: dict[str, Metric] = {}
        for (name, typ, doc, unit, sample, labels), value in self.carried.items():
            family = families.get(name)
            if family is None:
                family = families[name] = Metric(name, doc, typ, unit)
            family.add_sample(sample, dict(labels), value)
        return list(families.values())

    def save(self) -> None:
        """Write the state (atomically); a failure is logged, the scrape goes on."""
        if self.path is None:
            return
        state = _Saved(self.parent, list(self.carried.items()),
                       {s: (pid, list(values.items())) for s, (pid, values) in self.seen.items()})
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_bytes(msgspec.json.encode(state))
            os.replace(tmp, self.path)
        except OSError as e:
            log.warning("cannot save the metrics' continuity to %s: %s", self.path, e)

    def _load(self, path: Path) -> None:
        try:
            state = msgspec.json.decode(path.read_bytes(), type=_Saved)
        except FileNotFoundError:
            return
        except (OSError, msgspec.MsgspecError) as e:
            log.warning("ignoring the metrics' continuity in %s: %s", path, e)
            return
        if state.parent != self.parent:  # a previous PoP's: its counters are gone
            return
        self.carried = {_key(k): v for k, v in state.carried}
        self.seen = {s: (pid, {_key(k): v for k, v in values})
                     for s, (pid, values) in state.seen.items()}


def _monotonic(families: list[Metric]) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for f in families:
        if f.type not in MONOTONIC:
            continue
        for s in f.samples:
            if not s.name.endswith(SKIPPED_SUFFIXES):
                out[(f.name, f.type, f.documentation, f.unit, s.name,
                     tuple(sorted(s.labels.items())))] = s.value
    return out


def _key(raw: Any) -> Key:
    """A key read back from JSON (lists where tuples were)."""
    name, typ, doc, unit, sample, labels = raw
    return (name, typ, doc, unit, sample, tuple((str(k), str(v)) for k, v in labels))
