"""`EventBatch`: the observers take a batch in order with single events, each as it
can (whole, or event by event), and what each observer keeps is what it keeps of the
same events one by one (the ring, the request metrics, the access log)."""

from __future__ import annotations

import asyncio
import io
import logging

import pytest

from runtime.config import AccessLogStage
from runtime.observe import observers as observers_module
from runtime.observe.batch import EventBatch, Group
from runtime.observe.event import Event
from runtime.observe.metrics import DURATION, RequestMetrics
from runtime.observe.observers import Observers
from runtime.observe.ring import MAKE_AT_ONCE, MAX_TEXT, Chunk, Query, Ring
from runtime.pipeline.stages.access_log import AccessLog


def event(n: int, **fields: object) -> Event:
    e = Event(ts=1796281449.0 + n / 7, rid=str(n), pop="p", tier="edge", client="c",
              method="GET", host="h", path="/", status=200, target="f@1", route="/",
              duration_ms=n / 8, bytes_out=n)
    for k, v in fields.items():
        setattr(e, k, v)
    return e


class Seen:
    """An observer without observe_batch."""

    def __init__(self) -> None:
        self.rids: list[str] = []

    def observe(self, e: Event) -> None:
        self.rids.append(e.rid)


class Batched(Seen):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []

    def observe_batch(self, batch: EventBatch) -> None:
        self.batches.append([e.rid for e in batch.events])


def test_a_batch_comes_in_order_with_single_events() -> None:
    async def run() -> tuple[Seen, Batched]:
        observers, seen, batched = Observers(), Seen(), Batched()
        observers.add(seen)
        observers.add(batched)
        observers.observe(event(1))
        observers.observe_batch(EventBatch([event(2), event(3)]))
        observers.observe_batch(EventBatch([]))  # nothing to deliver
        observers.observe(event(4))
        await asyncio.sleep(0)
        return seen, batched

    seen, batched = asyncio.run(run())
    assert seen.rids == ["1", "2", "3", "4"]
    assert batched.rids == ["1", "4"] and batched.batches == [["2", "3"]]


def test_observers_set_directly_are_batched_alike() -> None:
    observers, seen = Observers(), Seen()
    observers.observers = (seen,)
    observers.observe_batch(EventBatch([event(1), event(2)]))
    assert seen.rids == ["1", "2"]


def test_a_batch_counts_its_events_toward_max_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observers_module, "MAX_BATCH", 4)

    async def run() -> list[int]:
        observers, seen = Observers(), Seen()
        observers.add(seen)
        counts = []
        observers.observe(event(0))
        counts.append(len(seen.rids))
        observers.observe_batch(EventBatch([event(n) for n in range(1, 4)]))  # 4 pending
        counts.append(len(seen.rids))
        observers.observe_batch(EventBatch([event(n) for n in range(4, 9)]))  # 5 at once
        counts.append(len(seen.rids))
        await asyncio.sleep(0)
        counts.append(len(seen.rids))
        return counts

    assert asyncio.run(run()) == [0, 4, 9, 9]


