"""`runtime.observe.metrics_merge`: the families of ``workers = N`` summed into one
scrape, across the wire format the workers send, without processes (the real
2-worker scrape: tests/test_workers_fanout.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from runtime.observe.metrics import RequestMetrics
from runtime.observe.metrics_continuity import Continuity
from runtime.observe.metrics_merge import Merged, from_wire, to_wire
from runtime.observe.metrics_pop import PopMetrics
from runtime.observe.settings_metrics import MetricsSettings
from tests.observe.metrics.support import event, scrape, value
from tests.support import own_records


def worker(*statuses: int) -> RequestMetrics:
    observer = RequestMetrics("edge-test", "edge", "fra")
    for status in statuses:
        observer.observe(event(status=status, duration_ms=2.0 * status / 100))
    return observer


def merged(local: RequestMetrics, *peers: RequestMetrics, missing: int = 0
           ) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(local)
    wires = [json.loads(json.dumps(to_wire(p.collect()))) for p in peers]  # as sent
    out = CollectorRegistry(auto_describe=False)
    out.register(Merged(list(registry.collect()), [from_wire(w) for w in wires], missing,
                        local.base))
    return scrape(out)


def test_counters_and_histograms_of_every_worker_are_summed() -> None:
    found = merged(worker(200, 200, 404), worker(200, 503), worker(200))
    total = "edgefn_requests_total"
    assert value(found, total, function="hello", route="/hello", status_class="2xx",
                 method="GET") == 4
    assert value(found, total, function="hello", route="/hello", status_class="4xx",
                 method="GET") == 1
    assert value(found, total, function="hello", route="/hello", status_class="5xx",
                 method="GET") == 1
    labels = {"function": "hello", "route": "/hello", "status_class": "2xx"}
    assert value(found, "edgefn_request_duration_seconds_count", **labels) == 4
    assert value(found, "edgefn_request_duration_seconds_sum", **labels) == pytest.approx(0.016)
    assert value(found, "edgefn_request_duration_seconds_bucket", le="0.001", **labels) == 0
    assert value(found, "edgefn_request_duration_seconds_bucket", le="0.005", **labels) == 4
    assert value(found, "edgefn_response_bytes_total", **labels) == 40
    assert value(found, "edgefn_scrape_workers_missing") == 0


def test_a_series_only_one_worker_has_is_kept_and_missing_workers_are_counted() -> None:
    found = merged(worker(), worker(404), missing=1)
    assert value(found, "edgefn_requests_total", function="hello", route="/hello",
                 status_class="4xx", method="GET") == 1
    assert value(found, "edgefn_scrape_workers_missing") == 1


@pytest.mark.parametrize("wire", [
    [["edgefn_x", "doc", "no-such-type", "", []]],
    [["edgefn_x", "doc", "counter", ""]],
    [["edgefn_x", "doc", "counter", "", [["edgefn_x_total", {}, "many"]]]],
])
def test_a_bad_wire_is_refused_with_an_error(wire: list) -> None:
    with pytest.raises((ValueError, TypeError)):
        from_wire(wire)


def test_a_worker_whose_answer_does_not_decode_is_counted_missing() -> None:
    metrics = PopMetrics("edge-test", "edge", "fra", MetricsSettings(), lambda: [])
    metrics.requests.observe(event())
    good = to_wire(worker(200).collect())

    async def peers(timeout: float) -> list:
        assert timeout == MetricsSettings().worker_timeout
        return [(11, [["edgefn_x", "doc"]]), (12, good), None]  # one bad, one silent

    metrics.peers = peers
    source = metrics.endpoint(None).source
    assert source is not None
    found = scrape(asyncio.run(source()))
    assert value(found, "edgefn_requests_total", function="hello", route="/hello",
                 status_class="2xx", method="GET") == 2
    assert value(found, "edgefn_scrape_workers_missing") == 2


def test_a_worker_that_misses_a_scrape_counts_with_its_last_answer() -> None:
    """Left out of the scrape it missed, a worker's counters fell by all it had
    counted and came back at the next: Prometheus read a reset and increase()
    showed traffic that never happened. Its last answer stands in now."""
    metrics = PopMetrics("edge-test", "edge", "fra", MetricsSettings(), lambda: [])
    metrics.requests.observe(event())
    answers: list = [to_wire(worker(200, 200).collect()), to_wire(worker(200).collect())]

    async def peers(timeout: float) -> list:
        return [None if a is None else (11 + i, a) for i, a in enumerate(answers)]

    metrics.peers = peers
    source = metrics.endpoint(None).source
    assert source is not None

    def hello() -> tuple[float, float]:
        found = scrape(asyncio.run(source()))
        return (value(found, "edgefn_requests_total", function="hello", route="/hello",
                      status_class="2xx", method="GET"),
                value(found, "edgefn_scrape_workers_missing"))

    assert hello() == (4, 0)
    answers[0] = None  # worker 1 is slow for this scrape
    assert hello() == (4, 1)
    answers[1] = [["edgefn_x", "doc"]]  # and worker 2's answer is garbled
    assert hello() == (4, 2)
    answers[0] = to_wire(worker(200, 200, 200).collect())  # worker 1 answers again
    assert hello() == (5, 1)


def two_workers(tmp: Path | None = None) -> tuple[PopMetrics, list]:
    """A PopMetrics whose one other worker answers `answers[0]`: (pid, families)."""
    metrics = PopMetrics("edge-test", "edge", "fra", MetricsSettings(), lambda: [])
    if tmp is not None:
        metrics.continuity = Continuity(tmp / "continuity.json", parent="p:1")
    answers: list = [None]

    async def peers(timeout: float) -> list:
        return list(answers)

    metrics.peers = peers
    return metrics, answers


def hello_2xx(metrics: PopMetrics) -> float:
    source = metrics.endpoint(None).source
    assert source is not None
    found = scrape(asyncio.run(source()))
    return value(found, "edgefn_requests_total", function="hello", route="/hello",
                 status_class="2xx", method="GET")


def test_a_restarted_worker_s_counts_are_carried_so_the_sum_never_falls() -> None:
    """Summed, a restarted worker's counters fell by what it had counted: Prometheus
    read a reset and counted the whole sum again (40 requests read as 107)."""
    metrics, answers = two_workers()
    metrics.requests.observe(event())
    answers[0] = (11, to_wire(worker(200, 200, 200).collect()))
    assert hello_2xx(metrics) == 4
    answers[0] = (12, to_wire(worker().collect()))  # restarted: nothing counted yet
    assert hello_2xx(metrics) == 4
    answers[0] = (12, to_wire(worker(200, 200).collect()))
    assert hello_2xx(metrics) == 6
    answers[0] = (12, to_wire(worker(200, 200, 200).collect()))  # same life: no carry
    assert hello_2xx(metrics) == 7


def test_gauges_are_not_carried() -> None:
    from prometheus_client.metrics_core import GaugeMetricFamily

    gauge = GaugeMetricFamily("edgefn_isolates", "d", labels=("state",))
    gauge.add_metric(("idle",), 3)
    continuity = Continuity(None, parent="p:1")
    continuity.follow("1", 11, [gauge, *worker(200).collect()])
    continuity.follow("1", 12, [])
    assert {f.name for f in continuity.carried_families()} == {
        f.name for f in worker(200).collect() if f.type != "gauge" and f.samples}


def test_the_admin_worker_s_own_restart_carries_from_the_saved_state(tmp_path: Path) -> None:
    metrics, answers = two_workers(tmp_path)
    for _ in range(5):
        metrics.requests.observe(event())
    answers[0] = (11, to_wire(worker(200).collect()))
    assert hello_2xx(metrics) == 6
    # the admin worker restarts: a new process, its counters at 0, the other worker's not
    again, answers = two_workers(tmp_path)
    again.pid = metrics.pid + 1
    answers[0] = (11, to_wire(worker(200).collect()))
    assert hello_2xx(again) == 6
    # another PoP (another parent) does not read it: its counters start at 0
    fresh, answers = two_workers()
    fresh.continuity = Continuity(tmp_path / "continuity.json", parent="p:2")
    answers[0] = (21, to_wire(worker(200).collect()))
    assert hello_2xx(fresh) == 1


def test_a_worker_silent_when_the_admin_worker_restarts_counts_with_what_was_saved(
        tmp_path: Path) -> None:
    """The restarted admin worker had no answer of its own from a worker that did not
    answer (stopped, or restarting): its counts were left out, and the sum fell."""
    metrics, answers = two_workers(tmp_path)
    metrics.requests.observe(event())
    answers[0] = (11, to_wire(worker(200, 200, 200).collect()))
    assert hello_2xx(metrics) == 4
    again, answers = two_workers(tmp_path)
    again.pid = metrics.pid + 1
    answers[0] = None  # silent, this first scrape of the new admin worker
    assert hello_2xx(again) == 4
    answers[0] = (11, to_wire(worker(200, 200, 200, 200).collect()))  # back, same life
    assert hello_2xx(again) == 5


def test_the_saved_state_names_each_family_once(tmp_path: Path) -> None:
    """Every sample's key repeated its family's help text: 158 MB for 10,000 series."""
    continuity = Continuity(tmp_path / "c.json", parent="p:1")
    many = worker()
    for i in range(200):
        many.observe(event(route=f"/r{i}"))
    continuity.follow("0", 1, list(many.collect()))
    continuity.save()
    text = (tmp_path / "c.json").read_text()
    assert text.count("Requests answered") == 1
    again = Continuity(tmp_path / "c.json", parent="p:1")
    assert scrape_of(again.stand_in("0")) == scrape_of(list(many.collect()), monotonic=True)


def scrape_of(families: list, monotonic: bool = False) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families
            if not monotonic or f.type != "gauge" for s in f.samples
            if not s.name.endswith("_created")}


def test_the_parent_is_known_by_its_pid_and_start_time_and_the_state_is_private(
        tmp_path: Path) -> None:
    """In a container the PoP's parent is pid 1 at every start: a new PoP took the
    previous one's saved counts for its own."""
    import os

    from runtime.observe.metrics_continuity import parent_id

    pid, started = parent_id().split(":")
    assert int(pid) == os.getppid() and started.isdigit()
    Continuity(tmp_path / "c.json", parent="p:1").save()
    assert (tmp_path / "c.json").stat().st_mode & 0o777 == 0o600


