"""``GET /metrics`` on a real PoP over loopback: the token, the separate listener,
the format, and the isolates' figures read at scrape time."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from runtime.executors.python.scheduler import PACK_WAIT
from runtime.functions import deploys
from runtime.observe.event import Event
from tests.observe.metrics.support import event, samples, value
from tests.support import (
    Running,
    free_port,
    function_dir,
    host_pids,
    pop_thread,
    python_function,
    reactor,
)

TOKEN = "scrape-token-0123456789"


def get(address: str, path: str = "/metrics", token: str | None = None,
        accept: str | None = None, method: str = "GET",
        host_header: str | None = None) -> tuple[int, dict[str, str], str]:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    headers = {"authorization": f"Bearer {token}"} if token else {}
    if accept:
        headers["accept"] = accept
    if host_header:
        headers["host"] = host_header
    try:
        conn.request(method, path, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read().decode()
    finally:
        conn.close()


def observe(running: Running, *events: Event) -> None:
    """Hand `events` to the PoP's observers on its loop, as the events stage does."""
    async def on_loop() -> None:
        for e in events:
            for observer in running.pop.observers:
                observer.observe(e)

    assert running.loop is not None
    asyncio.run_coroutine_threadsafe(on_loop(), running.loop).result(10)


@pytest.fixture
def secured(tmp_path: Path):
    port = free_port()
    with pop_thread(tmp_path / "data", **{"metrics.token": TOKEN, "name": "edge-test",
                                          "geo": "fra",
                                          "metrics.listen": f"127.0.0.1:{port}"}) as running:
        yield running, f"127.0.0.1:{port}"


def test_the_token_guards_both_listeners(secured):
    running, listener = secured
    admin = running.admin.info.admin
    for address in (admin, listener):
        status, headers, _ = get(address)
        assert status == 401 and headers["www-authenticate"].startswith("Bearer")
        assert get(address, token="wrong-token-0123456789")[0] == 401
        status, headers, body = get(address, token=TOKEN)
        assert status == 200
        assert headers["content-type"].startswith("text/plain; version=")
        assert "edgefn_requests_total" in body
    # the admin token scrapes the admin listener too; it is not the metrics listener's
    assert get(admin, token=running.admin.token)[0] == 200
    assert get(listener, token=running.admin.token)[0] == 401
    assert get(listener, path="/v1/functions", token=TOKEN)[0] == 404
    assert get(listener, token=TOKEN, method="POST")[0] == 405
    _, got, body = get(listener, token=TOKEN)
    status, head, nothing = get(listener, token=TOKEN, method="HEAD")
    assert (status, nothing) == (200, "")  # a HEAD says the length a GET's body has
    assert abs(int(head["content-length"]) - int(got["content-length"])) < 200 < len(body)


def test_events_observed_on_the_pops_loop_show_in_the_scrape(secured):
    running, listener = secured
    observe(running, *(event(status=s, duration_ms=2.0) for s in (200, 200, 500)))
    found = samples(get(listener, token=TOKEN)[2])
    assert value(found, "edgefn_requests_total", function="hello", route="/hello",
                 status_class="2xx", method="GET") == 2
    assert value(found, "edgefn_requests_total", function="hello", route="/hello",
                 status_class="5xx", method="GET") == 1