def test_a_failing_batch_observer_is_logged_once_and_the_others_go_on(
        caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def observe(self, e: Event) -> None:
            raise RuntimeError("one")

        def observe_batch(self, batch: EventBatch) -> None:
            raise RuntimeError("batch")

    observers, seen = Observers(), Seen()
    observers.add(Broken())
    observers.add(seen)
    with caplog.at_level(logging.ERROR, "edgefn.events"):
        observers.observe_batch(EventBatch([event(1)]))
        observers.observe_batch(EventBatch([event(2)]))
    assert seen.rids == ["1", "2"]
    assert len([r for r in caplog.records if "failed" in r.message]) == 1


def test_two_observers_failing_on_a_batchs_events_are_each_logged_once_by_name(
        caplog: pytest.LogCaptureFixture) -> None:
    """Observers without observe_batch get a batch's events one by one: each that
    raises is logged once, naming it, and the others still get every event."""
    class Broken:
        def __init__(self, name: str) -> None:
            self.name = name

        def observe(self, e: Event) -> None:
            raise RuntimeError(self.name)

        def __repr__(self) -> str:
            return f"<broken {self.name}>"

    observers, seen = Observers(), Seen()
    for o in (Broken("a"), seen, Broken("b")):
        observers.add(o)
    with caplog.at_level(logging.ERROR, "edgefn.events"):
        observers.observe_batch(EventBatch([event(1), event(2)]))
        observers.observe_batch(EventBatch([event(3)]))
    assert seen.rids == ["1", "2", "3"]
    logged = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert len(logged) == 2
    assert logged[0].startswith("event observer <broken a> failed (logged once")
    assert logged[1].startswith("event observer <broken b> failed (logged once")


def test_in_a_loop_max_batch_events_counting_a_batchs_are_delivered_at_once() -> None:
    """A burst is held for the loop turn only up to `MAX_BATCH` events, a batch's
    counting each: a batch of exactly MAX_BATCH goes at once, and so does the single
    event that makes MAX_BATCH with a batch pending."""
    from runtime.observe.observers import MAX_BATCH

    async def run() -> tuple[int, int, int]:
        observers, seen = Observers(), Seen()
        observers.add(seen)
        observers.observe_batch(EventBatch([event(i) for i in range(MAX_BATCH)]))
        whole = len(seen.rids)
        observers.observe_batch(EventBatch([event(i) for i in range(MAX_BATCH - 10)]))
        for i in range(9):
            observers.observe(event(i))
        before = len(seen.rids)
        observers.observe(event(9))
        last = len(seen.rids) - before
        observers.observe_batch(EventBatch([event(1), event(2)]))  # a small one alone:
        await asyncio.sleep(0)  # delivered on the next loop turn
        return whole, last, len(seen.rids) - before - last

    whole, last, small = asyncio.run(run())
    assert whole == MAX_BATCH and last == MAX_BATCH and small == 2


def test_the_ring_keeps_a_batch_as_its_events_one_by_one() -> None:
    """Unsampled events skipped, long texts bounded, subscribers fed: a batch that is
    not `plain` goes through `observe`; a plain one is kept as it is."""
    mixed = [event(1), event(2, sampled=False), event(3, path="/" + "p" * (2 * MAX_TEXT)),
             event(4, query="q" * 300), event(5)]

    async def run() -> tuple[list[Event], list[Event], list[Event]]:
        one, batched = Ring(10), Ring(10)
        sub = batched.subscribe(Query(), 10)
        for e in mixed:
            one.observe(e)
        batched.observe_batch(EventBatch(mixed))
        batched.observe_batch(EventBatch([event(6), event(7)], plain=True))
        pushed, _ = await sub.get(1.0)
        return list(one.events), list(batched.events), pushed

    one, batched, pushed = asyncio.run(run())
    assert len(one) == 4 and len(one[1].path) < MAX_TEXT
    assert batched == [*one, event(6), event(7)]
    assert pushed == batched


class Later:
    """A `Deferred`: makes event n of record n, counting what it made and the calls."""

    def __init__(self) -> None:
        self.made = self.calls = 0

    def events(self, records: list[int]) -> list[Event]:
        self.made += len(records)
        self.calls += 1
        return [event(r) for r in records]


def test_the_ring_makes_deferred_events_when_read() -> None:
    """A batch made later is kept as one `Chunk`, nothing made of it; `events`, a
    query and the admin API see the events it makes; the ring holds `size` events,
    letting a chunk's first ones go; a subscriber gets them made at once."""
    later = Later()
    ring = Ring(4)
    ring.observe(event(0))
    batch = EventBatch.later(later, [1, 2, 3], None, None)
    assert len(batch) == 3 and batch.plain
    ring.observe_batch(batch)
    ring.observe_batch(EventBatch.later(later, [4], None, None))  # pushes 0 out
    assert later.made == 0 and len(ring) == 4 and len(ring.items) == 2
    assert all(isinstance(item, Chunk) for item in ring.items)
    assert list(ring.events) == [event(n) for n in range(1, 5)]
    assert (later.made, later.calls) == (4, 2)  # a call a chunk
    assert ring.query(Query(limit=2)) == [event(3), event(4)]
    ring.observe_batch(EventBatch.later(later, [5, 6], None, None))  # 1 and 2 let go
    assert len(ring) == 4 and len(ring.items) == 3 and ring.items[0].start == 2
    assert [len(item) for item in ring.items] == [1, 1, 2]
    assert list(ring.events) == [event(n) for n in range(3, 7)]
    ring.observe(event(7))  # 3, the rest of the first chunk, let go
    assert len(ring) == 4 and [len(i) if isinstance(i, Chunk) else 1 for i in ring.items] == [1, 2, 1]
    ring = Ring(5)
    ring.observe_batch(EventBatch.later(later, list(range(1, 7)), None, None))  # 1 let go
    ring.observe(event(7))
    ring.observe(event(8))  # then 2, then 3: its start moved on from where it was
    assert ring.items[0].start == 3 and len(ring) == 5
    assert list(ring.events) == [event(n) for n in range(4, 9)]
    ring.observe_batch(EventBatch([event(9), event(10)], plain=True))  # made already
    assert len(ring) == 5 and list(ring.events) == [event(n) for n in range(6, 11)]
    ring = Ring(4)
    ring.observe(event(0))
    ring.observe_batch(EventBatch([event(1), event(2)], plain=True))
    assert len(ring) == 3 and list(ring.events) == [event(0), event(1), event(2)]
    ring.observe_batch(EventBatch.later(later, list(range(10, 20)), None, None))
    ring.observe_batch(EventBatch.later(later, list(range(10, 20)), None, None))
    assert len(ring) == 4 and len(ring.items) == 1  # larger than the ring: its last 4
    assert list(ring.events) == [event(n) for n in range(16, 20)]
    ring.observe_batch(EventBatch.later(later, [], None, None))  # nothing kept of none
    assert len(ring) == 4 and len(ring.items) == 1
    mixed = Ring(10)
    for n in range(5):
        mixed.observe_batch(EventBatch.later(later, [10 * n + k for k in range(3)], None,
                                             None))
        mixed.observe(event(10 * n + 9))
    assert len(mixed) == 10
    assert [e.rid for e in mixed.events] == [str(10 * n + k) for n in range(2, 5)
                                              for k in (0, 1, 2, 9)][-10:]
    assert [e.rid for e in mixed.query(Query(limit=3))] == ["41", "42", "49"]
    assert batch.events == [event(1), event(2), event(3)]  # made for a non-batch observer
    big = Ring(1000)
    big.observe_batch(EventBatch.later(later, list(range(200)), None, None))
    calls, made = later.calls, later.made
    assert [e.rid for e in big.query(Query(limit=3))] == ["197", "198", "199"]
    # the newest MAKE_AT_ONCE made, not the whole chunk
    assert (later.calls, later.made) == (calls + 1, made + MAKE_AT_ONCE)
    assert big.query(Query(limit=100))[0].rid == "100"
    assert (later.calls, later.made) == (calls + 3, made + 3 * MAKE_AT_ONCE)

    async def follow() -> tuple[list[Event], list[Event | Chunk]]:
        ring = Ring(4)
        sub = ring.subscribe(Query(), 10)
        ring.observe_batch(EventBatch.later(Later(), [7], None, None))
        pushed, _ = await sub.get(1.0)
        return pushed, list(ring.items)

    pushed, items = asyncio.run(follow())
    assert pushed == items == [event(7)]


def test_metrics_without_groups_count_each_event() -> None:
    events = [event(n, status=200 + n % 3 * 100) for n in range(9)]
    batched, single = RequestMetrics("p", "edge", ""), RequestMetrics("p", "edge", "")
    batched.observe_batch(EventBatch(events))
    for e in events:
        single.observe(e)
    assert batched.series == single.series


def test_a_group_counts_n_events() -> None:
    """A `Group` of n events adds what n `observe`s add: buckets, the sum (durations
    one by one), bytes, and each stage record's count."""
    bots = {"class": "automation", "action": "allow"}
    cache = {"bots": bots, "http_cache": {"outcome": "MISS"}}
    events = [event(n, decisions=dict(cache) if n % 2 else {"bots": bots}) for n in range(6)]
    durations = [e.duration_ms / 1000 for e in events]
    buckets: dict[int, int] = {}
    for s in durations:
        i = next((i for i, b in enumerate(DURATION.bounds) if b >= s), len(DURATION.bounds))
        buckets[i] = buckets.get(i, 0) + 1
    group = Group("f@1", "/", 200, "GET", 6, sum(e.bytes_out for e in events),
                  sorted(buckets.items()), durations, [({"bots": bots}, 3), (cache, 3)])
    batched, single = RequestMetrics("p", "edge", ""), RequestMetrics("p", "edge", "")
    batched.observe_batch(EventBatch(events, None, [group]))
    for e in events:
        single.observe(e)
    assert batched.series == single.series
    assert (batched.bots.by, batched.cache.by) == (single.bots.by, single.cache.by)
    assert batched.bots.by == {("automation", "allow"): 6}
    # a group's WAF and rate-limit records count n times too
    waf = {"waf": {"blocked": True, "rules": [942100]}, "ratelimit": {"limited": "ip"}}
    detect = {"waf": {"would_block": True, "rules": [941100]}}
    events = [event(n, status=403, decisions=waf if n < 2 else detect) for n in range(5)]
    group = Group("f@1", "/", 403, "GET", 5, 0, [(0, 5)], [0.0] * 5, [(waf, 2), (detect, 3)])
    waf_b, waf_s = RequestMetrics("p", "edge", ""), RequestMetrics("p", "edge", "")
    waf_b.observe_batch(EventBatch(events, None, [group]))
    for e in events:
        e.duration_ms = 0.0
        waf_s.observe(e)
    assert (waf_b.waf_blocks.by, waf_b.waf_detects.by, waf_b.rejects.by) == (
        waf_s.waf_blocks.by, waf_s.waf_detects.by, waf_s.rejects.by)
    assert waf_b.waf_detects.by == {("941100",): 3}


def test_the_access_log_writes_a_batchs_lines_or_each_event() -> None:
    """A batch's lines as they are when written in the log's format, else each
    event's line (`observe`)."""
    text, as_json = (AccessLog(AccessLogStage(format=f), io.BytesIO())  # type: ignore[arg-type]
                     for f in ("text", "json"))
    assert (text.line_format, as_json.line_format) == ("text", "json")
    events = [event(1), event(2)]
    for log in (text, as_json):
        log.observe_batch(EventBatch(events, b"the lines\n"))
        log.observe_batch(EventBatch(events, b"json lines\n", line_format="json"))
        log.observe_batch(EventBatch(events))
        log.flush()
    assert isinstance(text.stream, io.BytesIO) and isinstance(as_json.stream, io.BytesIO)
    one = AccessLog(AccessLogStage(), io.BytesIO())
    for e in events:
        one.observe(e)
    one.flush()
    assert isinstance(one.stream, io.BytesIO)
    assert text.stream.getvalue() == b"the lines\n" + one.stream.getvalue() * 2
    written = as_json.stream.getvalue()
    assert written.count(b'"rid"') == 4 and written.count(b"json lines\n") == 1


def test_observers_ask_for_lines_in_the_one_format_they_take() -> None:
    from runtime.observe.observers import Observers

    logs = [AccessLog(AccessLogStage(format=f), io.BytesIO())  # type: ignore[arg-type]
            for f in ("text", "json")]
    def observing(*observers: AccessLog) -> Observers:
        o = Observers()
        o.observers = observers
        return o

    assert observing(logs[0]).line_format == "text"
    assert observing(logs[1]).line_format == "json"
    assert observing(*logs).line_format is None  # two formats: each event's own line
    assert observing().line_format is None
