"""The ring: bounds (events and bytes), queries and their bad filters,
subscribers that lag; the JSONL file and its rotation; `[events]` settings."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from edgefn_core.errors import InvalidConfig
from runtime import config
from runtime.observe.event import Event
from runtime.observe.ring import MAX_TEXT, Query, Ring, encoded_size
from runtime.observe.sink import JsonlSink
from runtime.observe.stream import follow, parse


def event(i: int = 0, **kw: Any) -> Event:
    fields: dict[str, Any] = {"ts": 1000.0 + i, "rid": f"r{i}", "pop": "p", "tier": "edge",
                              "client": "192.0.2.1", "method": "GET", "host": "h",
                              "path": f"/p{i}", "status": 200, "duration_ms": 1.0}
    return Event(**{**fields, **kw})


def test_the_ring_keeps_the_newest_ring_size_events() -> None:
    ring = Ring(5)
    for i in range(12):
        ring.observe(event(i))
    assert [e.rid for e in ring.query(Query(limit=100))] == ["r7", "r8", "r9", "r10", "r11"]


def test_one_event_holds_at_most_about_max_event_bytes() -> None:
    cap = 2048
    ring = Ring(3, cap)
    huge = event(path="/" + "a" * 100_000, query="q=" + "b" * 100_000,
                 decisions={"waf": {"rules": list(range(5000))}})
    ring.observe(huge)
    ring.observe(event(1, decisions={"waf": {"rules": [942100]}}))
    kept, small = ring.events
    assert encoded_size(kept) <= cap and len(kept.path) == MAX_TEXT // 2
    assert kept.decisions == {"truncated": len(msgspec.json.encode(huge.decisions))}
    assert small.decisions == {"waf": {"rules": [942100]}}  # a small one is kept whole


def test_a_long_event_is_cut_to_its_share_of_each_text_and_keeps_small_decisions() -> None:
    """Past `MAX_TEXT` of text the path and query keep half of it each, the host a
    quarter; decisions of exactly half the cap are kept, one byte more are replaced."""
    cap = 2048
    ring = Ring(3, cap)
    rules = {"waf": {"r": "x" * (cap // 2 - len('{"waf":{"r":""}}'))}}
    assert len(msgspec.json.encode(rules)) == cap // 2
    long = {"path": "/" + "a" * 5000, "query": "q=" + "b" * 5000, "host": "h" * 5000}
    ring.observe(event(0, **long, decisions=rules))
    ring.observe(event(1, **long, decisions={"waf": {"r": rules["waf"]["r"] + "y"}}))
    kept, over = ring.events
    assert (len(kept.path), len(kept.query), len(kept.host)) == (
        MAX_TEXT // 2, MAX_TEXT // 2, MAX_TEXT // 4)
    assert kept.query.startswith("q=bbb") and kept.host.startswith("hhh")
    assert kept.decisions == rules
    assert over.decisions == {"truncated": cap // 2 + 1}


def test_an_event_under_max_text_is_kept_whole_unless_its_decisions_are_over_half() -> None:
    """Below `MAX_TEXT` of text only decisions over half the cap make an event bounded:
    a long path without decisions, and a long host with decisions of exactly half the
    cap, are kept whole; one byte more of decisions is replaced by its size."""
    cap = 2048
    ring = Ring(3, cap)
    half = {"waf": {"r": "x" * (cap // 2 - len('{"waf":{"r":""}}'))}}
    more = {"waf": {"r": half["waf"]["r"] + "y"}}
    ring.observe(event(0, path="/" + "p" * 600))
    ring.observe(event(1, host="h" * 300, decisions=half))
    ring.observe(event(2, path="/" + "p" * 300, decisions=more))
    whole, kept, cut = ring.events
    assert len(whole.path) == 601 and len(kept.host) == 300 and kept.decisions == half
    assert len(cut.path) == 301 and cut.decisions == {"truncated": cap // 2 + 1}


def test_a_waiting_follower_is_woken_by_each_new_event() -> None:
    """`get` waits for the next event: one that comes wakes it at once (not at its
    timeout), each time; a follower's `since` is ignored (it follows from now on)."""
    ring = Ring(10)

    async def main() -> list[tuple[list[str], int, float]]:
        sub = ring.subscribe(Query(since=0.5), 10)
        loop = asyncio.get_running_loop()
        out = []
        for i in range(2):
            started = loop.time()
            waiting = asyncio.ensure_future(sub.get(5.0))
            await asyncio.sleep(0.01)
            assert not waiting.done()
            ring.observe(event(i, ts=0.2))
            events, dropped = await waiting
            out.append(([e.rid for e in events], dropped, loop.time() - started))
        return out

    got = asyncio.run(main())
    assert [(rids, dropped) for rids, dropped, _ in got] == [(["r0"], 0), (["r1"], 0)]
    assert all(took < 2.5 for _, _, took in got)  # woken, not timed out at 5 s


