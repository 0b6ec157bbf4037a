"""`RequestMetrics`: events in, series out (parsed with prometheus_client's parser)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from runtime.observe.event import AIUsage
from runtime.observe.metrics import OVERFLOW, RequestMetrics, limit_key
from tests.observe.metrics.support import event, scrape, series, value


@pytest.fixture
def metrics() -> tuple[RequestMetrics, CollectorRegistry]:
    observer = RequestMetrics("edge-test", "edge", "fra", max_series=10)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(observer)
    return observer, registry


def test_requests_by_function_route_status_class_and_method(metrics):
    observer, registry = metrics
    for status, target in ((200, "hello@1a2b"), (204, "hello@9f9f"), (404, None),
                           (503, "hello@1a2b")):
        observer.observe(event(status=status, target=target,
                               route=None if target is None else "/hello"))
    observer.observe(event(method="POST"))
    found = scrape(registry)
    total = "edgefn_requests_total"
    # two versions of `hello` are one function; the method is its own label
    assert value(found, total, function="hello", route="/hello", status_class="2xx",
                 method="GET") == 2
    assert value(found, total, function="hello", route="/hello", status_class="2xx",
                 method="POST") == 1
    assert value(found, total, function="", route="", status_class="4xx", method="GET") == 1
    assert value(found, total, function="hello", route="/hello", status_class="5xx",
                 method="GET") == 1
    assert sum(series(found, total).values()) == 5


def test_duration_histogram_buckets_sum_and_count(metrics):
    observer, registry = metrics
    for ms in (0.3, 3.0, 40.0, 40_000.0):
        observer.observe(event(duration_ms=ms))
    found = scrape(registry)
    labels = {"function": "hello", "route": "/hello", "status_class": "2xx"}
    bucket = "edgefn_request_duration_seconds_bucket"
    assert value(found, bucket, le="0.0005", **labels) == 1
    assert value(found, bucket, le="0.0025", **labels) == 1
    assert value(found, bucket, le="0.005", **labels) == 2
    assert value(found, bucket, le="0.05", **labels) == 3
    assert value(found, bucket, le="30.0", **labels) == 3  # 40 s is past the last bound
    assert value(found, bucket, le="+Inf", **labels) == 4
    assert value(found, "edgefn_request_duration_seconds_count", **labels) == 4
    assert value(found, "edgefn_request_duration_seconds_sum", **labels) == pytest.approx(
        40.0433)


def test_response_bytes(metrics):
    observer, registry = metrics
    observer.observe(event(bytes_out=100))
    observer.observe(event(bytes_out=23, method="POST"))
    found = scrape(registry)
    assert value(found, "edgefn_response_bytes_total", function="hello", route="/hello",
                 status_class="2xx") == 123


def test_stage_outcomes_from_decisions(metrics):
    observer, registry = metrics
    observer.observe(event(status=403, decisions={
        "waf": {"mode": "block", "rules": [942100, 949110], "blocked": True},
        "bots": {"class": "browser", "action": "allow"}}))
    observer.observe(event(decisions={
        "waf": {"mode": "detect", "rules": [942100], "blocked": False, "would_block": True},
        "auth": {"mode": "key", "result": "ok"}, "ratelimit": {"limited": None},
        "http_cache": {"outcome": "HIT"}}))
    observer.observe(event(status=401, decisions={"auth": {"mode": "key",
                                                           "result": "unauthorized"}}))
    observer.observe(event(status=429, decisions={"ratelimit": {"limited": "fn-key-2"}}))
    observer.observe(event(target="openai", route=None, decisions={
        "ai_cache": {"outcome": "hit-semantic", "similarity": 0.97}}))
    found = scrape(registry)
    assert value(found, "edgefn_waf_blocks_total", rule="942100") == 1
    assert value(found, "edgefn_waf_blocks_total", rule="949110") == 1
    assert value(found, "edgefn_waf_would_block_total", rule="942100") == 1
    assert value(found, "edgefn_bot_actions_total", **{"class": "browser",
                                                        "action": "allow"}) == 1
    assert series(found, "edgefn_auth_failures_total") == {
        frozenset({"pop": "edge-test", "tier": "edge", "geo": "fra",
                   "reason": "unauthorized"}.items()): 1}
    assert series(found, "edgefn_ratelimit_rejects_total") == {
        frozenset({"pop": "edge-test", "tier": "edge", "geo": "fra", "rule": "fn-key-2",
                   "key": "key"}.items()): 1}
    assert value(found, "edgefn_cache_requests_total", cache="http", outcome="HIT") == 1
    assert value(found, "edgefn_cache_requests_total", cache="ai",
                 outcome="hit-semantic") == 1


@pytest.mark.parametrize(("name", "key"), [("by-ip", "ip"), ("by-tenant-2", "tenant"),
                                           ("pop-ip", "ip"), ("pop-ip-2", "ip"),
                                           ("fn-function", "function"), ("key-rpm", "key"),
                                           ("tenant-rpm", "tenant"), ("weird", "other")])
def test_limit_key_from_the_limiters_names(name, key):
    assert limit_key(name) == key


def test_ai_calls_per_model_and_adapter(metrics):
    observer, registry = metrics
    observer.observe(event(target="openai", duration_ms=800.0, ai=AIUsage(
        operation="chat", model="smollm2", prompt_tokens=30, completion_tokens=40,
        ttft_ms=16.0, tokens_per_s=50.0, finish_reason="stop", stream=True)))
    observer.observe(event(target="openai", duration_ms=2.0, ai=AIUsage(
        operation="chat", model="pirate", adapter="smollm2", prompt_tokens=5,
        cached_tokens=5, finish_reason="length")))
    found = scrape(registry)
    base = {"model": "smollm2", "adapter": ""}
    lora = {"model": "pirate", "adapter": "smollm2"}
    assert value(found, "edgefn_ai_prompt_tokens_total", **base) == 30
    assert value(found, "edgefn_ai_generation_tokens_total", **base) == 40
    assert value(found, "edgefn_ai_cached_tokens_total", **lora) == 5
    ttft = "edgefn_ai_time_to_first_token_seconds"
    assert value(found, f"{ttft}_bucket", le="0.01", **base) == 0
    assert value(found, f"{ttft}_bucket", le="0.02", **base) == 1
    assert value(found, f"{ttft}_count", **lora) == 0  # a cache hit has no first token
    itl = "edgefn_ai_inter_token_latency_seconds"  # 50 tokens/s: 20 ms apart
    assert value(found, f"{itl}_bucket", le="0.01", **base) == 0
    assert value(found, f"{itl}_bucket", le="0.025", **base) == 1
    assert value(found, "edgefn_ai_e2e_request_latency_seconds_sum", **base) == 0.8
    assert value(found, "edgefn_ai_request_success_total", finished_reason="length",
                 **lora) == 1


def test_an_ai_cache_hit_of_an_adapter_counts_in_its_series(metrics):
    """A hit's event knows the model it asked for, not that it is an adapter: its
    samples went to a series of their own, adapter=""."""
    observer, registry = metrics
    observer.observe(event(target="openai", ai=AIUsage(
        operation="chat", model="pirate", adapter="smollm2", prompt_tokens=5,
        completion_tokens=3, finish_reason="stop")))
    observer.observe(event(target="openai", ai=AIUsage(  # the AI cache's hit
        operation="chat", model="pirate", prompt_tokens=5, cached_tokens=5)))
    found = scrape(registry)
    assert value(found, "edgefn_ai_prompt_tokens_total", model="pirate", adapter="smollm2") == 10
    assert value(found, "edgefn_ai_cached_tokens_total", model="pirate", adapter="smollm2") == 5
    assert value(found, "edgefn_ai_prompt_tokens_total", model="pirate", adapter="") is None


def test_label_values_are_bounded(metrics):
    observer, registry = metrics  # max_series=10
    for i in range(50):
        observer.observe(event(target=f"fn{i}@v1", route=f"/fn{i}", path=f"/fn{i}/x?{i}"))
    observer.observe(event(method="PROPFIND", status=999))
    found = scrape(registry)
    total = series(found, "edgefn_requests_total")
    # 10 label sets, then overflow sets that keep the (bounded) status class and method
    assert len(total) == 12
    assert sum(total.values()) == 51  # nothing is lost
    overflow = {"pop": "edge-test", "tier": "edge", "geo": "fra", "function": OVERFLOW,
                "route": OVERFLOW, "status_class": "2xx", "method": "GET"}
    assert total[frozenset(overflow.items())] == 40
    odd = {**overflow, "status_class": "5xx", "method": "OTHER"}
    assert total[frozenset(odd.items())] == 1
    assert not any(dict(labels).get("function") == "fn49" for labels in total)
    # no label carries a path or a query
    assert not any("?" in v or v.endswith("/x") for labels in total for _, v in labels)


def test_unusual_method_and_status_fold_into_bounded_values():
    observer = RequestMetrics("p", "edge", "", max_series=100)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(observer)
    observer.observe(event(method="PROPFIND", status=999))
    found = scrape(registry)
    assert {dict(labels)["method"] for labels in series(found, "edgefn_requests_total")} == {
        "OTHER"}
    assert {dict(labels)["status_class"]
            for labels in series(found, "edgefn_requests_total")} == {"5xx"}


def test_two_pops_in_one_process_keep_their_own_series():
    a, b = RequestMetrics("a", "edge", "fra"), RequestMetrics("b", "regional", "iad")
    ra, rb = CollectorRegistry(auto_describe=False), CollectorRegistry(auto_describe=False)
    ra.register(a)
    rb.register(b)
    a.observe(event())
    a.observe(event())
    b.observe(event())
    pops = {dict(labels)["pop"]: v for labels, v in series(scrape(ra),
                                                           "edgefn_requests_total").items()}
    assert pops == {"a": 2}
    labels, = series(scrape(rb), "edgefn_requests_total")
    assert dict(labels)["geo"] == "iad" and dict(labels)["tier"] == "regional"


def test_unknown_models_make_no_ai_series(metrics):
    """A client's made-up model names (404 model_not_found) never become labels, so
    they cannot push the served models into the overflow series."""
    observer, registry = metrics  # max_series=10
    for i in range(30):
        observer.observe(event(target="openai", status=404, error="model_not_found",
                               ai=AIUsage(operation="chat", model=f"made-up-{i}",
                                          finish_reason="error")))
    observer.observe(event(target="openai", duration_ms=5.0, ai=AIUsage(
        operation="chat", model="smollm2", prompt_tokens=3, completion_tokens=4,
        finish_reason="stop")))
    found = scrape(registry)
    models = {dict(labels)["model"] for labels in
              series(found, "edgefn_ai_prompt_tokens_total")}
    assert models == {"smollm2"}
    assert value(found, "edgefn_ai_generation_tokens_total", model="smollm2", adapter="") == 4


def test_a_models_calls_add_up_in_its_series(metrics):
    """Two calls of one model: its token counters, histogram counts and sums are
    both calls' (a first token at 20.02 ms is past the 0.02 s bucket)."""
    observer, registry = metrics
    for _ in range(2):
        observer.observe(event(target="openai", duration_ms=500.0, ai=AIUsage(
            operation="chat", model="smollm2", prompt_tokens=3, completion_tokens=4,
            cached_tokens=2, ttft_ms=20.02)))
    found = scrape(registry)
    base = {"model": "smollm2", "adapter": ""}
    assert value(found, "edgefn_ai_prompt_tokens_total", **base) == 6
    assert value(found, "edgefn_ai_generation_tokens_total", **base) == 8
    assert value(found, "edgefn_ai_cached_tokens_total", **base) == 4
    ttft = "edgefn_ai_time_to_first_token_seconds"
    assert value(found, f"{ttft}_bucket", le="0.02", **base) == 0
    assert value(found, f"{ttft}_count", **base) == 2
    assert value(found, f"{ttft}_sum", **base) == pytest.approx(0.04004)
    assert value(found, "edgefn_ai_e2e_request_latency_seconds_count", **base) == 2
    assert value(found, "edgefn_ai_e2e_request_latency_seconds_sum", **base) == 1.0


