"""Worker metrics for the PoP's metrics layer: queue depth, running batch size,
time to first token, inter-token latency, tokens/s and busy fraction; and the
model calls each client made (``calls_by_client``: whose fair shares the worker
keeps; "" is the anonymous one).

Latencies keep the last `SAMPLES` observations; rates are computed over the
time since the previous `snapshot()` (or since start)."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

SAMPLES = 2048
MAX_CLIENTS = 256  # clients `calls_by_client` counts: the latest seen first


def _percentiles(values: deque[float]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    s = sorted(values)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]  # noqa: E731
    return {"count": len(s), "p50_ms": round(pick(0.5) * 1000, 3),
            "p99_ms": round(pick(0.99) * 1000, 3), "max_ms": round(s[-1] * 1000, 3)}


class Metrics:
    """Thread-safe counters; engines write from their compute threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queue_depth = 0
        self.running = 0
        self.running_peak = 0
        self.ttft: deque[float] = deque(maxlen=SAMPLES)
        self.itl: deque[float] = deque(maxlen=SAMPLES)
        self.tokens_total = 0
        self.decode_calls_total = 0
        self.prompt_tokens_total = 0
        self.requests_total = 0
        self.errors_total = 0
        self.preemptions_total = 0
        self.clients: dict[str, int] = {}  # client -> model calls it made
        self.recomputes_total = 0
        self.busy_seconds = 0.0
        self.started = self._mark = time.monotonic()
        self._mark_tokens = 0
        self._mark_busy = 0.0

    def step(self, queue_depth: int, running: int, seconds: float, tokens: int) -> None:
        """One decode call, made while `running` sequences held slots, that took
        `seconds` and sampled `tokens`."""
        with self.lock:
            self.queue_depth, self.running = queue_depth, running
            self.running_peak = max(self.running_peak, running)
            self.busy_seconds += seconds
            self.tokens_total += tokens
            self.decode_calls_total += 1

    def idle(self, queue_depth: int, running: int = 0) -> None:
        """No step to run; `running` sequences (paused for credit) hold slots."""
        with self.lock:
            self.queue_depth, self.running = queue_depth, running

    def first_token(self, seconds: float) -> None:
        with self.lock:
            self.ttft.append(seconds)

    def inter_token(self, seconds: float) -> None:
        with self.lock:
            self.itl.append(seconds)

    def request(self, prompt_tokens: int = 0, error: bool = False) -> None:
        with self.lock:
            self.requests_total += 1
            self.prompt_tokens_total += prompt_tokens
            self.errors_total += error

    def asked(self, client: str | None) -> None:
        """A model call of `client` (None: the anonymous one) arrived."""
        key = client or ""
        with self.lock:
            if key not in self.clients and len(self.clients) >= MAX_CLIENTS:
                del self.clients[next(iter(self.clients))]
            self.clients[key] = self.clients.get(key, 0) + 1

    def failed(self) -> None:
        """A request already counted (`request`) ended in an error."""
        with self.lock:
            self.errors_total += 1

    def preempted(self) -> None:
        """A running sequence gave up its slot (its KV cells kept while they fit)."""
        with self.lock:
            self.preemptions_total += 1

    def recomputed(self, n: int) -> None:
        """`n` preempted sequences lost their KV cells: each feeds its prompt and
        output again when readmitted."""
        with self.lock:
            self.recomputes_total += n

    def snapshot(self) -> dict[str, Any]:
        """Current figures; tokens/s and busy fraction cover the time since the
        previous snapshot."""
        with self.lock:
            now = time.monotonic()
            span = max(now - self._mark, 1e-9)
            rate = (self.tokens_total - self._mark_tokens) / span
            busy = min(1.0, (self.busy_seconds - self._mark_busy) / span)
            peak, self.running_peak = self.running_peak, self.running
            self._mark, self._mark_tokens, self._mark_busy = now, self.tokens_total, \
                self.busy_seconds
            return {
                "queue_depth": self.queue_depth, "running_batch": self.running,
                "running_batch_peak": peak,
                "ttft": _percentiles(self.ttft), "inter_token": _percentiles(self.itl),
                "tokens_per_second": round(rate, 2), "busy_fraction": round(busy, 4),
                "tokens_total": self.tokens_total,
                "decode_calls_total": self.decode_calls_total,
                "prompt_tokens_total": self.prompt_tokens_total,
                "requests_total": self.requests_total, "errors_total": self.errors_total,
                "preemptions_total": self.preemptions_total,
                "calls_by_client": dict(self.clients),
                "recomputes_total": self.recomputes_total,
                "uptime_s": round(now - self.started, 1),
            }
