"""The native lane's drain (lane.c `EventMaker`, runtime/pipeline/lane.py `drain`):
its events, access-log lines and metric groups against what the Python drain made of
the same records one by one (`reference`: the events stage's fields), without
sockets; then a real PoP with the lane on, whose scrape state and access log must
equal its own ring's events observed one by one."""

from __future__ import annotations

import io
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.config import AccessLogStage
from runtime.net import lane as native
from runtime.observe.batch import EventBatch
from runtime.observe.event import Event
from runtime.observe.metrics import DURATION, DURATION_BUCKETS, RequestMetrics
from runtime.observe.redact import MASK
from runtime.observe.ring import Chunk, Query
from runtime.pipeline.lane import LINE_FORMATS, MADE_FIELDS, groups_of
from runtime.pipeline.stages.access_log import AccessLog
from tests.net.lane_support import guests
from tests.net.test_native_lane_json_log import pipeline
from tests.support import Running, pop_thread

ROOT = Path(__file__).resolve().parents[2]
PORT = 28620
POP, TIER, GEO, PREFIX = "pop-a", "edge", "eu", "9f2c41d0aa3e"
BOTS = {"class": "automation", "agent": None, "signals": ("empty_ua",), "action": "allow"}
CRAWLER = {"class": "declared_agent", "agent": None, "signals": ("ua",), "action": "allow"}
MISS = {"outcome": "MISS", "stored": "no freshness"}
# path, target, owner, route, whether http_cache counts a MISS (NativeLane.route_texts)
ROUTES = (("/hello", "hello@1a2b3c4d", None, "/hello", False),
          ("/caf\xe9", "caf@00ff00ff", "t1", None, True),
          ("/x", "x@12345678", "t2", "/x", False))
# bot class, decisions, decisions with the MISS (NativeLane.verdict_texts)
VERDICTS = (("automation", {"bots": BOTS}, {"bots": BOTS, "http_cache": MISS}),
            ("declared_agent", {"bots": CRAWLER}, {"bots": CRAWLER, "http_cache": MISS}))
