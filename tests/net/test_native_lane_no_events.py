"""The native lane on a pipeline without the ``events`` stage (nor ``access_log``), over
loopback: two real PoPs with that pipeline, the lane on and off, the same functions
deployed on both (a WASM reactor, a Python function in a real isolate host), the
same raw bytes sent to both. The lane serves them (it did not before: such a
pipeline took the Python path), with the same answers and the same HTTP cache
counts, and no event is made on either side."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from runtime.pipeline.lane import NativeLane
from tests.net.lane_support import exchange, normal
from tests.net.test_native_lane import request
from tests.pipeline.test_lane_plans import NO_EVENTS
from tests.support import EXAMPLES, Running, pop_thread, python_function

PYFN = '''
from edgefn import Response


def handle(request, env):
    return Response(f"py {request.method} {len(request.body)}\\n", headers=[("Cache-Tag", "t")])
'''


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Running]]:
    root = tmp_path_factory.mktemp("no_events")
    py = python_function(root / "fns", "py", PYFN, pool="min = 1\nmax = 1\nstandby = false")
    with pop_thread(root / "on", pipeline=NO_EVENTS, **{"http.native_lane": "auto"}) as on, \
            pop_thread(root / "off", pipeline=NO_EVENTS, **{"http.native_lane": "off"}) as off:
        for r in (on, off):
            r.deploy(EXAMPLES / "hello-wat")
            r.deploy(EXAMPLES / "echo")
            r.deploy(py)
        yield on, off


def prefix(r: Running) -> bytes:
    rid = next(s for s in r.pop.pipeline.stages if s.name == "request_id")
    return rid.prefix  # type: ignore[attr-defined, no-any-return]


def cache_counts(r: Running) -> list[dict[str, Any]]:
    rows = r.admin.request("GET", "/v1/cache/stats")["stats"]
    return [{k: v for k, v in row.items() if k != "saved_ms"} for row in rows]


def test_the_lane_serves_a_pipeline_without_events_as_python_does(
        pair: tuple[Running, Running]) -> None:
    on, off = pair
    lane = on.pop.lane
    assert isinstance(lane, NativeLane) and lane.events is None and off.pop.lane is None
    kinds = [(request("GET", "/hello", [("Host", "x"), ("User-Agent", "curl/8")]), b"GET"),
             (request("POST", "/echo", [("Host", "x")], b'{"a": 1}'), b"POST"),
             (request("GET", "/py", [("Host", "x")]), b"GET"),
             (request("PUT", "/py", [("Host", "x")], b"abc"), b"PUT"),
             (request("HEAD", "/hello", [("Host", "x")]), b"HEAD")]
    served = lane.served
    got, want = [], []
    for raw, method in kinds * 3:  # one a connection: a Python call makes it busy, and what
        # is pipelined behind one is the Python front's (test_native_lane_python)
        got += [normal(r, prefix(on)) for r in exchange(on.port, raw, [method])]
        want += [normal(r, prefix(off)) for r in exchange(off.port, raw, [method])]
    assert got == want and len(got) == 15
    assert all(r.startswith(b"HTTP/1.1 200 ") for r in got)
    assert b"py PUT 3" in got[3] and b"x-edgefn-cache: BYPASS" in got[3]
    on.delivered()
    off.delivered()
    assert lane.served - served == 15  # each of them, in C (the Python calls answered there)
    assert cache_counts(on) == cache_counts(off) != []
    assert len(on.pop.ring.events) == len(off.pop.ring.events) == 0
