"""The AI caches across the tiers of a small topology of real processes (central
with the real chat model, one regional, two edges): simultaneous identical
misses make one model call at the origin, and an AI cache purge reaches every
tier (central keeps an AI cache here too), so no tier above an edge serves what
the purge removed."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.admin.client import AdminClient
from runtime.topology import runner, spec
from runtime.topology.load import Client, Sample, metric_sum
from runtime.topology.rundir import pop_dir
from tests.support import ROOT

SMALL = """
[network]
client_edge_rtt_ms = [10, 10]
edge_regional_rtt_ms = [30, 30]
central_rtt_ms = [100, 100]
jitter_ms = 0.0
[[pop]]
name = "central"
tier = "central"
[[pop]]
name = "reg"
tier = "regional"
parents = ["central"]
[[pop]]
name = "edge-eu"
tier = "edge"
geo = "eu-west"
parents = ["reg", "central"]
[[pop]]
name = "edge-us"
tier = "edge"
geo = "us-east"
parents = ["reg", "central"]
"""
MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("topo-ai")
    (folder / "topology.toml").write_text(SMALL)
    runner.up(spec.load(folder / "topology.toml"), folder / "run", "test", timeout=300)
    try:
        yield folder / "run"
    finally:
        runner.down(folder / "run")


def chat(run: Path, geo: str, question: str, rid: str = "") -> Sample:
    body = json.dumps({"model": MODEL, "max_tokens": 4, "temperature": 0,
                       "messages": [{"role": "user", "content": question}]}).encode()
    headers = {"content-type": "application/json", **({"x-request-id": rid} if rid else {})}
    with Client(geo, runner.read_network(run).entries[geo]) as client:
        return client.send("chat", "POST", "/v1/chat/completions", body, headers)


def reached(run: Path, pop: str, rids: set[str]) -> int:
    """How many of the requests `rids` reached `pop` (its events)."""
    events = AdminClient(pop_dir(run, pop), timeout=30).request(
        "GET", "/v1/events?path=/v1/chat/completions&limit=1000")["events"]
    return sum(e["rid"] in rids for e in events)


def model_calls(run: Path) -> float:
    """Chat calls the model at central finished."""
    text = AdminClient(pop_dir(run, "central"), timeout=30).metrics()
    return metric_sum(text, "edgefn_ai_request_success_total")


def regional_hits(run: Path) -> float:
    text = AdminClient(pop_dir(run, "reg"), timeout=30).metrics()
    return metric_sum(text, "edgefn_cache_requests_total", cache="ai", outcome="hit-exact")


def purge(run: Path, *args: str) -> dict[str, int]:
    out = subprocess.run([sys.executable, "-m", "runtime.cli", "cache", "purge", "--ai", *args,
                          "--json"], cwd=ROOT, text=True, capture_output=True, timeout=60,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_simultaneous_identical_misses_make_one_origin_call(run: Path) -> None:
    question = f"Name a colour. ({uuid.uuid4().hex[:8]})"
    before = model_calls(run)
    samples: list[Sample] = []
    rids = {f"{geo}-{i}-{uuid.uuid4().hex[:8]}": geo for geo in ("eu-west", "us-east")
            for i in range(3)}
    threads = [threading.Thread(target=lambda r=rid, g=geo: samples.append(chat(run, g, question,
                                                                                r)))
               for rid, geo in rids.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [s.status for s in samples] == [200] * 6, [s.error for s in samples]
    assert model_calls(run) == before + 1  # 3 per edge, 2 edges: one generation
    # each edge sent one of its three on, and the regional one of the two
    assert (reached(run, "reg", set(rids)), reached(run, "central", set(rids))) == (2, 1)


def test_an_ai_purge_reaches_every_tier(run: Path) -> None:
    question = f"Name a fruit. ({uuid.uuid4().hex[:8]})"
    purge(run, "--topology", str(run))  # what other tests left: the counts below are exact
    assert chat(run, "eu-west", question).cache == "miss"
    calls = model_calls(run)
    assert chat(run, "eu-west", question).cache == "hit-exact"
    assert purge(run, "--model", "other-model", "--topology", str(run))["purged"] == {
        "central": 0, "reg": 0, "edge-eu": 0, "edge-us": 0}
    assert chat(run, "eu-west", question).cache == "hit-exact"  # another model's purge
    # one edge purged on its own: the regional still answers, central is not asked
    hits = regional_hits(run)
    out = purge(run, "--data", str(pop_dir(run, "edge-eu")))
    assert out == {"purged": 1, "model": None, "tenant": None}
    assert chat(run, "eu-west", question).cache == "miss"
    assert (regional_hits(run), model_calls(run)) == (hits + 1, calls)
    # purged on every tier: the next one is generated at central again
    out = purge(run, "--model", MODEL, "--topology", str(run))
    assert list(out["purged"]) == ["central", "reg", "edge-eu", "edge-us"]  # top down
    assert out["purged"] == {"central": 1, "reg": 1, "edge-eu": 1, "edge-us": 0}
    assert chat(run, "eu-west", question).cache == "miss"
    assert (regional_hits(run), model_calls(run)) == (hits + 1, calls + 1)
    assert chat(run, "us-east", question).cache == "miss"  # filled from the regional again
    assert (regional_hits(run), model_calls(run)) == (hits + 2, calls + 1)


def decisions(run: Path, rid: str) -> dict[str, dict[str, Any]]:
    """Per PoP that saw request `rid`: its ``ai_cache`` decision."""
    out = {}
    for pop in ("edge-eu", "edge-us", "reg", "central"):
        events = AdminClient(pop_dir(run, pop), timeout=30).request(
            "GET", "/v1/events?path=/v1/chat/completions&limit=1000")["events"]
        for e in events:
            if e["rid"] == rid:
                out[pop] = e.get("decisions", {}).get("ai_cache", {})
    return out


def test_a_miss_hands_its_query_embedding_to_the_tiers_above(run: Path) -> None:
    """The edge embeds the question once; the regional and central look it up with that
    vector (``embedding: given``), and the regional's semantic hit for a paraphrase
    asked at the other edge comes from the vector that edge computed."""
    purge(run, "--topology", str(run))
    first, again = (f"emb-{i}-{uuid.uuid4().hex[:8]}" for i in (1, 2))
    sample = chat(run, "eu-west", "How do I stop my cat from scratching furniture?", first)
    assert (sample.status, sample.cache) == (200, "miss"), sample.error
    seen = decisions(run, first)
    assert [seen[p]["outcome"] for p in ("edge-eu", "reg", "central")] == ["miss"] * 3
    assert "embedding" not in seen["edge-eu"]  # embedded there
    assert seen["reg"]["embedding"] == seen["central"]["embedding"] == "given"
    sample = chat(run, "us-east", "How can I keep my cat from scratching the furniture?", again)
    assert (sample.status, sample.cache) == (200, "miss"), sample.error  # edge-us had nothing
    seen = decisions(run, again)
    assert "central" not in seen  # answered at the regional
    assert (seen["reg"]["outcome"], seen["reg"]["embedding"]) == ("hit-semantic", "given")
    assert seen["reg"]["similarity"] > 0.95
