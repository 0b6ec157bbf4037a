"""A small topology of real processes (central + one regional + two edges, the real
chat model at central): requests enter at a geography's edge through its link and
a model call that misses an edge goes to the regional, then to central."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.admin.client import AdminClient
from runtime.topology import runner
from runtime.topology.links import TICK
from runtime.topology.load import Client, metric_sum
from runtime.topology.rundir import pop_dir, read_state
from tests.support import EXAMPLES, ROOT
from tests.topologies import HELLO, network, pop, running

CACHED = "[pop.settings.http_cache]\ndefault_ttl = 600\n"
SMALL = (network(10, 30, 100) + pop("central", "central")
         + pop("reg", "regional", parents=["central"])
         + pop("edge-eu", "edge", geo="eu-west", parents=["reg", "central"],
               functions=[HELLO, EXAMPLES / "ai-py"], settings=CACHED)
         + pop("edge-us", "edge", geo="us-east", parents=["reg", "central"], functions=[HELLO],
               settings=CACHED))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with running(tmp_path_factory.mktemp("topo"), SMALL) as run:
        yield run


def _chat(run: Path, geo: str, question: str, rid: str = "") -> tuple[int, str, str]:
    body = json.dumps({"model": "smollm2-135m", "max_tokens": 4, "temperature": 0,
                       "messages": [{"role": "user", "content": question}]}).encode()
    headers = {"content-type": "application/json", **({"x-request-id": rid} if rid else {})}
    with _entry(run, geo) as client:
        s = client.send("chat", "POST", "/v1/chat/completions", body, headers)
    return s.status, s.cache, s.error


def _counts(run: Path, pop: str) -> tuple[float, float]:
    """(model calls finished, AI cache exact hits) of `pop`."""
    text = AdminClient(pop_dir(run, pop), timeout=30).metrics()
    return (metric_sum(text, "edgefn_ai_request_success_total"),
            metric_sum(text, "edgefn_cache_requests_total", cache="ai", outcome="hit-exact"))


def _entry(run: Path, geo: str) -> Client:
    return Client(geo, runner.read_network(run).entries[geo])


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.cli", *argv], cwd=ROOT, text=True,
                          capture_output=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_status_shows_every_pop_ready(run: Path) -> None:
    out = _cli("topology", "status", "--dir", str(run), "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert {n: (r["tier"], r["health"]) for n, r in rows.items()} == {
        "central": ("central", "ready"), "reg": ("regional", "ready"),
        "edge-eu": ("edge", "ready"), "edge-us": ("edge", "ready")}
    state = read_state(run)
    assert state is not None and [p.pid for p in state.pops] == [r["pid"] for r in rows.values()]


def test_a_miss_at_one_edge_is_filled_from_the_regional_cache(run: Path) -> None:
    question = f"What colour is the sky? ({uuid.uuid4().hex[:8]})"
    central0, reg0 = _counts(run, "central"), _counts(run, "reg")
    assert _chat(run, "eu-west", question)[:2] == (200, "miss")
    assert _counts(run, "central")[0] == central0[0] + 1  # generated at central
    status, cache, _ = _chat(run, "us-east", question)
    assert (status, cache) == (200, "miss")  # the other edge never saw it...
    assert _counts(run, "reg")[1] == reg0[1] + 1  # ...the regional had it
    assert _counts(run, "central")[0] == central0[0] + 1  # and central was not asked again
    assert _chat(run, "us-east", question)[:2] == (200, "hit-exact")


def test_the_request_id_goes_with_the_request_to_every_tier(run: Path) -> None:
    rid = f"topo-{uuid.uuid4().hex[:12]}"
    status, _, err = _chat(run, "eu-west", f"Name a fruit. ({rid})", rid)
    assert status == 200, err
    for name in ("edge-eu", "reg", "central"):
        events = AdminClient(pop_dir(run, name), timeout=30).request(
            "GET", "/v1/events?path=/v1/chat/completions&limit=100")
        assert rid in [e["rid"] for e in events["events"]], name


def test_a_function_at_the_edge_calls_the_model_through_the_tiers(run: Path) -> None:
    central0 = _counts(run, "central")[0]
    with _entry(run, "eu-west") as client:
        s = client.send("fn", "GET", f"/ai-py?q={uuid.uuid4().hex[:6]}+Say+hi&max_tokens=4")
    assert s.status == 200, s.error
    assert _counts(run, "central")[0] == central0 + 1


def test_the_link_delay_is_paid_on_the_way_in(run: Path) -> None:
    with _entry(run, "eu-west") as client:
        first = client.send("fn", "GET", "/hello")
        warm = [client.send("fn", "GET", "/hello") for _ in range(5)]
    assert first.status == 200 and all(s.status == 200 for s in warm)
    # configured 10 ms round trip: a fresh connection pays 2, a kept-alive one 1; the
    # relay delivers a chunk up to TICK early (uvloop's timers are whole milliseconds:
    # a full run once saw a warm round trip of 9.94 ms)
    assert first.seconds >= 0.020 - 4 * TICK
    assert min(s.seconds for s in warm) >= 0.010 - 2 * TICK
    assert min(s.seconds for s in warm) <= 0.010 + 0.025


def test_a_purge_reaches_every_pop(run: Path) -> None:
    for geo in ("eu-west", "us-east"):
        with _entry(run, geo) as client:
            client.send("fn", "GET", "/hello")
            assert client.send("fn", "GET", "/hello").status == 200
    out = _cli("cache", "purge", "--topology", str(run), "--prefix", "/hello", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"purged": {"central": 0, "edge-eu": 1, "edge-us": 1,
                                                 "reg": 0}}


def test_the_load_command_enters_at_a_geography(run: Path) -> None:
    out = _cli("topology", "load", "--geo", "us-east", "-n", "5", "--dir", str(run), "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert (result["requests"], result["failed"]) == (5, 0)
    assert result["p50_ms"] >= 10.0  # the client-edge round trip, at least
    assert result["statuses"] == {"200": 5}
    out = _cli("topology", "load", "--geo", "us-east", "-n", "3", "--path", "/nope",
               "--dir", str(run))
    assert out.returncode == 0, out.stderr  # nothing answered 200: no latency to quote
    assert out.stdout.split() == ["requests=3", "failed=3", "p50_ms=-", "p95_ms=-", "p99_ms=-",
                                  "statuses=404:3"]
    out = _cli("topology", "load", "--geo", "mars", "--dir", str(run), "--json")
    assert out.returncode == 1 and "us-east" in json.loads(out.stderr)["error"]["message"]
