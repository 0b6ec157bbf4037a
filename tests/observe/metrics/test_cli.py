"""`edgefn metrics` against a real PoP (in a subprocess, as a user runs it)."""

from __future__ import annotations

from pathlib import Path

from tests.cli import edgefn, one_line_error
from tests.observe.metrics.support import event
from tests.observe.metrics.test_endpoint import observe
from tests.support import pop_thread


def test_prints_the_scrape_filtered_by_prefix(tmp_path: Path):
    with pop_thread(tmp_path / "data", **{"metrics.token": "a-metrics-token-123456"}) as pop:
        observe(pop, event(), event(status=404))
        r = edgefn("metrics", "--match", "edgefn_requests_total", "--data", str(pop.data))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:2] == ["# HELP edgefn_requests_total Requests answered.",
                         "# TYPE edgefn_requests_total counter"]
    assert len(lines) == 4 and all(x.startswith("edgefn_requests_total{") for x in lines[2:])
    assert sorted(x.rsplit(" ", 1)[1] for x in lines[2:]) == ["1.0", "1.0"]


def test_a_pop_without_metrics_says_so(tmp_path: Path):
    with pop_thread(tmp_path / "data", **{"metrics.enabled": False}) as pop:
        r = edgefn("metrics", "--data", str(pop.data))
    assert "no admin endpoint GET /metrics" in one_line_error(r)