def test_every_series_of_every_earlier_life_is_carried() -> None:
    """A worker that restarted twice: both earlier lives' counts are carried, each
    series of a family (2xx and 5xx) on its own."""
    metrics, answers = two_workers()
    answers[0] = (11, to_wire(worker(200, 200, 500).collect()))
    hello_2xx(metrics)
    answers[0] = (12, to_wire(worker(200).collect()))
    hello_2xx(metrics)
    answers[0] = (13, to_wire(worker().collect()))
    source = metrics.endpoint(None).source
    assert source is not None
    found = scrape(asyncio.run(source()))
    assert [value(found, "edgefn_requests_total", function="hello", route="/hello",
                  status_class=c, method="GET") for c in ("2xx", "5xx")] == [3, 1]


def test_what_was_carried_survives_the_admin_worker_s_restart(tmp_path: Path) -> None:
    """As runtime.app builds it (its parent found by itself); a .tmp a crashed save
    left behind, longer than the state, is written over, not into."""
    path = tmp_path / "continuity.json"
    path.with_name(path.name + ".tmp").write_bytes(b"x" * 100_000)
    before = Continuity(path)
    before.follow("1", 11, list(worker(200, 200).collect()))
    before.follow("1", 12, [])  # worker 1 restarted
    before.save()
    after = Continuity(path)  # and then the admin worker
    after.follow("1", 12, [])
    assert sum(s.value for f in after.carried_families() for s in f.samples
               if s.name == "edgefn_requests_total") == 2


def test_a_continuity_that_cannot_be_read_or_written_is_named_in_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    garbled = tmp_path / "continuity.json"
    garbled.write_text("{not json")
    unwritable = tmp_path / "gone" / "continuity.json"
    with caplog.at_level(logging.WARNING, logger="edgefn.metrics"):
        Continuity(garbled, parent="p:1").follow("0", 1, [])
        Continuity(unwritable, parent="p:1").save()
    read, write = (r.getMessage() for r in own_records(caplog, "edgefn.metrics"))
    assert read.startswith(f"ignoring the metrics' continuity in {garbled}: JSON is malformed")
    assert write.startswith(f"cannot save the metrics' continuity to {unwritable}: [Errno 2]")