# a refusal's decisions (the verdict's updated with them) and error: ratelimit's, bots'
REFUSED = ({"ratelimit": {"limited": "by-ip"}}, "rate_limited")
OTHER = ({"ratelimit": {"limited": "fn-ip"}}, "rate_limited")
BLOCKED = ({"bots": {**BOTS, "action": "block"}}, "bot_blocked")
# (ts, id, route, status, body bytes, took ns, verdict, method, host, query, client,
# request body bytes, path: None for the route's own, refused: None or a refusal's pair), id a number or a caller's (bytes), method 0 GET, 1 HEAD, 2 POST, 3 PUT, 4 PATCH, 5 DELETE (lane.c's MC_*): half-even rounding
# of microseconds (1500, 2500 ns), durations on a bucket's bound (500 us = 0.0005 s), a
# millisecond's edge, latin-1 in host and query, odd clients, POSTs (a BYPASS of
# http_cache's where it counts, its key the URL's)
RECORDS = [
    (1796281449.9995, 1, 0, 200, 13, 1500, 0, 0, b"x", b"", "127.0.0.1:5000", 0, None, None),
    (1796281450.0, 2, 0, 200, 13, 2500, 0, 1, b"x:8080", b"a=1&b", "127.0.0.1:5001", 0, None, None),
    (1796281450.1234567, 0xFFFF, 1, 418, 0, 500_000, 1, 0, b"h\xe9", b"q=\xff", "[::1]:80", 0, None, None),
    (1796281450.5, 17, 2, 204, 0, 999_999_500, 0, 0, b"x", b"", "nocolon", 0, None, None),
    (1000000000.000999, 18, 1, 200, 5, 10_000_000_000, 1, 1, b"x", b"", ":9", 0, None, None),
    (1796281451.25, 19, 0, 200, 13, 2_500_000, 1, 0, b"x", b"", "10.0.0.1:1", 0, None, None),
    (1796281451.75, 20, 0, 200, 13, 1_000_499, 0, 0, b"x", b"z", "10.0.0.1:1", 0, None, None),
    (1796281451.76, 21, 2, 503, 7, 123_456, 0, 0, b"x", b"", "10.0.0.2:1", 0, None, None),
    (1796281451.77, 22, 0, 200, 13, 40_000, 0, 2, b"x", b"", "10.0.0.3:1", 3, None, None),
    (1796281451.78, 23, 1, 200, 2, 41_000, 1, 2, b"h\xe9", b"q=\xff&r", "10.0.0.3:2", 70000, None, None),
    (1796281451.79, 24, 1, 200, 0, 42_000, 0, 2, b"x", b"", "10.0.0.3:3", 0, None, None),
    (1796281451.80, 25, 0, 200, 13, 43_000, 0, 3, b"x", b"", "10.0.0.3:4", 9, None, None),
    (1796281451.81, 26, 2, 404, 3, 44_000, 1, 5, b"x", b"id=2", "10.0.0.3:5", 0, None, None),
    (1796281451.82, 27, 1, 409, 4, 45_000, 0, 4, b"x", b"", "10.0.0.3:6", 2, None, None),
    # a path under its route (a prefix's), latin-1; a caller's request id kept
    (1796281451.83, 28, 0, 200, 13, 46_000, 0, 0, b"x", b"a", "10.0.0.4:1", 0, b"/hello/w\xe9", None),
    (1796281451.84, b"req-7f3a.01", 2, 201, 1, 47_000, 1, 2, b"x", b"", "10.0.0.4:2", 4, None, None),
    (1796281451.85, b"Z" * 128, 1, 200, 2, 48_000, 0, 3, b"x", b"q", "10.0.0.4:3", 1, b"/caf\xe9/x", None),
    # ratelimit's refusals (lane.c `refuse`): the verdict's decisions and the refusal's, no
    # http_cache record (a route whose GETs count a MISS, a POST's BYPASS); grouped apart
    # from the admitted requests of their route, status and method, and by limit
    (1796281451.86, 29, 0, 429, 129, 49_000, 0, 0, b"x", b"", "10.0.0.5:1", 0, None, REFUSED),
    (1796281451.87, 30, 0, 429, 129, 50_000, 1, 2, b"x", b"", "10.0.0.5:2", 3, None, REFUSED),
    (1796281451.88, 31, 0, 429, 130, 51_000, 0, 0, b"x", b"", "10.0.0.5:3", 0, None, OTHER),
    (1796281451.89, 32, 1, 429, 129, 52_000, 0, 1, b"x", b"", "10.0.0.5:4", 0, None, REFUSED),
    (1796281451.90, 33, 0, 403, 90, 53_000, 0, 0, b"x", b"", "10.0.0.6:1", 0, None, BLOCKED),
]


def reference(rec: tuple[Any, ...]) -> Event:
    """The event the Python drain made of `rec` (the events stage's fields)."""
    ts, n, ri, status, size, took, verdict, method, host, query, client, size_in, under, \
        refused = rec
    path, target, owner, route, first = ROUTES[ri]
    if under is not None:
        path = under.decode("latin-1")
    cls, plain, missed = VERDICTS[verdict]
    rid = n.decode() if isinstance(n, bytes) else f"{PREFIX}-{n:x}"
    event = Event(ts=ts, rid=rid, pop=POP, tier=TIER, client=client.rpartition(
                  ":")[0] or client, bot=cls,
                  method=("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")[method],
                  host=host.decode("latin-1"), path=path, status=status, target=target,
                  owner=owner, route=route or None, bytes_in=size_in, bytes_out=size,
                  duration_ms=round(took / 1000) / 1000)
    event.geo = GEO
    if query:
        event.query = query.decode("latin-1")
    event.decisions = dict(missed if first else plain)
    if refused is not None:  # ratelimit refused it: http_cache never saw it
        event.decisions = {**plain, **refused[0]}
        event.error = refused[1]
    elif first and method >= 2:  # HttpCacheStage._bypass's record: `_label` of the key
        url = host.decode("latin-1") + path + ("?" + query.decode("latin-1") if query else "")
        event.decisions = {**plain, "http_cache": {"outcome": "BYPASS", "key": f"{target} {url}"}}
    return event


def maker() -> Any:
    module = native.load()
    if module is None:
        pytest.skip("no C compiler or Python headers: the native lane is off")
    template = Event(ts=0.0, rid="", pop=POP, tier=TIER, geo=GEO, client="", method="GET",
                     host="", path="", status=0)
    return module.EventMaker(template, MADE_FIELDS, DURATION_BUCKETS)