def test_queries_filter_by_every_field() -> None:
    now = 2000.0
    ring = Ring(100, clock=lambda: now)
    ring.observe(event(0, ts=now - 3600, target="hello@1", status=200))
    ring.observe(event(1, ts=now - 30, target="hello@2", status=503, tenant="acme",
                       duration_ms=80.0))
    ring.observe(event(2, ts=now - 10, target="other@1", status=404, method="POST",
                       path="/api/x"))
    ring.observe(event(3, ts=now - 5, target="hello@2", status=200, tenant="acme"))
    ring.observe(event(4, ts=now - 4, target="hello2@1b", status=200))

    def rids(**params: str) -> list[str]:
        return [e.rid for e in ring.query(Query.parse(params))]
    assert rids(since="1m") == ["r1", "r2", "r3", "r4"]
    assert rids(since="2h") == ["r0", "r1", "r2", "r3", "r4"]
    assert rids(since="20") == ["r2", "r3", "r4"]
    assert rids(function="hello") == ["r0", "r1", "r3"]  # not hello2
    assert rids(function="hello@1") == ["r0"]
    assert rids(function="hello2@1") == ["r4"]  # a version's first characters, as rollback's
    assert rids(status="5xx") == ["r1"] and rids(status="404") == ["r2"]
    assert rids(tenant="acme") == ["r1", "r3"]
    assert rids(path="/api/") == ["r2"] and rids(method="post") == ["r2"]
    assert rids(min_ms="50") == ["r1"]
    assert rids(limit="2") == ["r3", "r4"]  # the newest, oldest first
    assert rids(function="hello", status="200", tenant="acme") == ["r3"]


@pytest.mark.parametrize(("name", "value"), [
    ("since", "10 minutes"), ("since", "-5m"), ("status", "5x"), ("status", "600"),
    ("status", "ok"), ("limit", "0"), ("limit", "10001"), ("limit", "ten"), ("limit", "\u00b2"),
    ("min_ms", "-1"), ("min_ms", "nan"), ("path", "api"), ("method", "GET /"),
    ("colour", "red")])
def test_a_bad_filter_is_refused_naming_it(name: str, value: str) -> None:
    with pytest.raises(InvalidConfig) as e:
        Query.parse({name: value})
    assert e.value.field == name and e.value.status == 400
    assert str(e.value).startswith(f"query: field `{name}`: ")
    assert e.value.reason.startswith(("expected", "unknown filter"))


def test_a_query_string_is_parsed_and_must_be_utf8() -> None:
    assert parse(b"status=5xx&since=10m") == Query(status_class=5, since=600.0)
    with pytest.raises(InvalidConfig):
        parse(b"tenant=%ff")


def test_a_follower_gets_new_matching_events_and_a_slow_one_is_told_what_it_missed() -> None:
    ring = Ring(100)

    async def main() -> list[bytes]:
        out = []
        body = follow(ring, Query.parse({"status": "5xx"}), queue=3, heartbeat=5.0)
        out.append(await anext(body))  # subscribed
        for i in range(8):  # nobody reads meanwhile: 3 fit, 5 are dropped
            ring.observe(event(i, status=500 + i % 2))
            ring.observe(event(100 + i, status=200))
        out.append(await anext(body))
        out.append(await anext(body))
        ring.observe(event(50, status=502))
        out.append(await anext(body))
        await body.aclose()  # type: ignore[attr-defined]
        assert ring.subscribers == []
        return out
    hello, dropped, first, later = asyncio.run(main())
    assert hello.startswith(b":")
    assert dropped == b'event: dropped\ndata: {"dropped":5}\n\n'
    got = [json.loads(line[6:])["rid"] for line in first.split(b"\n\n") if line]
    assert got == ["r0", "r1", "r2"]
    assert json.loads(later[6:])["rid"] == "r50"


def test_a_silent_follower_gets_heartbeats() -> None:
    async def main() -> bytes:
        body = follow(Ring(10), Query(), queue=3, heartbeat=0.01)
        await anext(body)
        beat = await anext(body)
        await body.aclose()  # type: ignore[attr-defined]
        return beat
    assert asyncio.run(main()) == b": heartbeat\n\n"


