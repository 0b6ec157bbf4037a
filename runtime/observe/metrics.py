"""Prometheus metrics from events: `RequestMetrics` is an `Observer` that counts
every `Event` into plain Python state, and a `prometheus_client` collector that
turns that state into metric families when Prometheus scrapes.

Why not `prometheus_client.Counter`/`Histogram` children: each ``inc``/``observe``
takes a lock and a few Python calls (µs per request on the hot path). Here one
event costs a dict lookup keyed by the raw (target, route, status, method) and a
few list increments; labels are resolved once per new key and formatting happens
at scrape time only. The PoP's loop thread is the only writer; the scrape (admin
thread) copies each dict and list whole (one C call under the GIL) before reading.

Every series carries ``pop``, ``tier`` and ``geo``. Label values are bounded:
function names (not versions), route patterns (not paths), status classes,
known methods; past `max_series` label sets per metric, new ones are counted
under ``_overflow``.

    metric (vLLM's name it maps to)                      labels
    edgefn_requests_total                                function route status_class method
    edgefn_request_duration_seconds (histogram)          function route status_class
    edgefn_response_bytes_total                          function route status_class
    edgefn_waf_blocks_total                              rule
    edgefn_waf_would_block_total (detect mode)           rule
    edgefn_ratelimit_rejects_total                       rule key
    edgefn_cache_requests_total                          cache (http|ai) outcome
    edgefn_auth_failures_total                           reason
    edgefn_bot_actions_total                             class action
    edgefn_ai_time_to_first_token_seconds (vllm:time_to_first_token_seconds)  model adapter
    edgefn_ai_inter_token_latency_seconds (vllm:inter_token_latency_seconds;
        one observation per request: its mean, 1 / tokens per second)         model adapter
    edgefn_ai_e2e_request_latency_seconds (vllm:e2e_request_latency_seconds)  model adapter
    edgefn_ai_prompt_tokens_total (vllm:prompt_tokens_total)                  model adapter
    edgefn_ai_generation_tokens_total (vllm:generation_tokens_total)          model adapter
    edgefn_ai_cached_tokens_total (vllm:prefix_cache_hits: tokens not recomputed;
        here: prompt tokens an AI cache hit did not send to the model)        model adapter
    edgefn_ai_request_success_total (vllm:request_success_total)  model adapter finished_reason

The model worker's own figures (running, waiting, batch size, busy fraction) are
`runtime.observe.metrics_worker`'s; isolates are `runtime.observe.metrics_isolates`'.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from runtime.observe.batch import EventBatch
from runtime.observe.event import Event

OVERFLOW = "_overflow"
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0, 30.0)
# vLLM's buckets, with a few smaller ones for small models on CPUs
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
               0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
               30.0, 60.0, 120.0)
METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"))
STATUS_CLASSES = ("0xx", "1xx", "2xx", "3xx", "4xx", "5xx")
BASE = ("pop", "tier", "geo")
REQUEST_LABELS = ("function", "route", "status_class", "method")
AI_LABELS = ("model", "adapter")


class Histogram:
    """Counts per bucket (not cumulative; the last one is +Inf) and the sum, in one
    list so that a scrape copies them together."""

    __slots__ = ("bounds", "les", "n")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.les = [floatToGoString(b) for b in (*self.bounds, float("inf"))]
        self.n = len(self.bounds) + 1  # index of the sum in a state list

    def new(self) -> list[float]:
        return [0] * self.n + [0.0]

    def observe(self, state: list[float], value: float) -> None:
        state[bisect_left(self.bounds, value)] += 1
        state[self.n] += value

    def sample(self, state: list[float]) -> tuple[list[tuple[str, float]], float, float]:
        """(cumulative buckets, count, sum) of a copied state."""
        buckets, total = [], 0.0
        for le, count in zip(self.les, state[:self.n], strict=True):
            total += count
            buckets.append((le, total))
        return buckets, total, state[self.n]


DURATION = Histogram(DURATION_BUCKETS)
TTFT, ITL, E2E = Histogram(TTFT_BUCKETS), Histogram(ITL_BUCKETS), Histogram(E2E_BUCKETS)
# a request series' state: duration buckets, duration sum, then bytes out
BYTES = DURATION.n + 1
# an AI series' state: TTFT, ITL, E2E histograms, then token counters
_T, _I, _E = 0, TTFT.n + 1, TTFT.n + 1 + ITL.n + 1
PROMPT = _E + E2E.n + 1
GENERATED, CACHED = PROMPT + 1, PROMPT + 2


class Counts:
    """Counts per label tuple, at most `limit` tuples (then ``_overflow``)."""

    __slots__ = ("by", "limit", "overflow")

    def __init__(self, width: int, limit: int) -> None:
        self.by: dict[tuple[str, ...], int] = {}
        self.limit = limit
        self.overflow = (OVERFLOW,) * width

    def add(self, labels: tuple[str, ...], n: int = 1) -> None:
        by = self.by
        if labels in by:
            by[labels] += n
        elif len(by) < self.limit:
            by[labels] = n
        else:
            by[self.overflow] = by.get(self.overflow, 0) + n


class RequestMetrics:
    """The `Observer` behind the request, stage and AI metrics of one PoP."""

    def __init__(self, pop: str, tier: str, geo: str, max_series: int = 10_000) -> None:
        self.base = (pop, tier, geo)
        self.max_series = max_series
        # (target, route, status, method) as the event has them -> state (a cache)
        self.raw: dict[tuple[Any, ...], list[float]] = {}
        # REQUEST_LABELS values -> state: what the scrape reads
        self.series: dict[tuple[str, ...], list[float]] = {}
        self.ai: dict[tuple[str, str], list[float]] = {}
        # model -> the base model it adapts (a LoRA adapter), as the OpenAI API's events
        # say: an AI-cache hit's event cannot, and its series had adapter=""
        self.bases: dict[str, str] = {}
        self.waf_blocks = Counts(1, max_series)
        self.waf_detects = Counts(1, max_series)
        self.rejects = Counts(2, max_series)
        self.cache = Counts(2, max_series)
        self.auth = Counts(1, max_series)
        self.bots = Counts(2, max_series)
        self.finished = Counts(3, max_series)
        self.decisions = {"waf": self._waf, "ratelimit": self._ratelimit,
                          "http_cache": self._cache, "ai_cache": self._cache,
                          "auth": self._auth, "bots": self._bots}

    # -- the hot path (the PoP's loop thread) -----------------------------------------------
    def observe(self, event: Event) -> None:
        key = (event.target, event.route, event.status, event.method)
        state = self.raw.get(key)
        if state is None:
            state = self._resolve(key)
        DURATION.observe(state, event.duration_ms / 1000)
        state[BYTES] += event.bytes_out
        if event.decisions:
            for stage, record in event.decisions.items():
                handle = self.decisions.get(stage)
                if handle is not None and isinstance(record, dict):
                    handle(stage, record, 1)
        if event.ai is not None and event.error != "model_not_found":
            # a model nobody serves made no call; its name is the client's, so as a
            # label it would let any client fill `max_series` and fold real models
            self._ai(event)

    def observe_batch(self, batch: EventBatch) -> None:
        """`batch`'s events, counted per group when it has them (what `observe` of
        each event counts: the same buckets, and the durations added to the sum one
        by one, in order)."""
        if batch.groups is None:
            for event in batch.events:
                self.observe(event)
            return
        at_sum = DURATION.n
        for g in batch.groups:
            key = (g.target, g.route, g.status, g.method)
            state = self.raw.get(key)
            if state is None:
                state = self._resolve(key)
            for bucket, n in g.buckets:
                state[bucket] += n
            total = state[at_sum]
            for seconds in g.durations:
                total += seconds
            state[at_sum] = total
            state[BYTES] += g.bytes_out
            for decisions, n in g.decided:
                if decisions:
                    self._decided(decisions, n)

    def _decided(self, decisions: dict[str, Any], n: int) -> None:
        for stage, record in decisions.items():
            handle = self.decisions.get(stage)
            if handle is not None and isinstance(record, dict):
                handle(stage, record, n)

    def _resolve(self, key: tuple[Any, ...]) -> list[float]:
        if len(self.raw) >= 4 * self.max_series:  # old versions' keys: only a cache
            self.raw.clear()
        labels = request_labels(*key)
        state = self.series.get(labels)
        if state is None:
            if len(self.series) >= self.max_series:
                labels = (OVERFLOW, OVERFLOW, labels[2], labels[3])
                state = self.series.get(labels)
            if state is None:
                state = self.series[labels] = [*DURATION.new(), 0]
        self.raw[key] = state
        return state

    # each: what `n` events with this stage's `record` count
    def _waf(self, stage: str, record: dict[str, Any], n: int) -> None:
        if record.get("blocked"):
            for rule in record.get("rules") or ():
                self.waf_blocks.add((str(rule),), n)
        elif record.get("would_block"):
            for rule in record.get("rules") or ():
                self.waf_detects.add((str(rule),), n)

    def _ratelimit(self, stage: str, record: dict[str, Any], n: int) -> None:
        name = record.get("limited")
        if name:
            self.rejects.add((str(name), limit_key(str(name))), n)

    def _cache(self, stage: str, record: dict[str, Any], n: int) -> None:
        outcome = record.get("outcome")
        if outcome:
            self.cache.add((stage.removesuffix("_cache"), str(outcome)), n)

    def _auth(self, stage: str, record: dict[str, Any], n: int) -> None:
        result = record.get("result")
        if result is not None and result != "ok" and result != "forwarded":
            self.auth.add((str(result),), n)

    def _bots(self, stage: str, record: dict[str, Any], n: int) -> None:
        self.bots.add((str(record.get("class")), str(record.get("action"))), n)

    def _ai(self, event: Event) -> None:
        ai = event.ai
        assert ai is not None
        if ai.adapter is not None:
            if len(self.bases) < self.max_series:
                self.bases[ai.model] = ai.adapter
            key = (ai.model, ai.adapter)
        else:
            key = (ai.model, self.bases.get(ai.model, ""))
        state = self.ai.get(key)
        if state is None:
            if len(self.ai) >= self.max_series:
                key = (OVERFLOW, OVERFLOW)
            state = self.ai.get(key)
            if state is None:
                state = self.ai[key] = TTFT.new() + ITL.new() + E2E.new() + [0, 0, 0]
        if ai.ttft_ms is not None:
            _observe_at(TTFT, state, _T, ai.ttft_ms / 1000)
        if ai.tokens_per_s:
            _observe_at(ITL, state, _I, 1 / ai.tokens_per_s)
        _observe_at(E2E, state, _E, event.duration_ms / 1000)
        state[PROMPT] += ai.prompt_tokens
        state[GENERATED] += ai.completion_tokens
        state[CACHED] += ai.cached_tokens
        if ai.finish_reason:
            self.finished.add((*key, ai.finish_reason))

    # -- the scrape (any thread) ------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        yield from self._requests()
        yield from self._stages()
        yield from self._ai_families()

    def _requests(self) -> Iterator[Metric]:
        series = [(labels, state.copy()) for labels, state in self.series.copy().items()]
        total = counter("edgefn_requests_total", "Requests answered.", REQUEST_LABELS)
        hist = HistogramMetricFamily("edgefn_request_duration_seconds",
                                     "Time from a request's arrival to its last byte.",
                                     labels=(*BASE, *REQUEST_LABELS[:3]))
        nbytes = counter("edgefn_response_bytes_total", "Response body bytes sent.",
                         REQUEST_LABELS[:3])
        merged: dict[tuple[str, ...], list[float]] = {}  # the histogram has no method label
        for labels, state in series:
            total.add_metric((*self.base, *labels), sum(state[:DURATION.n]))
            into = merged.get(labels[:3])
            if into is None:
                merged[labels[:3]] = state
            else:
                merged[labels[:3]] = [a + b for a, b in zip(into, state, strict=True)]
        for labels, state in merged.items():
            buckets, _, total_s = DURATION.sample(state)
            hist.add_metric([*self.base, *labels], buckets, total_s)
            nbytes.add_metric((*self.base, *labels), state[BYTES])
        return iter((total, hist, nbytes))

    def _stages(self) -> Iterator[Metric]:
        for name, doc, counts, labels in (
                ("edgefn_waf_blocks_total", "Requests the WAF blocked, per matched rule.",
                 self.waf_blocks, ("rule",)),
                ("edgefn_waf_would_block_total", "Requests the WAF would block in detect "
                 "mode, per matched rule.", self.waf_detects, ("rule",)),
                ("edgefn_ratelimit_rejects_total", "Requests refused by a rate limit (429).",
                 self.rejects, ("rule", "key")),
                ("edgefn_cache_requests_total", "Cache lookups per outcome.", self.cache,
                 ("cache", "outcome")),
                ("edgefn_auth_failures_total", "Requests auth refused (401/403).", self.auth,
                 ("reason",)),
                ("edgefn_bot_actions_total", "Clients per bot class and the action taken.",
                 self.bots, ("class", "action"))):
            family = counter(name, doc, labels)
            for values, n in counts.by.copy().items():
                family.add_metric((*self.base, *values), n)
            yield family

    def _ai_families(self) -> Iterator[Metric]:
        series = [(labels, state.copy()) for labels, state in self.ai.copy().items()]
        labels = (*BASE, *AI_LABELS)
        hists = [(HistogramMetricFamily(name, doc, labels=labels), h, at) for name, doc, h, at in (
            ("edgefn_ai_time_to_first_token_seconds", "Time to the first token "
             "(vllm:time_to_first_token_seconds).", TTFT, _T),
            ("edgefn_ai_inter_token_latency_seconds", "Mean time between output tokens of a "
             "request (vllm:inter_token_latency_seconds).", ITL, _I),
            ("edgefn_ai_e2e_request_latency_seconds", "Time from arrival to the last byte of "
             "a model call (vllm:e2e_request_latency_seconds).", E2E, _E))]
        counters = [(counter(name, doc, AI_LABELS), at) for name, doc, at in (
            ("edgefn_ai_prompt_tokens_total", "Prompt tokens (vllm:prompt_tokens_total).",
             PROMPT),
            ("edgefn_ai_generation_tokens_total", "Generated tokens "
             "(vllm:generation_tokens_total).", GENERATED),
            ("edgefn_ai_cached_tokens_total", "Prompt tokens served by an AI cache hit "
             "instead of the model.", CACHED))]
        for values, state in series:
            for family, h, at in hists:
                buckets, _, total = h.sample(state[at:at + h.n + 1])
                family.add_metric([*self.base, *values], buckets, total)
            for cfamily, at in counters:
                cfamily.add_metric((*self.base, *values), state[at])
        finished = counter("edgefn_ai_request_success_total", "Model calls that finished, per "
                           "finish reason (vllm:request_success_total).",
                           (*AI_LABELS, "finished_reason"))
        for values3, n in self.finished.by.copy().items():
            finished.add_metric((*self.base, *values3), n)
        yield from (f for f, _, _ in hists)
        yield from (f for f, _ in counters)
        yield finished


def _observe_at(h: Histogram, state: list[float], at: int, value: float) -> None:
    state[at + bisect_left(h.bounds, value)] += 1
    state[at + h.n] += value


def counter(name: str, doc: str, labels: Sequence[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=(*BASE, *labels))


def request_labels(target: str | None, route: str | None, status: int,
                   method: str) -> tuple[str, str, str, str]:
    """The bounded labels of a request: the function's name without its version
    ("" when nothing served it), the route pattern, the status class, the method
    (``OTHER`` for an unusual one)."""
    function = (target or "").partition("@")[0]
    status_class = STATUS_CLASSES[status // 100] if 0 <= status < 600 else "5xx"
    return function, route or "", status_class, method if method in METHODS else "OTHER"


def limit_key(name: str) -> str:
    """What a rate limit counts, from its name (`runtime.security.ratelimit.limiter`
    names them ``by-<by>`` (the PoP's ``[[ratelimit.rules]]``), ``fn-<by>``,
    ``key-rpm``, ``tenant-rpm``; ``-2`` when a name repeats)."""
    head, _, rest = name.partition("-")
    if head in ("by", "pop", "fn"):
        return rest.partition("-")[0] or "other"
    return head if rest.startswith("rpm") else "other"