def make(rows: Any, lines: int = 1) -> tuple[Any, ...]:
    """`EventMaker.make` of `rows` (a list of records, or a `Records`), with the access
    log's lines: 0 none, 1 text, 2 JSON (`LINE_FORMATS`)."""
    out: tuple[Any, ...] = maker().make(rows, ROUTES, VERDICTS, {}, PREFIX, lines)
    return out


def logged(events: list[Event], fmt: str = "text") -> bytes:
    """What `AccessLog.observe` writes for `events` in format `fmt`."""
    log = AccessLog(AccessLogStage(format=fmt), io.BytesIO())  # type: ignore[arg-type]
    for e in events:
        log.observe(e)
    log.flush()
    assert isinstance(log.stream, io.BytesIO)
    return log.stream.getvalue()


def test_events_are_the_python_drains() -> None:
    events, _, _, text = make(RECORDS)
    assert events == [reference(r) for r in RECORDS]
    assert [e.duration_ms for e in events[:2]] == [0.002, 0.002]  # half to even
    # each event has its own dicts (observers may keep or change them)
    assert len({id(e.decisions) for e in events}) == len({id(e.stages_ms) for e in events}) \
        == len(events)
    assert all(e.decisions is not v[1] and e.decisions is not v[2] for e in events
               for v in VERDICTS)
    assert text == max(len(e.path) + len(e.query) + len(e.host) for e in events)


def test_lines_are_the_access_logs_bytes() -> None:
    _, lines, _, _ = make(RECORDS)
    assert lines == logged([reference(r) for r in RECORDS])
    assert b"dur_ms=10000.000 " in lines and b"ts=2001-09-09T01:46:40.000Z" in lines
    assert make(RECORDS, lines=False)[1] is None
    _, lines, _, _ = make(RECORDS, LINE_FORMATS["json"])
    assert lines == logged([reference(r) for r in RECORDS], "json")
    assert b'"dur_ms":10000.0,' in lines and b'"ts":"2001-09-09T01:46:40.000Z"' in lines
    assert b'"path":"/caf\xc3\xa9/x"' in lines and b'"stages":{}}\n' in lines
    with pytest.raises(ValueError):
        make(RECORDS, 3)


@settings(max_examples=200, deadline=None)
@given(path=st.binary(max_size=40).map(lambda b: b"/" + b), took=st.integers(0, 10**13),
       ts=st.floats(0, 4_000_000_000), rid=st.one_of(
           st.integers(0, 2**64 - 1), st.text("abcXYZ09._:-", min_size=1, max_size=128)
           .map(str.encode)),
       client=st.sampled_from(["127.0.0.1:5000", "[::1]:80", "nocolon", ":9", "a\"b:1"]),
       status=st.integers(200, 599), size=st.integers(0, 2**40))
def test_json_lines_are_the_access_logs_bytes(path: bytes, took: int, ts: float,
                                               rid: int | bytes, client: str, status: int,
                                               size: int) -> None:
    """Any path's bytes (latin-1: quotes, backslashes, control characters, bytes past
    127 as UTF-8), any duration (its shortest float form), time, id and client: the
    C's JSON line is the one `AccessLog.observe` writes with msgspec."""
    rec = (ts, rid, 0, status, size, took, 0, 0, b"x", b"", client, 0, path, None)
    events, lines, _, _ = make([rec], LINE_FORMATS["json"])
    assert lines == logged([reference(rec)], "json") == logged(events, "json")


def test_groups_count_what_each_event_counts() -> None:
    """The metrics' state after the groups equals the state after each event: the
    same buckets (bisect_left: a bound's own value in its bucket), bytes, stage
    counts and, bit for bit, the durations' sum."""
    events, lines, made, _ = make(RECORDS * 3)
    batched, single = RequestMetrics(POP, TIER, GEO), RequestMetrics(POP, TIER, GEO)
    batched.observe_batch(EventBatch(events, lines, groups_of(made, ROUTES, VERDICTS)))
    for e in (reference(r) for r in RECORDS * 3):
        single.observe(e)
    assert batched.series == single.series
    assert batched.raw == single.raw
    assert (batched.bots.by, batched.cache.by, batched.rejects.by) == \
        (single.bots.by, single.cache.by, single.rejects.by)
    assert sum(single.rejects.by.values()) == 12  # the refusals', by limit
    assert sum(g[3] for g in made) == len(events)
    on_bound = next(s for k, s in single.series.items() if k[2] == "4xx")
    assert on_bound[0] == 3  # 0.0005 s counted under le="0.0005"


