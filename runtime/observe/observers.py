"""`Observers`: the fan-out the ``events`` stage hands every event to (the ring,
the JSONL file, and whatever other parts add: metrics, traces).

Events are delivered in batches: the first event of a batch schedules one
delivery on the running loop (``call_soon``), so it runs right after the
callback that answered the request, before the loop polls for I/O again; every
event of that loop iteration joins it. Each observer then takes the whole batch
in a row, which keeps its code and data hot in the CPU's caches: on a loaded PoP
this halves what the metrics cost per request (bench/bench_observe_inprocess.py).
Outside a running loop (a unit test calling the pipeline directly) an event is
delivered at once.
"""

from __future__ import annotations

import logging
from asyncio import AbstractEventLoop
from asyncio import _get_running_loop as running_loop
from collections.abc import Callable, Iterator

from runtime.observe.event import Event, Observer

log = logging.getLogger("edgefn.events")
MAX_BATCH = 256  # delivered at once past this many, not to hold a burst's events longer


class Observers:
    """Calls each added observer in order. An observer that raises is logged once
    (with its traceback) and skipped for that event: the request and the other
    observers go on."""

    def __init__(self) -> None:
        self.observers: tuple[Observer, ...] = ()
        self.failed: set[int] = set()  # ids of observers already logged
        self.pending: list[Event] = []
        # what must be observed before the next event: the native lane's records of
        # requests answered before it (`runtime.pipeline.lane`), None when there are none
        self.first: Callable[[], None] | None = None

    def add(self, observer: Observer) -> None:
        self.flush()  # a new observer sees only events that come after it
        self.observers = (*self.observers, observer)

    def remove(self, observer: Observer) -> None:
        self.flush()
        self.observers = tuple(o for o in self.observers if o is not observer)

    def observe(self, event: Event) -> None:
        if self.first is not None:
            self.first()
        pending = self.pending
        pending.append(event)
        if len(pending) == 1:
            loop: AbstractEventLoop | None = running_loop()
            if loop is None:
                self.flush()
            else:
                loop.call_soon(self.flush)
        elif len(pending) >= MAX_BATCH:
            self.flush()

    def flush(self) -> None:
        """Deliver the pending events now (a scheduled delivery then finds none)."""
        if self.first is not None:
            self.first()
        events = self.pending
        if not events:
            return
        self.pending = []
        for o in self.observers:
            for event in events:
                try:
                    o.observe(event)
                except Exception:
                    self._failed(o)

    def _failed(self, o: Observer) -> None:
        if id(o) not in self.failed:
            self.failed.add(id(o))
            log.exception("event observer %r failed (logged once; it keeps being called)", o)

    def __iter__(self) -> Iterator[Observer]:
        return iter(self.observers)

    def __len__(self) -> int:
        return len(self.observers)
