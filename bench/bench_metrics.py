"""The metrics' cost: microseconds per observed event, in process, next to the
same counting done with prometheus_client's own Counter/Histogram children (the
obvious design), and, once the events stage exists, WASM hello req/s with
metrics on vs off in the same run.

    python bench/bench_metrics.py [--events 200000] [--seconds 5] [--rounds 3]

In process (one thread): a mix of events as the default pipeline produces them
(a hello with the bots/ratelimit decisions; a 404; a 429; an OpenAI chat call),
observed by `RequestMetrics`; the official-client baseline does the same
label lookups and inc/observe calls per event. Then one scrape of what was
counted (generate_latest) with 1000 label sets.

Over HTTP (needs the events stage and wrk): `edgefn serve --no-ai` with
hello-wat, ``[metrics] enabled = true`` vs ``false``, alternated round by round
(wrk -t1 -c32), best round of each kept; the ratio is on / off.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest  # noqa: E402

from runtime.observe.event import AIUsage, Event  # noqa: E402
from runtime.observe.metrics import (  # noqa: E402
    DURATION_BUCKETS,
    RequestMetrics,
    request_labels,
)


def mix() -> list[Event]:
    base: dict[str, Any] = {"ts": 0.0, "rid": "r", "pop": "p", "tier": "edge", "geo": "fra",
            "client": "127.0.0.1", "method": "GET", "host": "h", "path": "/hello",
            "bytes_out": 26}
    passed = {"bots": {"class": "browser", "action": "allow"}, "ratelimit": {"limited": None}}
    return [
        *(Event(**base, status=200, target="hello@1a2b", route="/hello",
                duration_ms=0.2 + i / 100, decisions=passed) for i in range(7)),
        Event(**base, status=404, duration_ms=0.1, decisions=passed),
        Event(**base, status=429, target="hello@1a2b", route="/hello", duration_ms=0.1,
              decisions={**passed, "ratelimit": {"limited": "pop-ip"}}),
        Event(**base, status=200, target="openai", route="/v1/chat/completions",
              duration_ms=300.0, ai=AIUsage(operation="chat", model="smollm2",
                                             prompt_tokens=20, completion_tokens=30,
                                             ttft_ms=16.0, tokens_per_s=60.0,
                                             finish_reason="stop")),
    ]


class OfficialClient:
    """The same request counting with prometheus_client's metric children."""

    def __init__(self) -> None:
        r = CollectorRegistry()
        names = ("pop", "tier", "geo", "function", "route", "status_class")
        self.total = Counter("edgefn_requests", "", [*names, "method"], registry=r)
        self.hist = Histogram("edgefn_request_duration_seconds", "", names,
                              buckets=DURATION_BUCKETS, registry=r)
        self.bytes = Counter("edgefn_response_bytes", "", names, registry=r)
        self.children: dict[tuple, tuple] = {}

    def observe(self, e: Event) -> None:
        key = (e.target, e.route, e.status, e.method)
        c = self.children.get(key)
        if c is None:
            fn, route, sc, method = request_labels(*key)
            labels = ("p", "edge", "fra", fn, route, sc)
            c = self.children[key] = (self.total.labels(*labels, method),
                                      self.hist.labels(*labels), self.bytes.labels(*labels))
        c[0].inc()
        c[1].observe(e.duration_ms / 1000)
        c[2].inc(e.bytes_out)


def per_event_us(observe: Callable[[Event], object], events: list[Event], n: int) -> float:
    rounds = max(1, n // len(events))
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        for _ in range(rounds):
            for e in events:
                observe(e)
        best = min(best, time.perf_counter() - began)
    return best / (rounds * len(events)) * 1e6


def in_process(n: int) -> None:
    events = mix()
    ours = RequestMetrics("p", "edge", "fra")
    official = OfficialClient()
    empty = per_event_us(lambda e: None, events, n)
    mine = per_event_us(ours.observe, events, n) - empty
    theirs = per_event_us(official.observe, events, n) - empty
    print(f"\n== per observed event, {n} events, best of 3 (loop overhead "
          f"{empty:.3f} µs subtracted) ==")
    print(f"{'observer':<44}{'µs/event':>10}{'x official':>12}")
    print(f"{'prometheus_client children (requests only)':<44}{theirs:>10.3f}{1:>12.2f}")
    print(f"{'RequestMetrics (requests, stages, AI)':<44}{mine:>10.3f}{mine / theirs:>12.2f}")
    many = RequestMetrics("p", "edge", "fra")
    for i in range(1000):
        many.observe(Event(ts=0, rid="r", pop="p", tier="edge", client="c", method="GET",
                           host="h", path="/", status=200, target=f"f{i}@1", route=f"/f{i}"))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(many)
    began = time.perf_counter()
    size = len(generate_latest(registry))
    print(f"one scrape of 1000 label sets: {(time.perf_counter() - began) * 1000:.1f} ms, "
          f"{size // 1024} KiB")


def over_http(seconds: int, rounds: int) -> None:
    if importlib.util.find_spec("runtime.pipeline.stages.events") is None:
        print("\nhello req/s with metrics on vs off: skipped, the events stage is not in this "
              "tree yet (without it no event reaches the metrics, so on and off are the same)")
        return
    if shutil.which("wrk") is None:
        print("\nhello req/s: skipped, wrk is missing (apt-get install -y wrk)")
        return
    import _wrk
    from bench_runtime import HELLO, start_edgefn

    work = Path(tempfile.mkdtemp(prefix="edgefn-bench-metrics-"))
    atexit.register(shutil.rmtree, work, True)  # its PoPs' data dirs, at exit
    off = work / "off.toml"
    off.write_text("[metrics]\nenabled = false\n")
    servers = {"metrics off": start_edgefn(work / "off", ["--no-ai", "--config", str(off)],
                                           ROOT, HELLO),
               "metrics on": start_edgefn(work / "on", ["--no-ai"], ROOT, HELLO)}
    best: dict[str, dict[str, float]] = {}
    try:
        for _, port in servers.values():
            _wrk.run(f"http://127.0.0.1:{port}/hello", seconds=1)
        for _ in range(rounds):
            for name, (_, port) in servers.items():
                r = _wrk.run(f"http://127.0.0.1:{port}/hello", seconds=seconds)
                if r["errors"]:
                    raise RuntimeError(f"{name}: {r['errors']} errors under load")
                if name not in best or r["rps"] > best[name]["rps"]:
                    best[name] = r
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(20)
    base = best["metrics off"]["rps"]
    print(f"\n== WASM hello, wrk -t1 -c32 -d{seconds}s, best of {rounds} rounds ==")
    print(f"{'server':<16}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'x off':>8}")
    for name, r in best.items():
        print(f"{name:<16}{r['rps']:>10.0f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}"
              f"{r['rps'] / base:>8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    in_process(args.events)
    over_http(args.seconds, args.rounds)


if __name__ == "__main__":
    main()