def records(rows: list[tuple[Any, ...]]) -> Any:
    """`rows` packed as the lane packs what it answers (lane_records.c.h `Records`)."""
    module = native.load()
    if module is None:
        pytest.skip("no C compiler or Python headers: the native lane is off")
    return module.Records(rows)


def test_packed_records_read_as_their_tuples() -> None:
    """A `Records` reads back as the tuples it was made of (an index, a slice, in
    order); `truncate` drops the last ones; `served` counts those not refused by
    route and method, as http_cache's stats count them."""
    packed = records(RECORDS)
    assert len(packed) == len(RECORDS) and list(packed) == RECORDS
    assert packed[-1] == RECORDS[-1] and packed[2:5] == RECORDS[2:5]
    assert packed[::-3] == RECORDS[::-3]
    with pytest.raises(IndexError):
        packed[len(RECORDS)]
    counted: dict[tuple[int, int], int] = {}
    for r in RECORDS:
        if r[13] is None:
            counted[(r[2], r[7])] = counted.get((r[2], r[7]), 0) + 1
    assert sorted(packed.served()) == sorted((*k, n) for k, n in counted.items())
    packed.truncate(len(RECORDS) + 1)
    assert list(packed) == RECORDS
    packed.truncate(15)
    assert list(packed) == RECORDS[:15] and packed[14] == RECORDS[14]
    packed.truncate(0)
    assert len(packed) == 0 and list(packed) == [] and packed.served() == []
    with pytest.raises(ValueError):
        packed.truncate(-1)
    assert list(records([])) == []


@pytest.mark.parametrize("lines", [0, 1, 2], ids=["none", "text", "json"])
def test_packed_records_make_what_their_tuples_make(lines: int) -> None:
    """`make` of a `Records` (what the drain reads) is `make` of its tuples: the
    same events, access-log lines, groups and longest text; with a context (the
    ring's), no event is made of it, the rest the same. A context is for a
    `Records` only: with a list of tuples, a TypeError and nothing made."""
    packed, rows = records(RECORDS * 2), RECORDS * 2
    assert make(packed, lines) == make(rows, lines)
    ctx = object()
    events, *rest = maker().make(packed, ROUTES, VERDICTS, {}, PREFIX, lines, ctx)
    assert events is None and rest == list(make(rows, lines)[1:])
    with pytest.raises(TypeError, match="Records only"):
        maker().make(rows, ROUTES, VERDICTS, {}, PREFIX, lines, ctx)
    assert maker().make(rows, ROUTES, VERDICTS, {}, PREFIX, lines, None) == make(rows, lines)


def test_a_bad_row_makes_no_records() -> None:
    with pytest.raises(TypeError):
        records([(1.0, 1)])
    with pytest.raises(ValueError):  # a refusal neither None nor a (dict, str) pair
        records([RECORDS[0], (1.0, 1, 0, 429, 0, 0, 0, 0, b"x", b"", "c", 0, None, "x")])
    with pytest.raises(TypeError):
        records(RECORDS[0])  # one row, not an iterable of them


def test_a_bad_record_raises() -> None:
    with pytest.raises(ValueError):
        make([(1.0, 1, 9, 200, 0, 0, 0, 0, b"x", b"", "c", 0, None, None)])  # no route 9
    with pytest.raises(ValueError):
        make([(1.0, 1, 0, 200, 0, 0, 0, 6, b"x", b"", "c", 0, None, None)])  # no method 6
    with pytest.raises(ValueError):  # a path neither bytes nor None
        make([(1.0, 1, 0, 200, 0, 0, 0, 0, b"x", b"", "c", 0, "/hello/x", None)])
    for rid in (b"", b"a" * 129):  # a caller's id request_id would not have kept
        with pytest.raises(ValueError):
            make([(1.0, rid, 0, 200, 0, 0, 0, 0, b"x", b"", "c", 0, None, None)])
    for refused in ({"limited": "x"}, ({"ratelimit": {}},), ("x", "rate_limited"),
                    ({"ratelimit": {}}, b"rate_limited")):  # not a (dict, str) pair
        with pytest.raises(ValueError):
            make([(1.0, 1, 0, 429, 0, 0, 0, 0, b"x", b"", "c", 0, None, refused)])
    with pytest.raises(TypeError):
        make([(1.0, 1)])
    with pytest.raises(TypeError):  # the 13 fields before a refusal was one
        make([(1.0, 1, 0, 200, 0, 0, 0, 0, b"x", b"", "c", 0, None)])


