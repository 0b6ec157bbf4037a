"""`Observers`: the fan-out the ``events`` stage hands every event to (the ring,
the JSONL file, and whatever other parts add: metrics, traces)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from runtime.observe.event import Event, Observer

log = logging.getLogger("edgefn.events")


class Observers:
    """Calls each added observer in order. An observer that raises is logged once
    (with its traceback) and skipped for that event: the request and the other
    observers go on."""

    def __init__(self) -> None:
        self.observers: tuple[Observer, ...] = ()
        self.failed: set[int] = set()  # ids of observers already logged

    def add(self, observer: Observer) -> None:
        self.observers = (*self.observers, observer)

    def remove(self, observer: Observer) -> None:
        self.observers = tuple(o for o in self.observers if o is not observer)

    def observe(self, event: Event) -> None:
        for o in self.observers:
            try:
                o.observe(event)
            except Exception:
                if id(o) not in self.failed:
                    self.failed.add(id(o))
                    log.exception("event observer %r failed (logged once; it keeps being "
                                  "called)", o)

    def __iter__(self) -> Iterator[Observer]:
        return iter(self.observers)

    def __len__(self) -> int:
        return len(self.observers)
