"""Events, health and `edgefn tail`/`edgefn events` over real HTTP on loopback,
against a real PoP (tests.support.pop_thread)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.observe.event import Event
from tests.support import EXAMPLES, ROOT, Running, function_dir, pop_thread, reactor, wait_for

KINDS = {"hello": ("/hello", 200), "missing": ("/nowhere", 404), "trap": ("/trap", 500),
         "stream": ("/py/stream?n=3", 200), "health": ("/healthz", 200)}


def requests_total(pop: Running) -> float:
    """The sum of ``edgefn_requests_total`` over its series, from a real scrape."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in pop.admin.metrics().splitlines()
               if line.startswith("edgefn_requests_total{"))


def events_of(pop: Running) -> list[Event]:
    pop.delivered()
    return list(pop.pop.ring.events.copy())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    root = tmp_path_factory.mktemp("events")
    with pop_thread(root / "data") as pop:
        pop.deploy(function_dir(root, "hello", reactor("")))
        pop.deploy(function_dir(root, "trap", reactor("(unreachable)")))
        pop.deploy(EXAMPLES / "python-stream")
        yield pop


@settings(max_examples=6, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=40))
def test_n_concurrent_requests_make_exactly_n_events(served: Running, kinds: list[str]) -> None:
    rids = [f"t-{uuid.uuid4().hex[:16]}" for _ in kinds]
    counted = requests_total(served)

    def send(i: int) -> int:
        status, _, _ = served.get(KINDS[kinds[i]][0], headers={"x-request-id": rids[i]})
        return status

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(send, range(len(kinds))))
    assert statuses == [KINDS[k][1] for k in kinds]
    expected = {rid for rid, k in zip(rids, kinds, strict=True) if k != "health"}
    mine = lambda: [e for e in events_of(served) if e.rid in set(rids)]  # noqa: E731
    wait_for(lambda: len(mine()) >= len(expected), 10, "an event for every request")
    time.sleep(0.05)  # a duplicate would come right after the first: give it a chance
    got = mine()
    assert sorted(e.rid for e in got) == sorted(expected)  # one each, and none for probes
    assert requests_total(served) - counted == len(expected)  # events = requests = metric
    by_rid = {e.rid: e for e in got}
    for rid, k in zip(rids, kinds, strict=True):
        if k != "health":
            assert by_rid[rid].status == KINDS[k][1]
            if k == "stream":
                assert by_rid[rid].bytes_out == len(b"data: tick 0\n\n") * 3 + 14


def test_the_admin_api_lists_events_and_refuses_a_bad_filter(served: Running) -> None:
    rid = f"q-{uuid.uuid4().hex[:12]}"
    served.get("/trap", headers={"x-request-id": rid})
    wait_for(lambda: any(e.rid == rid for e in events_of(served)), 5, "the event")
    listed = served.admin.request("GET", "/v1/events?since=1m&function=trap&status=5xx")
    assert rid in [e["rid"] for e in listed["events"]]
    assert all(e["status"] >= 500 and e["target"].startswith("trap@") for e in listed["events"])
    from edgefn_core.errors import AdminError
    with pytest.raises(AdminError) as err:
        served.admin.request("GET", "/v1/events?status=teapot")
    assert err.value.status == 400 and "status" in str(err.value)


def test_the_sse_stream_follows_traffic_as_it_flows(served: Running) -> None:
    tag = uuid.uuid4().hex[:8]
    got: list[dict[str, object]] = []
    subscribed = threading.Event()

    def follow() -> None:
        for line in served.admin.stream("/v1/events/stream?function=hello"):
            subscribed.set()
            if line.startswith(b"data: "):
                got.append(json.loads(line[6:]))
                if len(got) == 5:
                    return

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    assert subscribed.wait(5)
    for i in range(5):
        served.get(f"/hello?i={i}&tag={tag}")
        served.get("/nowhere")  # filtered out
    reader.join(10)
    assert [e["query"] for e in got] == [f"i={i}&tag={tag}" for i in range(5)]
    wait_for(lambda: served.pop.ring.subscribers == [], 5, "the follower unsubscribed")


