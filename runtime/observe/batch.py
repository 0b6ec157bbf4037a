"""`EventBatch`: events handed to the observers together, with what a producer that
made many alike (the native lane, `runtime.pipeline.lane`) already worked out for
them, so that an observer need not look at each event for it:

- `lines`: the access log's text lines of the events, in order (`AccessLog` writes
  them as they are instead of formatting each event), or None;
- `groups`: the events counted per `Group`, events alike in everything the request
  metrics read (`RequestMetrics.observe_batch` adds each group once), or None;
- `plain`: every event is sampled, has no ``waf`` record and at most
  `ring.PLAIN_TEXT` characters of path, query and host together: the ring keeps
  them as they are, without looking at each (`Ring.observe_batch`);
- `deferred`: when given, the events are made only when read, by it, of `records`
  (a sequence: one event each): `events` makes them all (once) for an observer that
  needs them now; the ring keeps the two as one item (`ring.Chunk`) and makes each
  event when it is read.

An observer without ``observe_batch`` gets each event of `events` (`Observers`).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

from runtime.observe.event import Event


class Group(NamedTuple):
    """`n` events with the same target, route, status and method, no error and no
    AI usage."""

    target: str | None
    route: str | None
    status: int
    method: str
    n: int
    bytes_out: int  # theirs, summed
    buckets: list[tuple[int, int]]  # (index in the duration histogram, events), non-zero
    durations: list[float]  # each event's duration_ms / 1000, in the events' order
    decided: list[tuple[dict[str, Any], int]]  # their `decisions`, each with its count


class Deferred(Protocol):
    """What makes events when they are read (of the native lane's records, of the
    other workers' undecoded events)."""

    def events(self, records: Any) -> list[Event]:
        """The events of `records` (a sequence, or a list of some of its items), in
        their order."""
        ...


class EventBatch:
    """Events in order (`events`), with their access-log lines and metric groups
    when the producer made them (None otherwise)."""

    __slots__ = ("_events", "deferred", "groups", "line_format", "lines", "n", "plain",
                 "records")

    def __init__(self, events: list[Event], lines: bytes | None = None,
                 groups: list[Group] | None = None, plain: bool = False,
                 line_format: str = "text") -> None:
        """`line_format`: how `lines` are written, ``text`` or ``json`` (the access
        log's formats)."""
        self._events: list[Event] | None = events
        self.lines, self.groups, self.plain = lines, groups, plain
        self.line_format = line_format
        self.n = len(events)
        self.deferred: Deferred | None = None
        self.records: Any = ()

    @classmethod
    def later(cls, deferred: Deferred, records: Any, lines: bytes | None,
              groups: list[Group] | None, line_format: str = "text") -> EventBatch:
        """A `plain` batch of the events `deferred` makes of `records` (a sequence, an
        event each, in order), made when read."""
        batch = cls([], lines, groups, True, line_format)
        batch._events, batch.n = None, len(records)
        batch.deferred, batch.records = deferred, records
        return batch

    @property
    def events(self) -> list[Event]:
        if self._events is None:
            assert self.deferred is not None
            self._events = self.deferred.events(self.records) if self.records else []
        return self._events

    def __len__(self) -> int:
        return self.n