# -- a real PoP -------------------------------------------------------------------------------
def send(port: int, raw: bytes, answers: int) -> None:
    """`raw` on one connection; returns once `answers` responses came back."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        got = b""
        deadline = time.monotonic() + 10
        while got.count(b"HTTP/1.1 ") < answers and time.monotonic() < deadline:
            got += s.recv(65536)
    assert got.count(b"HTTP/1.1 ") == answers


SENT = sum(1 + i % 4 for i in range(60))


def traffic(r: Running) -> io.BytesIO:
    """Lane and Python requests mixed, pipelined by 1 to 4, to `r` (the functions
    deployed first); its access log from then on."""
    for f in [ROOT / "functions" / "examples" / "hello-wat", *guests(r.data.parent / "fns")]:
        r.deploy(f)
    log = io.BytesIO()
    access = next(o for o in r.pop.observers if isinstance(o, AccessLog))
    r.delivered()
    access.flush()
    access.stream = log
    assert r.pop.lane is not None
    before = r.pop.lane.served
    uas = [b"", b"User-Agent: curl/8.5\r\n", b"User-Agent: Googlebot/2.1\r\n"]
    for i in range(60):
        path = [b"/hello", b"/mirror?a=1", b"/teapot", b"/nobody", b"/nope"][i % 5]
        method = b"HEAD" if i % 7 == 0 else b"GET"
        one = b"%s %s HTTP/1.1\r\nHost: x\r\n%s\r\n" % (method, path, uas[i % 3])
        send(r.port, one * (1 + i % 4), 1 + i % 4)
    r.delivered()
    access.flush()
    assert r.pop.lane.served - before >= 100
    return log


@pytest.mark.parametrize("at, config", [
    (0, {}), (1, {"events.redact": ["client", "path"]}),
    (3, {"pipeline": pipeline(format="json", stage_timings=False)}),
], ids=["text", "redacted", "json"])
def test_a_pops_metrics_and_log_are_its_events_one_by_one(tmp_path: Path, at: int,
                                                          config: dict[str, Any]) -> None:
    """The PoP's request metrics (every series' state, bit for bit) and access log
    (every byte, with ts and dur_ms) are what its ring's events give when observed
    one by one; with `[events] redact`, of the redacted events; with a JSON log (no
    stage timings: the lane serves), its JSON lines."""
    with pop_thread(tmp_path / "data", port=PORT + at, **{"http.native_lane": "auto"},
                    **config) as r:
        log = traffic(r)
        events = list(r.pop.ring.events)
        assert len(events) == SENT
        # without redaction the ring keeps the lane's records, made into events when read
        made_later = sum(len(i) for i in r.pop.ring.items if isinstance(i, Chunk))
        assert (made_later >= 100) if "events.redact" not in config else made_later == 0
        assert r.pop.ring.query(Query(limit=SENT)) == events
        if "events.redact" in config:
            assert {e.client for e in events} == {MASK} and MASK.encode() in log.getvalue()
        metrics = RequestMetrics(r.pop.config.name, r.pop.config.tier, r.pop.config.geo)
        for e in events:
            metrics.observe(e)
        assert r.pop.metrics is not None
        assert metrics.series == r.pop.metrics.requests.series
        assert metrics.bots.by == r.pop.metrics.requests.bots.by
        assert metrics.cache.by == r.pop.metrics.requests.cache.by
        assert log.getvalue() == logged(events, "json" if "pipeline" in config else "text")


def test_unsampled_lane_events_are_counted_not_kept(tmp_path: Path) -> None:
    """``[events] sample = 0``: the ring keeps no event under 500, the metrics and the
    access log still see every request."""
    with pop_thread(tmp_path / "data", port=PORT + 2, **{"http.native_lane": "auto",
                                                          "events.sample": 0.0}) as r:
        log = traffic(r)
        assert [e for e in r.pop.ring.events if e.status < 500] == []
        assert r.pop.metrics is not None
        counted = sum(sum(s[:DURATION.n]) for s in r.pop.metrics.requests.series.values())
        assert counted == SENT
        assert log.getvalue().count(b"\n") == SENT