def test_the_jsonl_file_rotates_at_max_bytes_keeping_backups(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    one = len(msgspec.json.encode(event(0))) + 1
    sink = JsonlSink(path, max_bytes=one * 3, backups=2)
    for i in range(10):  # no loop running: each event is handed over at once
        sink.observe(event(i))
    sink.observe(event(99, sampled=False))  # not sampled: not in the file
    sink.close()
    files = [path, Path(f"{path}.1"), Path(f"{path}.2")]
    assert not Path(f"{path}.3").exists()
    rids = [[json.loads(line)["rid"] for line in f.read_text().splitlines()] for f in files]
    assert rids == [["r9"], ["r6", "r7", "r8"], ["r3", "r4", "r5"]]
    assert all(f.stat().st_size <= one * 3 for f in files)
    # client addresses, queries, tenants: the PoP's user's to read, not everyone's
    assert {f.stat().st_mode & 0o777 for f in files} == {0o600}


def test_a_jsonl_file_an_older_edgefn_left_readable_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"")
    path.chmod(0o644)
    JsonlSink(path, max_bytes=1 << 20, backups=1).close()
    assert path.stat().st_mode & 0o777 == 0o600


def test_the_sink_hands_a_burst_over_as_one_batch_and_close_writes_it(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    sink = JsonlSink(path, max_bytes=1 << 20, backups=1)

    async def burst() -> tuple[int, int]:
        for i in range(50):
            sink.observe(event(i))
        queued = sink.batches.qsize()
        await asyncio.sleep(0)  # a turn of the loop is not enough: batches are timed
        return queued, len(sink.pending)
    assert asyncio.run(burst()) == (0, 50)
    sink.close()
    assert [json.loads(x)["rid"] for x in path.read_text().splitlines()] == [
        f"r{i}" for i in range(50)]


@pytest.mark.parametrize(("field", "value"), [
    ("events.ring_size", 0), ("events.sample", 1.5), ("events.sample", -0.1),
    ("events.redact", ["body"]), ("events.max_bytes", 10), ("events.backups", -1),
    ("events.max_event_bytes", 10), ("events.nope", 1), ("health.live", "healthz"),
    ("health.ready", "/ready z")])
def test_bad_events_and_health_settings_name_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidConfig) as e:
        config.load(None, **{field: value})
    assert e.value.field is not None and e.value.field.startswith(field.split(".")[0])
    assert e.value.field in (field, f"{field}[0]") or field.endswith("nope")


def test_an_events_file_outside_data_goes_in_a_folder_that_exists(tmp_path: Path) -> None:
    """`file = "/nonexistent_x/x.jsonl"` made /nonexistent_x/ at the filesystem root."""
    data = tmp_path / "data"
    for file in (str(tmp_path / "nope" / "x.jsonl"), "../nope/x.jsonl"):
        with pytest.raises(InvalidConfig) as e:
            config.load(None, data=str(data), **{"events.file": file})
        assert e.value.field == "events.file"
        assert f"no such folder: {tmp_path / 'nope'} (a file outside DATA" in str(e.value)
    assert not (tmp_path / "nope").exists()
    for file in ("logs/e.jsonl", str(tmp_path / "e.jsonl")):  # folders under DATA are made
        assert config.load(None, data=str(data), **{"events.file": file}).events.file == file


def test_a_follower_fed_from_another_thread_accounts_for_every_event() -> None:
    """The PoP's loop pushes while the admin loop drains: delivered + dropped is
    every event pushed, however the two threads interleave."""
    import sys
    import threading

    from runtime.observe.ring import Subscriber

    pushed = 20_000

    async def main() -> tuple[int, int]:
        sub = Subscriber(lambda e: True, 4, asyncio.get_running_loop())
        e = event(1)
        feeder = threading.Thread(target=lambda: [sub.push(e) for _ in range(pushed)])
        delivered = dropped = 0
        feeder.start()
        while feeder.is_alive() or sub.buffer or sub.dropped:
            got, lost = await sub.get(0.01)
            delivered, dropped = delivered + len(got), dropped + lost
        feeder.join()
        return delivered, dropped

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        delivered, dropped = asyncio.run(main())
    finally:
        sys.setswitchinterval(interval)
    assert dropped > 0 and delivered + dropped == pushed


def test_a_querys_bounds_include_their_edge_and_a_viewer_sees_its_tenants_and_owners() -> None:
    """`since` and `min_ms` take an event exactly at them; a tenant's key sees the events
    its tenant made and those of its functions (either is enough)."""
    now = 2000.0
    ring = Ring(100, clock=lambda: now)
    ring.observe(event(0, ts=now - 30, duration_ms=50.0, tenant="acme", owner="globex"))
    ring.observe(event(1, ts=now - 31, duration_ms=49.0, tenant="globex", owner="acme"))
    ring.observe(event(2, ts=now - 1, duration_ms=1.0, tenant="globex", owner="globex"))

    def rids(**params: Any) -> list[str]:
        return [e.rid for e in ring.query(Query(**params))]
    assert rids(since=30.0) == ["r0", "r2"]
    assert rids(min_ms=50.0) == ["r0"]
    assert rids(viewer="acme") == ["r0", "r1"]
