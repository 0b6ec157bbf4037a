"""The native lane with a ``cors`` stage in the pipeline (as the README adds it) and an
API key in the key file (as a PoP guarding its OpenAI API has), over loopback: two
real PoPs, the lane on and off, the same functions deployed on both (WASM reactors,
a Python function in a real isolate host), the same raw bytes sent to both. Each
took every function off the lane before. Now the lane serves what cors and auth
hand on untouched (no Origin on cors's paths, no credential), with the answers,
events and access-log lines of the Python path; what they act on (an Origin on
cors's paths, a preflight, a key) is Python's on both."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from runtime.pipeline.lane import NativeLane
from tests.net.lane_support import static_reactor
from tests.net.test_native_lane import Side, request
from tests.pipeline.test_lane_plans import with_cors
from tests.support import EXAMPLES, function_dir, pop_thread, python_function

PYFN = '''
from edgefn import Response


def handle(request, env):
    who = request.principal.tenant if request.principal else "-"
    return Response(f"py {request.method} {who}\\n")
'''
ORIGIN = ("Origin", "https://app.example")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Side, Side, str]]:
    root = tmp_path_factory.mktemp("cors_keys")
    py = python_function(root / "fns", "py", PYFN, pool="min = 1\nmax = 1\nstandby = false")
    under = function_dir(root / "fns", "under", static_reactor(200, [(b"x-a", b"1")], b"ok"),
                         routes=["/cors/x"])
    with pop_thread(root / "on", pipeline=with_cors(), **{"http.native_lane": "auto"}) as on, \
            pop_thread(root / "off", pipeline=with_cors(), **{"http.native_lane": "off"}) as off:
        assert on.pop.keys is not None and off.pop.keys is not None
        key = on.pop.keys.store.create("acme", ("*",))[0]
        shutil.copyfile(on.pop.keys.store.path, off.pop.keys.store.path)  # one key, both
        for r in (on, off):
            r.deploy(EXAMPLES / "hello-wat")
            r.deploy(under)
            r.deploy(py)
            r.admin.request("POST", "/v1/keys/reload")
        assert isinstance(on.pop.lane, NativeLane) and off.pop.lane is None
        yield Side(on), Side(off), key


def test_what_cors_and_auth_hand_on_untouched_is_the_lanes(pair: tuple[Side, Side, str]
                                                           ) -> None:
    on, off, _ = pair
    lane = on.r.pop.lane
    assert isinstance(lane, NativeLane)
    curl = ("User-Agent", "curl/8")
    kinds = [(request("GET", "/hello", [("Host", "x"), curl]), b"GET"),
             (request("GET", "/hello", [("Host", "x"), curl, ORIGIN]), b"GET"),  # not cors's
             (request("GET", "/cors/x", [("Host", "x"), curl]), b"GET"),
             (request("GET", "/py", [("Host", "x"), curl]), b"GET"),
             (request("POST", "/py", [("Host", "x"), curl], b"abc"), b"POST")]
    on.r.delivered()  # `served` counts what the lane's drain took (under load, a ms later)
    served = lane.served
    for raw, method in kinds * 2:  # one a connection (a Python call makes it busy)
        got, want = on.send(raw, [method]), off.send(raw, [method])
        assert got == want and got[0].startswith(b"HTTP/1.1 200 "), (raw, got, want)
    on.r.delivered()
    assert lane.served - served == 10  # each in C (the Python calls answered there)
    assert on.new_events() == off.new_events()
    assert on.new_log() == off.new_log()


def test_what_cors_or_auth_acts_on_is_pythons(pair: tuple[Side, Side, str]) -> None:
    on, off, key = pair
    lane = on.r.pop.lane
    assert isinstance(lane, NativeLane)
    curl = ("User-Agent", "curl/8")
    acted = [
        (request("GET", "/cors/x", [("Host", "x"), curl, ORIGIN]), b"access-control-allow-origin: "
                                                                   b"https://app.example"),
        (request("OPTIONS", "/cors/x", [("Host", "x"), curl, ORIGIN,
                                        ("Access-Control-Request-Method", "POST")]),
         b"access-control-allow-methods"),
        (request("GET", "/py", [("Host", "x"), curl, ("x-api-key", key)]), b"py GET acme"),
        (request("GET", "/py", [("Host", "x"), curl, ("x-api-key", "efn_nope_nope")]),
         b"py GET -"),
    ]
    on.r.delivered()  # (see above)
    served, calls = lane.served, lane.calls
    for raw, says in acted:
        method = raw.split(b" ", 1)[0]
        got, want = on.send(raw, [method]), off.send(raw, [method])
        assert says in got[0] and got == want, (got, want)
    on.r.delivered()
    assert lane.served == served and lane.calls == calls  # none of them the lane's
    assert on.new_events() == off.new_events()
    assert on.new_log() == off.new_log()