def test_a_histogram_counts_per_bucket_and_samples_them_cumulative():
    """Each value counts in the first bucket whose bound it does not pass (a value on
    a bound is in it), the last is +Inf; the sample is cumulative with the sum."""
    from runtime.observe.metrics import Histogram

    h = Histogram([0.1, 1.0])
    state = h.new()
    for v in (0.05, 0.1, 0.5, 3.0):
        h.observe(state, v)
    buckets, count, total = h.sample(state)
    assert buckets == [("0.1", 2), ("1.0", 3), ("+Inf", 4)] and count == 4
    assert total == pytest.approx(3.65)


def test_past_max_series_new_models_share_one_series_and_known_ones_keep_theirs(metrics):
    """max_series is 10: the 11th and 12th models count in one overflow series (both
    calls), while a model with a series keeps counting in it."""
    observer, registry = metrics
    for i in range(12):
        observer.observe(event(target="openai", ai=AIUsage(
            operation="chat", model=f"m{i}", adapter="base" if i == 10 else None,
            prompt_tokens=1)))
    observer.observe(event(target="openai", ai=AIUsage(operation="chat", model="m0",
                                                        prompt_tokens=1)))
    found = scrape(registry)
    tokens = series(found, "edgefn_ai_prompt_tokens_total")
    assert len(tokens) == 11
    assert value(found, "edgefn_ai_prompt_tokens_total", model="m0", adapter="") == 2
    assert value(found, "edgefn_ai_prompt_tokens_total", model=OVERFLOW,
                 adapter=OVERFLOW) == 2