def test_openmetrics_when_the_scraper_asks_for_it(secured):
    _, listener = secured
    status, headers, body = get(listener, token=TOKEN,
                                accept="application/openmetrics-text; version=1.0.0")
    assert status == 200
    assert headers["content-type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith("# EOF")


def test_without_a_token_loopback_scrapes_are_open(tmp_path):
    port = free_port()
    with pop_thread(tmp_path / "data", **{"metrics.listen": f"127.0.0.1:{port}"}) as running:
        admin = running.admin.info.admin
        status, _, body = get(admin)
        assert status == 200 and "# TYPE edgefn_requests_total counter" in body
        # the rest of the admin API still wants its token
        assert get(admin, path="/v1/functions")[0] == 401
        # but a page whose name was rebound to 127.0.0.1 reads nothing (DNS rebinding)
        for address in (admin, f"127.0.0.1:{port}"):
            _, where = address.rsplit(":", 1)
            status, _, body = get(address, host_header=f"evil.example:{where}")
            assert status == 403 and "evil.example" in body, body
            for named in (f"localhost:{where}", f"127.0.0.1:{where}", "[::1]", "LOCALHOST"):
                assert get(address, host_header=named)[0] == 200, named


def test_a_token_lets_any_host_name_scrape(secured):
    _, listener = secured
    assert get(listener, token=TOKEN, host_header="prometheus.internal:9464")[0] == 200
    assert get(listener, host_header="prometheus.internal:9464")[0] == 401


PY = """
from edgefn import Response
def handle(request, env):
    return Response("hi")
"""


def test_isolates_warm_recycled_and_crashed(pop: Running, tmp_path: Path):
    pop.deploy(python_function(tmp_path, "py", PY,
                               pool="min = 1\nmax = 1\nstandby = false\nrecycle_after = 2"))
    admin = pop.admin.info.admin
    assert pop.get("/py")[0] == 200

    def scrape() -> dict:
        return samples(get(admin)[2])

    found = scrape()
    labels = {"pop": "edge-local", "tier": "edge", "geo": "",
              "version": pop.pop.registry.functions["py"].version}
    key = lambda name, **kw: (name, frozenset({**labels, "function": "py", **kw}.items()))  # noqa: E731
    assert found[key("edgefn_isolates", state="warm")] == 1
    assert found[key("edgefn_isolates", state="busy")] == 0
    assert found[key("edgefn_isolates_recycled_total")] == 0
    assert found[key("edgefn_isolates_sent_ahead_total")] == 0  # one request: none ahead
    assert found[key("edgefn_isolates_handed_back_total")] == 0
    assert pop.get("/py")[0] == 200  # its second job: recycled after it
    assert scrape()[key("edgefn_isolates_recycled_total")] == 1
    assert scrape()[key("edgefn_isolates_crashed_total")] == 0
    pid, = host_pids("py")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20  # the PoP notices the host's death on its own
    while scrape()[key("edgefn_isolates_crashed_total")] != 1:
        assert time.monotonic() < deadline, "the crash was never counted"
        time.sleep(0.05)


SLOW = """
import time
from edgefn import Response
def handle(request, env):
    time.sleep(float(request.query.get("sleep", "0")))
    return Response("hi")
"""


def test_requests_sent_ahead_and_handed_back_are_counted(pop: Running, tmp_path: Path):
    """One isolate, pipeline 1: B is sent ahead behind A; then, with a second isolate
    started by the load, it is handed back when that one finds nothing waiting."""
    pop.deploy(python_function(tmp_path, "ahead", SLOW,
                               pool="min = 1\nmax = 2\nstandby = false\npipeline = 1"))
    admin = pop.admin.info.admin
    labels = {"pop": "edge-local", "tier": "edge", "geo": "",
              "version": pop.pop.registry.functions["ahead"].version}
    key = lambda name: (name, frozenset({**labels, "function": "ahead"}.items()))  # noqa: E731
    a = threading.Thread(target=pop.get, args=("/ahead?sleep=2",), kwargs={"timeout": 10})
    a.start()
    time.sleep(0.3)  # A runs
    assert pop.get("/ahead", timeout=10)[0] == 200  # B: sent ahead, then handed back
    a.join()
    found = samples(get(admin)[2])
    assert found[key("edgefn_isolates_sent_ahead_total")] == 1
    assert found[key("edgefn_isolates_handed_back_total")] == 1


def test_an_auto_pool_shows_its_requests_mean_time_and_how_deep_it_packs(
        pop: Running, tmp_path: Path):
    """``pipeline = "auto"`` (the default): the mean starts at PACK_WAIT (1 ms) and
    follows each request: short ones bring it under, and the room it packs to is
    what the scheduler uses; requests of 5 ms take it past PACK_WAIT, room 0. A
    pool with a fixed pipeline shows neither."""
    pop.deploy(python_function(tmp_path, "auto", SLOW, pool="min = 1\nmax = 1\nstandby = false"))
    pop.deploy(python_function(tmp_path, "fixed", SLOW,
                               pool="min = 1\nmax = 1\nstandby = false\npipeline = 2"))
    admin = pop.admin.info.admin
    labels = {"pop": "edge-local", "tier": "edge", "geo": ""}
    functions = pop.pop.registry.functions
    key = lambda name, fn="auto": (name, frozenset({  # noqa: E731
        **labels, "function": fn, "version": functions[fn].version}.items()))
    scheduler = pop.pop.registry.functions["auto"].executor.pool.scheduler  # type: ignore[attr-defined]
    for _ in range(100):
        assert pop.get("/auto")[0] == 200
    found = samples(get(admin)[2])
    assert 0 < found[key("edgefn_isolates_job_seconds")] < PACK_WAIT / 2
    assert found[key("edgefn_isolates_pack_room")] == scheduler.room >= 1
    for _ in range(10):
        assert pop.get("/auto?sleep=0.005")[0] == 200
    found = samples(get(admin)[2])
    assert found[key("edgefn_isolates_job_seconds")] > PACK_WAIT
    assert found[key("edgefn_isolates_pack_room")] == 0
    assert key("edgefn_isolates_job_seconds", "fixed") not in found
    assert key("edgefn_isolates_pack_room", "fixed") not in found


def test_wasm_instantiate_seconds_counts_each_request_not_the_warm_ups(pop: Running,
                                                                        tmp_path: Path):
    pop.deploy(function_dir(tmp_path, "hello", reactor("")))
    for _ in range(7):
        assert pop.get("/hello")[0] == 200
    found = samples(get(pop.admin.info.admin)[2])
    labels = {"pop": "edge-local", "tier": "edge", "geo": "", "function": "hello",
              "version": pop.pop.registry.functions["hello"].version}
    key = lambda name, **kw: (name, frozenset({**labels, **kw}.items()))  # noqa: E731
    assert found[key("edgefn_wasm_instantiate_seconds_count")] == 7
    assert found[key("edgefn_wasm_instantiate_seconds_bucket", le="+Inf")] == 7
    assert 0 < found[key("edgefn_wasm_instantiate_seconds_sum")] < 7 * 0.1
    assert found[key("edgefn_wasm_instantiate_seconds_bucket", le="1e-05")] <= \
        found[key("edgefn_wasm_instantiate_seconds_bucket", le="0.01")]


def test_a_canary_has_series_of_its_own_beside_the_live_versions(pop: Running,
                                                                   tmp_path: Path):
    """Its executor's were left out: its isolates and instantiations were counted
    nowhere (edgefn_requests_total counted its requests), and a promote made the
    function's series jump to the canary's counts."""
    d = function_dir(tmp_path, "split", reactor(""))
    live = pop.deploy(d)["version"]
    (d / "main.wat").write_text(reactor("", "(; v2 ;)"))
    staged = pop.admin.request("POST", "/v1/stage", deploys.to_tar(deploys.pack_dir(d)))
    canary = staged["version"]
    pop.admin.request("POST", "/v1/functions/split/activate",
                      json.dumps({"version": canary, "canary": 50}).encode())
    served = [pop.get("/split", headers={"x-edgefn-canary-key": f"k{i}"})[1]
              ["x-edgefn-function"] for i in range(40)]
    found = samples(get(pop.admin.info.admin)[2])
    labels = {"pop": "edge-local", "tier": "edge", "geo": "", "function": "split"}
    counts = {v: found.get(("edgefn_wasm_instantiate_seconds_count", frozenset(
        {**labels, "version": v}.items()))) for v in (live, canary)}
    assert counts == {v: served.count(f"split@{v}") for v in (live, canary)}
    assert all(counts.values())  # (each got some of the 40 keys)


def test_the_ctypes_path_records_instantiation_times_too(tmp_path: Path):
    """Without the native library (no C compiler, EDGEFN_NATIVE=0) the same histogram."""
    import wasmtime

    from runtime.executors.wasm.ffi import Outcome, ReactorCall
    from runtime.executors.wasm.timing import InstantiateTimes

    engine = wasmtime.Engine()
    module = wasmtime.Module(engine, reactor(""))
    pre = wasmtime.Linker(engine).instantiate_pre(module)
    times = InstantiateTimes()
    call = ReactorCall(engine, pre, 1 << 24, 1 << 40, Outcome("timeout", 1000, 1 << 24),
                       1 << 20, times)
    from edgefn_core.abi import encode_request
    for _ in range(3):
        call(encode_request(b"GET", b"/", b"", [], b"", b""))
    call.prewarm(encode_request(b"GET", b"/", b"", [], b"", b""))
    bounds, counts, total = times.snapshot()
    assert sum(counts) == 3 and len(counts) == len(bounds) + 1 and 0 < total < 0.3


def test_what_the_http_front_refuses_itself_is_counted(tmp_path: Path) -> None:
    """A malformed request, a body over http.max_body_bytes or a URL over its limit
    never reach the pipeline: no event, no access-log line, no sample anywhere,
    so an operator could not see a client sending them."""
    import socket

    from prometheus_client.parser import text_string_to_metric_families

    with pop_thread(tmp_path / "data", **{"http.max_body_bytes": 1000}) as pop:
        def send(raw: bytes) -> bytes:
            with socket.create_connection((pop.host, pop.port), timeout=10) as s:
                s.sendall(raw)
                return s.recv(100)

        assert send(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n") \
            .startswith(b"HTTP/1.1 400")
        for _ in range(2):
            assert send(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n") \
                .startswith(b"HTTP/1.1 413")
        assert pop.get("/hello-nothing")[0] == 404  # through the pipeline: not counted here
        with socket.create_connection((pop.host, pop.port), timeout=10) as held:
            held.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
            assert held.recv(100).startswith(b"HTTP/1.1 404")
            text = pop.admin.metrics()  # while it is open
    found = {(s.labels.get("status"), s.name): s.value
             for f in text_string_to_metric_families(text) for s in f.samples
             if s.name.startswith("edgefn_http_")}
    assert found[("400", "edgefn_http_front_refused_total")] == 1
    assert found[("413", "edgefn_http_front_refused_total")] == 2
    assert ("404", "edgefn_http_front_refused_total") not in found
    assert found[(None, "edgefn_http_connections_cut_total")] == 0
    assert found[(None, "edgefn_http_connections")] >= 1
