"""The model origin dies (kill -9 of central, the only PoP that runs the model):
an edge with ``[ai_cache] stale_if_error_s`` still answers a question it answered
before, past its TTL, marked stale; a question nobody asked before gets the
origin's error."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
import uuid
from pathlib import Path

from runtime.topology import runner
from runtime.topology.rundir import read_state
from tests.topologies import network, pop, running

STALE = "[pop.settings.ai_cache]\nstale_if_error_s = 600\n"
TOPOLOGY = (network(4, 10, 20, health_interval_s=0.2) + pop("central", "central")
            + pop("edge", "edge", geo="g1", parents=["central"], settings=STALE))


def chat(port: int, question: str, ttl: str = "") -> tuple[int, dict[str, str], bytes]:
    body = json.dumps({"model": "smollm2-135m", "max_tokens": 3, "temperature": 0,
                       "messages": [{"role": "user", "content": question}]}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/v1/chat/completions", body, {
            "content-type": "application/json", **({"x-edgefn-cache-ttl": ttl} if ttl else {})})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_with_central_dead_an_edge_answers_what_it_answered_before_marked_stale(
        tmp_path: Path) -> None:
    with running(tmp_path, TOPOLOGY) as run:
        state, port = read_state(run), runner.read_network(run).entries["g1"]
        assert state is not None
        question = f"Name a colour. ({uuid.uuid4().hex[:6]})"
        status, headers, first = chat(port, question, ttl="1")
        assert (status, headers["x-edgefn-cache"]) == (200, "miss"), first
        time.sleep(1.05)  # the entry expired
        os.kill(next(p.pid for p in state.pops if p.name == "central"), signal.SIGKILL)
        status, headers, out = chat(port, question)
        assert status == 200, out
        assert headers["x-edgefn-cache"] == "stale"
        assert headers["x-edgefn-fallback"] == "stale; origin=502"
        said = [(c["message"], c["finish_reason"]) for c in json.loads(first)["choices"]]
        assert [(c["message"], c["finish_reason"]) for c in json.loads(out)["choices"]] == said
        status, headers, out = chat(port, f"Name a fruit. ({uuid.uuid4().hex[:6]})")
        assert status == 502 and "x-edgefn-fallback" not in headers, out
        assert json.loads(out)["error"]["code"] == "upstream_unavailable"