def cli(data: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "runtime.cli", *args, "--data", str(data)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_edgefn_tail_prints_a_line_per_request_and_ctrl_c_exits_cleanly(served: Running
                                                                        ) -> None:
    tail = cli(served.data, "tail", "--function", "hello")
    try:
        wait_for(lambda: len(served.pop.ring.subscribers) > 0, 20, "tail subscribed")
        served.get("/hello?from=tail")
        served.get("/nowhere")
        assert tail.stdout is not None
        line = tail.stdout.readline()
        parts = line.split()
        assert parts[1:5] == ["200", "GET", "/hello", parts[4]] and parts[4].startswith("hello@")
        assert parts[5].endswith("ms")
    finally:
        tail.send_signal(signal.SIGINT)
        _, err = tail.communicate(timeout=10)
    assert tail.returncode in (0, 130) and "Traceback" not in err


def test_edgefn_events_since_prints_json_of_recent_requests(served: Running) -> None:
    rid = f"c-{uuid.uuid4().hex[:12]}"
    served.get("/hello", headers={"x-request-id": rid})
    wait_for(lambda: any(e.rid == rid for e in events_of(served)), 5, "the event")
    out, err = cli(served.data, "events", "--since", "10m", "--function", "hello",
                   "--json").communicate(timeout=30)
    events = [json.loads(line) for line in out.splitlines()]
    assert rid in [e["rid"] for e in events] and all(e["path"] == "/hello" for e in events)
    proc = cli(served.data, "events", "--since", "ten minutes")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "argument --since" in err and "Traceback" not in err


def test_health_answers_on_the_public_port_and_makes_no_event(served: Running) -> None:
    before = len(events_of(served))
    assert served.get("/healthz")[::2] == (200, b'{"status":"ok"}\n')
    status, _, body = served.get("/readyz")
    assert (status, json.loads(body)) == (200, {"status": "ready"})
    assert served.get("/health")[0] == 404  # no OpenAI API on this PoP: not reserved
    assert len(events_of(served)) == before + 1  # the 404 only


def test_health_paths_are_configurable_and_reserved(tmp_path: Path) -> None:
    with pop_thread(tmp_path / "data", **{"health.live": "/alive", "health.ready": ""}) as pop:
        assert pop.get("/alive")[0] == 200 and pop.get("/healthz")[0] == 404
        assert pop.get("/readyz")[0] == 404
        from edgefn_core.errors import AdminError
        with pytest.raises(AdminError) as err:
            pop.deploy(function_dir(tmp_path, "alive", reactor(""), routes=["/alive"]))
        assert err.value.status == 409 and "/alive" in str(err.value)


def test_events_go_to_a_rotating_jsonl_file(tmp_path: Path) -> None:
    with pop_thread(tmp_path / "data", **{"events.file": "events.jsonl"}) as pop:
        pop.deploy(function_dir(tmp_path, "hello", reactor("")))
        for _ in range(3):
            pop.get("/hello")
    lines = (tmp_path / "data" / "events.jsonl").read_text().splitlines()
    assert [json.loads(line)["path"] for line in lines] == ["/hello"] * 3


def test_edgefn_tail_says_so_when_the_pop_stops(tmp_path: Path) -> None:
    """It exited 0, silently, as if all was well."""
    with pop_thread(tmp_path / "data") as pop:
        tail = cli(pop.data, "tail")
        try:
            wait_for(lambda: len(pop.pop.ring.subscribers) > 0, 20, "tail subscribed")
        except BaseException:
            tail.kill()
            raise
    _, err = tail.communicate(timeout=30)
    assert tail.returncode == 1 and "the PoP closed the event stream" in err, err


CUT_STREAM = """
from edgefn import Response

def chunks():
    yield "head\\n"
    while True:
        pass

def handle(request, env):
    return Response(chunks())
"""


def test_a_stream_cut_after_its_head_is_an_event_with_its_error(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture
                                                                ) -> None:
    """The client gets a 200 cut short (the status line is gone); its event said 200
    with no error, and nothing was logged above INFO: a limit that cut a stream was
    invisible to operators and authors."""
    import http.client
    import logging

    from tests.support import python_function

    with pop_thread(tmp_path / "data") as pop:
        pop.deploy(python_function(tmp_path, "cut", CUT_STREAM, limits="cpu_ms = 100"))
        conn = http.client.HTTPConnection(pop.host, pop.port, timeout=10)
        with caplog.at_level(logging.WARNING, logger="edgefn.pop"):
            conn.request("GET", "/cut")
            resp = conn.getresponse()
            assert resp.status == 200
            with pytest.raises(http.client.IncompleteRead):
                resp.read()
            conn.close()
            wait_for(lambda: any(e.path == "/cut" for e in pop.pop.ring.events.copy()), 10,
                     "the stream's event")
        (event,) = [e for e in pop.pop.ring.events.copy() if e.path == "/cut"]
        assert (event.status, event.error) == (200, "cpu_limit")
        assert any("cut@" in r.getMessage() and ": cpu_limit: " in r.getMessage()
                   and "streamed response was cut after its head" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
