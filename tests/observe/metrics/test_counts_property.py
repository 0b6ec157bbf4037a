"""Property: whatever events come, every one is counted exactly once (requests,
histogram counts, bytes) against a plain-dict model, and no metric holds more
label sets than `max_series` plus the bounded overflow sets."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from runtime.observe.metrics import OVERFLOW, RequestMetrics, request_labels
from tests.observe.metrics.support import event, scrape, series

MAX = 10
events = st.lists(st.builds(
    event,
    target=st.none() | st.sampled_from(["openai"]) | st.from_regex(r"f[0-9]{1,2}@v[0-9]",
                                                                  fullmatch=True),
    route=st.none() | st.from_regex(r"/r[0-9]{1,2}", fullmatch=True),
    status=st.integers(0, 999),
    method=st.sampled_from(["GET", "POST", "HEAD", "PROPFIND", "get"]),
    duration_ms=st.floats(0, 120_000, allow_nan=False),
    bytes_out=st.integers(0, 1 << 20)), max_size=80)


@settings(max_examples=40, deadline=None)
@given(events)
def test_every_event_is_counted_once(batch):
    observer = RequestMetrics("edge-test", "edge", "fra", max_series=MAX)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(observer)
    model: Counter[tuple[str, str]] = Counter()  # (status class, method) -> requests
    for e in batch:
        observer.observe(e)
        _, _, status_class, method = request_labels(e.target, e.route, e.status, e.method)
        model[status_class, method] += 1
    found = scrape(registry)
    total = series(found, "edgefn_requests_total")
    counted: Counter[tuple[str, str]] = Counter()
    for labels, n in total.items():
        d = dict(labels)
        counted[d["status_class"], d["method"]] += int(n)
    assert counted == +model
    assert sum(series(found, "edgefn_request_duration_seconds_count").values()) == len(batch)
    assert sum(series(found, "edgefn_response_bytes_total").values()) == sum(
        e.bytes_out for e in batch)
    named = [labels for labels in total if dict(labels)["function"] != OVERFLOW]
    assert len(named) <= MAX
