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

A producer of many events at once (the native lane) hands them over as one
`EventBatch` (`observe_batch`), in order with the single events: an observer with
an ``observe_batch`` method takes the batch whole (the metrics add its groups, the
access log writes its lines), any other gets its events one by one.
"""

from __future__ import annotations

import logging
from asyncio import AbstractEventLoop
from asyncio import _get_running_loop as running_loop
from collections.abc import Callable, Iterator

from runtime.observe.batch import EventBatch
from runtime.observe.event import Event, Observer

log = logging.getLogger("edgefn.events")
MAX_BATCH = 256  # delivered at once past this many, not to hold a burst's events longer


class Observers:
    """Calls each added observer in order. An observer that raises is logged once
    (with its traceback) and skipped for that event: the request and the other
    observers go on."""

    def __init__(self) -> None:
        self._observers: tuple[Observer, ...] = ()
        self.failed: set[int] = set()  # ids of observers already logged
        self.pending: list[Event | EventBatch] = []
        # events pending are len(pending) + more (a batch is one item of n events)
        self.more = 0
        self.batches = 0  # batches pending
        # per observer: its observe_batch, or None (it gets a batch's events one by one)
        self.batched: tuple[Callable[[EventBatch], None] | None, ...] = ()
        self.line_format: str | None = None
        # what must be observed before the next event: the native lane's records of
        # requests answered before it (`runtime.pipeline.lane`), None when there are none
        self.first: Callable[[], None] | None = None

    def add(self, observer: Observer) -> None:
        self.flush()  # a new observer sees only events that come after it
        self._set((*self.observers, observer))

    def remove(self, observer: Observer) -> None:
        self.flush()
        self._set(tuple(o for o in self.observers if o is not observer))

    @property
    def observers(self) -> tuple[Observer, ...]:
        return self._observers

    @observers.setter
    def observers(self, observers: tuple[Observer, ...]) -> None:
        self._set(observers)

    def _set(self, observers: tuple[Observer, ...]) -> None:
        self._observers = observers
        self.batched = tuple(getattr(o, "observe_batch", None) for o in observers)
        # the format in which the observers take a batch's access-log lines
        # (`EventBatch.lines`: make them so); None when none does, or two differ
        formats = {f for f in (getattr(o, "line_format", None) for o in observers) if f}
        self.line_format = formats.pop() if len(formats) == 1 else None

    def observe(self, event: Event) -> None:
        if self.first is not None:
            self.first()
        pending = self.pending
        pending.append(event)
        if len(pending) == 1:
            loop: AbstractEventLoop | None = running_loop()
            if loop is None:
                self._deliver()
            else:
                loop.call_soon(self._deliver)
        elif len(pending) + self.more >= MAX_BATCH:
            self._deliver()

    def observe_batch(self, batch: EventBatch) -> None:
        """`batch`'s events, delivered as `observe` delivers one (in order with them)."""
        if self.first is not None:
            self.first()
        n = len(batch)
        if not n:
            return
        pending = self.pending
        pending.append(batch)
        self.more += n - 1
        self.batches += 1
        if len(pending) == 1 and n < MAX_BATCH:
            loop: AbstractEventLoop | None = running_loop()
            if loop is None:
                self._deliver()
            else:
                loop.call_soon(self._deliver)
        elif len(pending) + self.more >= MAX_BATCH:
            self._deliver()

    def flush(self) -> None:
        """Deliver the pending events now, the native lane's records first (a
        scheduled delivery then finds none): what reads the observers calls this."""
        if self.first is not None:
            self.first()
        self._deliver()

    def _deliver(self) -> None:
        """Deliver the pending events (the scheduled delivery). Records the lane has
        not drained yet are newer than all of them (`observe` drains them before
        taking an event): they wait for their own drain, which batches them."""
        items = self.pending
        if not items:
            return
        batches, self.pending, self.more, self.batches = self.batches, [], 0, 0
        if not batches:  # single events alone (the Python path's): as they come
            for o in self._observers:
                for item in items:
                    try:
                        o.observe(item)  # type: ignore[arg-type]
                    except Exception:
                        self._failed(o)
            return
        for o, batched in zip(self._observers, self.batched, strict=True):
            for item in items:
                if not isinstance(item, EventBatch):
                    try:
                        o.observe(item)
                    except Exception:
                        self._failed(o)
                elif batched is not None:
                    try:
                        batched(item)
                    except Exception:  # the rest of that batch is lost to `o`
                        self._failed(o)
                else:
                    for event in item.events:
                        self._one(o, event)

    def _one(self, o: Observer, event: Event) -> None:
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
