"""`Observers` delivers events in batches, one per loop iteration, each event to
every observer exactly once and in order."""

import asyncio
import logging

from runtime.observe import observers as observers_module
from runtime.observe.event import Event
from runtime.observe.observers import Observers
from tests.support import own_records


def event(n: int) -> Event:
    return Event(ts=float(n), rid=str(n), pop="p", tier="edge", client="c", method="GET",
                 host="h", path="/", status=200)


class Seen:
    def __init__(self) -> None:
        self.rids: list[str] = []

    def observe(self, e: Event) -> None:
        self.rids.append(e.rid)


class Broken:
    def observe(self, e: Event) -> None:
        raise RuntimeError("broken observer")


def test_outside_a_loop_an_event_is_delivered_at_once():
    observers, seen = Observers(), Seen()
    observers.add(seen)
    observers.observe(event(1))
    assert seen.rids == ["1"]


def test_in_a_loop_a_batch_is_delivered_on_the_next_iteration_in_order():
    async def run() -> tuple[list[str], list[str]]:
        observers, seen = Observers(), Seen()
        observers.add(seen)
        for n in range(5):
            observers.observe(event(n))
        before = list(seen.rids)
        await asyncio.sleep(0)
        return before, seen.rids

    before, after = asyncio.run(run())
    assert before == [] and after == ["0", "1", "2", "3", "4"]


def test_a_long_burst_is_delivered_every_max_batch_events(monkeypatch):
    monkeypatch.setattr(observers_module, "MAX_BATCH", 3)

    async def run() -> list[int]:
        observers, seen = Observers(), Seen()
        observers.add(seen)
        counts = []
        for n in range(7):
            observers.observe(event(n))
            counts.append(len(seen.rids))
        await asyncio.sleep(0)
        counts.append(len(seen.rids))
        return counts

    assert asyncio.run(run()) == [0, 0, 3, 3, 3, 6, 6, 7]


def test_adding_an_observer_delivers_what_is_pending_to_the_earlier_ones_only():
    async def run() -> tuple[list[str], list[str]]:
        observers, first, later = Observers(), Seen(), Seen()
        observers.add(first)
        observers.observe(event(1))
        observers.add(later)
        observers.observe(event(2))
        await asyncio.sleep(0)
        return first.rids, later.rids

    assert asyncio.run(run()) == (["1", "2"], ["2"])


def test_a_failing_observer_is_logged_once_and_the_others_get_every_event(caplog):
    async def run() -> list[str]:
        observers, seen = Observers(), Seen()
        observers.add(Broken())
        observers.add(seen)
        for n in range(3):
            observers.observe(event(n))
        await asyncio.sleep(0)
        observers.observe(event(3))
        await asyncio.sleep(0)
        return seen.rids

    with caplog.at_level(logging.ERROR, logger="edgefn.events"):
        assert asyncio.run(run()) == ["0", "1", "2", "3"]
    assert len(own_records(caplog, "edgefn.events")) == 1


def test_a_removed_observer_gets_what_was_pending_and_nothing_after():
    async def run() -> tuple[list[str], list[str]]:
        observers, kept, gone = Observers(), Seen(), Seen()
        observers.add(kept)
        observers.add(gone)
        observers.observe(event(1))
        observers.remove(gone)
        observers.observe(event(2))
        await asyncio.sleep(0)
        return kept.rids, gone.rids

    assert asyncio.run(run()) == (["1", "2"], ["1"])


def test_two_failing_observers_are_each_logged_once_by_name(caplog):
    class Other(Broken):
        pass

    observers = Observers()
    first, second = Broken(), Other()
    observers.add(first)
    observers.add(second)
    with caplog.at_level(logging.ERROR, logger="edgefn.events"):
        for n in range(3):
            observers.observe(event(n))
    records = own_records(caplog, "edgefn.events")
    assert len(records) == 2
    assert repr(first) in records[0].getMessage()
    assert repr(second) in records[1].getMessage()
