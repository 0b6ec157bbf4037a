"""With an events stage, the access log is written from each request's event: the
same line as the stage writes, and no access_log stage in the chain."""

import io
import re
from pathlib import Path

import msgspec
import pytest

from runtime import config
from runtime.observe.event import Event
from runtime.pipeline.chain import Chain
from runtime.pipeline.stages.access_log import AccessLog
from runtime.pipeline.stages.request_id import RequestId
from runtime.pop import PoP
from tests.observe.events.helpers import Answer, events_chain, request, run

VARYING = re.compile(r"(ts|dur_ms|rid)=\S+")


def lines(log: io.BytesIO) -> list[str]:
    return [VARYING.sub(r"\1=*", line) for line in log.getvalue().decode().splitlines()]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_line_from_an_event_is_the_line_the_stage_writes(fmt: str) -> None:
    staged, observed = io.BytesIO(), io.BytesIO()
    stage = AccessLog(config.AccessLogStage(format=fmt), staged)
    run(Chain([RequestId(config.RequestIdStage()), stage, Answer(404, b"nope")])(
        request(b"/a/b", client="192.0.2.7:50000")))
    chain, _, _ = events_chain(Answer(404, b"nope"))
    chain.stages[1].observers.add(AccessLog(config.AccessLogStage(format=fmt), observed))  # type: ignore[attr-defined]
    run(chain(request(b"/a/b", client="192.0.2.7:50000")))
    if fmt == "json":
        a, b = (msgspec.json.decode(log.getvalue()) for log in (staged, observed))
        keep = {"method", "path", "status", "fn", "bytes", "client"}
        assert {k: a[k] for k in keep} == {k: b[k] for k in keep} == {
            "method": "GET", "path": "/a/b", "status": 404, "fn": "-", "bytes": 4,
            "client": "192.0.2.7"}
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", b["ts"])
        return
    assert lines(staged) == lines(observed) == [
        "ts=* method=GET path=/a/b status=404 fn=- dur_ms=* bytes=4 rid=* client=192.0.2.7"]
    assert re.search(r"ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", observed.getvalue().decode())


def test_a_head_logs_no_body_bytes_from_the_stage_or_the_event() -> None:
    """A HEAD's answer carries its length, not its body: both lines said bytes=4."""
    staged, observed = io.BytesIO(), io.BytesIO()
    stage = AccessLog(config.AccessLogStage(), staged)
    run(Chain([RequestId(config.RequestIdStage()), stage, Answer(404, b"nope")])(
        request(b"/a/b", method=b"HEAD", client="192.0.2.7:50000")))
    chain, _, _ = events_chain(Answer(404, b"nope"))
    chain.stages[1].observers.add(AccessLog(config.AccessLogStage(), observed))  # type: ignore[attr-defined]
    run(chain(request(b"/a/b", method=b"HEAD", client="192.0.2.7:50000")))
    assert lines(staged) == lines(observed) == [
        "ts=* method=HEAD path=/a/b status=404 fn=- dur_ms=* bytes=0 rid=* client=192.0.2.7"]


def test_a_pop_with_events_logs_through_them_and_one_without_through_the_stage(
        tmp_path: Path) -> None:
    with_events = PoP(config.load(None, data=str(tmp_path / "a"), **{"ai.enabled": False}))
    try:
        assert "events" in with_events.pipeline.names
        assert "access_log" not in with_events.pipeline.names
        assert any(isinstance(o, AccessLog) for o in with_events.observers)
    finally:
        with_events.close()
    cfg = config.load(None, data=str(tmp_path / "b"), **{"ai.enabled": False})
    cfg = msgspec.structs.replace(cfg, pipeline=[
        s for s in cfg.pipeline if not isinstance(s, config.EventsStage)])
    without = PoP(cfg)
    try:
        assert "access_log" in without.pipeline.names
        assert not any(isinstance(o, AccessLog) for o in without.observers)
    finally:
        without.close()


def test_each_line_carries_its_own_second() -> None:
    """The second's text is made once and kept: an event of the next second gets
    the next one, whichever form (event or stage) wrote last."""
    out = io.BytesIO()
    log = AccessLog(config.AccessLogStage(), out)
    fields = {"rid": "r-1", "pop": "p", "tier": "edge", "client": "192.0.2.7", "method": "GET",
              "host": "h", "path": "/a", "status": 200, "duration_ms": 0.25, "bytes_out": 3}
    for ts in (1000.5, 1000.75, 1001.125):
        log.observe(Event(ts=ts, **fields))  # type: ignore[arg-type]
    log.flush()
    assert [line.split(" ")[0] for line in out.getvalue().decode().splitlines()] == [
        "ts=1970-01-01T00:16:40.500Z", "ts=1970-01-01T00:16:40.750Z",
        "ts=1970-01-01T00:16:41.125Z"]
    assert out.getvalue().decode().splitlines()[0] == (
        "ts=1970-01-01T00:16:40.500Z method=GET path=/a status=200 fn=- dur_ms=0.250 bytes=3 "
        "rid=r-1 client=192.0.2.7")
