"""Counters that never fall when one of ``workers = N`` restarts.

The admin worker serves the sum of every worker's counters (`metrics_merge`). A
worker that restarts counts from 0 again, so the sum fell by what it had counted:
Prometheus reads any fall as a reset to zero and adds the whole new value to
``increase()`` and ``rate()`` (40 requests read as 107 after one worker was killed).
prometheus_client's multiprocess mode keeps a dead process's counts; so does this:
what a worker's previous life counted is carried into the sum from then on.

Each source (the admin worker itself, and each other worker by index) is known by
its process id. When a source answers with another pid, the counter, histogram
and summary samples it last reported are carried; one that does not answer counts
with what it reported last (`stand_in`), its previous life's too. The state is
saved beside the PoP's data at each scrape (read at the first scrape, off the PoP's
loop), so a restart of the admin worker itself carries the same way; a new PoP
(another parent process) starts from zero, as its counters do.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec
from prometheus_client.metrics_core import Metric

log = logging.getLogger("edgefn.metrics")

MONOTONIC = frozenset({"counter", "histogram", "summary"})
SKIPPED_SUFFIXES = ("_created",)  # a timestamp, not a count
type Labels = tuple[tuple[str, str], ...]
type Key = tuple[str, str, Labels]  # (family name, sample name, sorted labels)
type Values = dict[Key, float]
# saved: family -> sample -> [(labels, value)] (names written once, not per sample)
type Saved = dict[str, dict[str, list[tuple[dict[str, str], float]]]]


class _State(msgspec.Struct):
    parent: str  # `parent_id`
    meta: dict[str, tuple[str, str, str]]  # family -> (type, documentation, unit)
    carried: Saved
    seen: dict[str, tuple[int, Saved]]


class Continuity:
    """Per scrape: `follow` each source that answered, `stand_in` for one that did
    not, then `carried_families` is what to add to the sum; `save` keeps it all for
    a restarted admin worker."""

    def __init__(self, path: Path | None, parent: str | None = None) -> None:
        """`path`: where the state is kept (None: in memory only), read at the first
        scrape; `parent`: the workers' parent (`parent_id`; a saved state of another
        is a previous PoP's, not read)."""
        self.path = path
        self.parent = parent_id() if parent is None else parent
        self.meta: dict[str, tuple[str, str, str]] = {}
        self.carried: Values = {}
        self.seen: dict[str, tuple[int, Values]] = {}
        self.loaded = path is None

    def follow(self, source: str, pid: int, families: list[Metric]) -> None:
        """`source` (its pid now) reported `families`; a new pid carries what the
        previous one reported last."""
        self._load()
        previous = self.seen.get(source)
        if previous is not None and previous[0] != pid:
            for key, value in previous[1].items():
                self.carried[key] = self.carried.get(key, 0.0) + value
        self.seen[source] = (pid, self._monotonic(families))

    def stand_in(self, source: str) -> list[Metric]:
        """What `source` reported last, for a scrape it does not answer (the admin
        worker, restarted, has no answer of its own from it)."""
        self._load()
        seen = self.seen.get(source)
        return self._families(seen[1]) if seen is not None else []

    def carried_families(self) -> list[Metric]:
        """The carried samples as families, to be summed with the live ones."""
        return self._families(self.carried)

    def save(self) -> None:
        """Write the state (atomically); a failure is logged, the scrape goes on."""
        if self.path is None:
            return
        state = _State(self.parent, self.meta, _saved(self.carried),
                       {s: (pid, _saved(values)) for s, (pid, values) in self.seen.items()})
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:  # labels hold tenants and routes: the PoP's to read
                f.write(msgspec.json.encode(state))
            os.replace(tmp, self.path)
        except OSError as e:
            log.warning("cannot save the metrics' continuity to %s: %s", self.path, e)

    def _load(self) -> None:
        if self.loaded:
            return
        self.loaded = True
        assert self.path is not None
        try:
            state = msgspec.json.decode(self.path.read_bytes(), type=_State)
        except FileNotFoundError:
            return
        except (OSError, msgspec.MsgspecError) as e:
            log.warning("ignoring the metrics' continuity in %s: %s", self.path, e)
            return
        if state.parent != self.parent:  # a previous PoP's: its counters are gone
            return
        self.meta = dict(state.meta)
        self.carried = _values(state.carried)
        self.seen = {s: (pid, _values(saved)) for s, (pid, saved) in state.seen.items()}

    def _monotonic(self, families: list[Metric]) -> Values:
        out: Values = {}
        for f in families:
            if f.type not in MONOTONIC:
                continue
            self.meta[f.name] = (f.type, f.documentation, f.unit)
            for s in f.samples:
                if not s.name.endswith(SKIPPED_SUFFIXES):
                    out[(f.name, s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def _families(self, values: Values) -> list[Metric]:
        families: dict[str, Metric] = {}
        for (name, sample, labels), value in values.items():
            family = families.get(name)
            if family is None:
                typ, doc, unit = self.meta.get(name, ("counter", "", ""))
                family = families[name] = Metric(name, doc, typ, unit)
            family.add_sample(sample, dict(labels), value)
        return list(families.values())


def parent_id() -> str:
    """The workers' parent: its pid and start time (in a container the PoP's parent is
    pid 1 at every start, so the pid alone took a new PoP's for the previous one's)."""
    ppid = os.getppid()
    try:
        with open(f"/proc/{ppid}/stat", "rb") as f:
            started = f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        started = "?"
    return f"{ppid}:{started}"


def _saved(values: Values) -> Saved:
    out: Saved = {}
    for (name, sample, labels), value in values.items():
        out.setdefault(name, {}).setdefault(sample, []).append((dict(labels), value))
    return out


def _values(saved: Saved) -> Values:
    return {(name, sample, tuple(sorted((str(k), str(v)) for k, v in labels.items()))): value
            for name, samples in saved.items() for sample, rows in samples.items()
            for labels, value in rows}
