"""A JSON access log without stage timings keeps the native lane (``[[pipeline]]
stage = "access_log"``, ``format = "json"``, ``stage_timings = false``): two real PoPs
on loopback, the lane on and off, the same requests to a WASM reactor and a Python
function; the lane serves them, and both write the same JSON lines (``"stages": {}``)
and events. With stage timings (the default) every request is timed in Python: the
lane serves none."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from runtime import config
from tests.net.test_native_lane import ROOT, Side, lane_pair, request
from tests.net.test_native_lane_python import python_folder
from tests.support import pop_thread

PORTS = {"auto": 28026, "off": 28027}
H = [("Host", "x")]


def pipeline(**access_log: object) -> list[dict[str, object]]:
    """The default pipeline, its access_log stage's fields set as `access_log` says."""
    stages = [msgspec.to_builtins(s) for s in config.load(None).pipeline]
    return [{**s, **access_log} if s["stage"] == "access_log" else s for s in stages]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Side, Side]]:
    root = tmp_path_factory.mktemp("jsonlog")
    folders = [ROOT / "functions" / "examples" / "hello-wat", python_folder(root / "fns")]
    with lane_pair(root, PORTS, folders,
                   pipeline=pipeline(format="json", stage_timings=False)) as sides:
        yield sides


def lines(side: Side) -> list[dict[str, object]]:
    """`side`'s new JSON lines, but what differs between two PoPs (the time, the
    duration, the request id's per-process prefix)."""
    out = []
    for line in side.new_log():
        fields = json.loads(line)
        assert set(fields) == {"ts", "method", "path", "status", "fn", "dur_ms", "bytes",
                               "rid", "client", "stages"}
        out.append({k: v for k, v in fields.items() if k not in ("ts", "dur_ms")})
    return out


@pytest.mark.parametrize("raw, method", [
    (request("GET", "/hello", H), b"GET"),
    (request("GET", "/hello?x=1", H), b"GET"),
    (request("GET", "/pyfn", H), b"GET"),
    (request("POST", "/pyecho", H, b"{}"), b"POST"),
])
def test_the_lane_serves_and_both_write_the_same_json_lines(pair: tuple[Side, Side], raw: bytes,
                                                            method: bytes) -> None:
    on, off = pair
    assert on.lane is not None
    on.r.delivered()  # the lane counts what it served as it drains
    before = on.lane.calls if b"/py" in raw else on.lane.served
    got = [side.send(raw, [method]) for side in pair]
    assert got[0] == got[1]
    on.r.delivered()
    assert (on.lane.calls if b"/py" in raw else on.lane.served) - before == 1
    written = [lines(side) for side in pair]
    assert written[0] == written[1] and len(written[0]) == 1
    assert written[0][0]["stages"] == {} and written[0][0]["status"] == 200
    assert on.new_events() == off.new_events()


def test_with_stage_timings_every_request_is_timed_in_python(tmp_path: Path) -> None:
    """The default JSON line times each stage: the chain is timed, the lane serves
    nothing, and the line has the timings."""
    with pop_thread(tmp_path / "timed", **{"http.native_lane": "auto"},
                    pipeline=pipeline(format="json")) as r:
        r.deploy(ROOT / "functions" / "examples" / "hello-wat")
        side = Side(r)
        assert side.lane is None or side.lane.served == 0
        assert side.send(request("GET", "/hello", H), [b"GET"])[0].startswith(b"HTTP/1.1 200")
        (line,) = lines(side)
        assert "dispatch" in line["stages"]
        assert side.lane is None or side.lane.served == 0
