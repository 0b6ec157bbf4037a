"""The model worker's figures in a scrape: a real worker's, and a hung worker
that must not stall the scrape (the last figures stay, ``worker_up`` goes to 0)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from runtime.observe.metrics_worker import WorkerFigures
from tests.ai.test_worker_timeouts import HungWorker
from tests.observe.metrics.support import samples, value
from tests.support import pop_thread

SNAPSHOT = {"queue_depth": 3, "running_batch": 2, "running_batch_peak": 4,
            "busy_fraction": 0.75, "tokens_total": 120, "prompt_tokens_total": 40,
            "requests_total": 7, "errors_total": 1, "decode_calls_total": 90,
            "preemptions_total": 2, "recomputes_total": 1}


def scrape_text(address: str) -> tuple[str, float]:
    import http.client

    host, port = address.rsplit(":", 1)
    began = time.monotonic()
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode(), time.monotonic() - began
    finally:
        conn.close()


def test_figures_keep_their_last_value_when_the_worker_stops_answering():
    now = [100.0]
    answers: list[Any] = [SNAPSHOT]

    async def fetch() -> dict[str, Any]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if answer is None:
            await asyncio.sleep(60)  # a worker that never answers
        return answer

    figures = WorkerFigures(("p", "edge", "fra"), fetch, timeout=0.05, clock=lambda: now[0])

    def read() -> dict[str, float]:
        return {s.name: s.value for f in figures.collect() for s in f.samples}

    assert read() == {"edgefn_ai_worker_up": 0.0}  # nothing yet
    asyncio.run(figures.refresh())
    got = read()
    assert got["edgefn_ai_worker_up"] == 1.0
    assert got["edgefn_ai_num_requests_waiting"] == 3
    assert got["edgefn_ai_num_requests_running"] == 2
    assert got["edgefn_ai_batch_size"] == 4
    assert got["edgefn_ai_busy_fraction"] == 0.75
    assert got["edgefn_ai_worker_tokens_total"] == 120
    assert got["edgefn_ai_worker_decode_calls_total"] == 90
    assert got["edgefn_ai_worker_preemptions_total"] == 2
    assert got["edgefn_ai_worker_recomputes_total"] == 1
    for answer in (None, ConnectionResetError("worker gone")):
        answers.append(answer)
        now[0] += 5
        began = time.monotonic()
        asyncio.run(figures.refresh())
        assert time.monotonic() - began < 1.0
        got = read()
        assert got["edgefn_ai_worker_up"] == 0.0
        assert got["edgefn_ai_num_requests_waiting"] == 3  # the last figures
    assert got["edgefn_ai_worker_figures_age_seconds"] == 10.0


def test_a_hung_worker_does_not_stall_the_scrape(tmp_path: Path):
    hung = HungWorker(tmp_path / "hung.sock", False)
    try:
        with pop_thread(tmp_path / "data", ai=True, **{"ai.socket": str(tmp_path / "hung.sock"),
                                                      "metrics.worker_timeout": 0.2}) as pop:
            text, took = scrape_text(pop.admin.info.admin)
            assert 0.2 * 0.9 <= took < 0.2 + 1.0  # it asked, waited its timeout, went on
            found = samples(text)
            assert value(found, "edgefn_ai_worker_up", pop="edge-local", geo="") == 0.0
            assert not any(n.startswith("edgefn_ai_num_requests") for n, _ in found)
    finally:
        hung.close()


def test_a_real_workers_figures(tmp_path: Path):
    with pop_thread(tmp_path / "data", ai=True) as pop:
        text, _ = scrape_text(pop.admin.info.admin)
    found = {n: v for (n, _), v in samples(text).items()}
    assert found["edgefn_ai_worker_up"] == 1.0
    assert found["edgefn_ai_num_requests_running"] == 0
    assert found["edgefn_ai_num_requests_waiting"] == 0
    assert 0.0 <= found["edgefn_ai_busy_fraction"] <= 1.0
