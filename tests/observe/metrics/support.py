"""Helpers for the metrics tests: events as the events stage builds them, and a
scrape parsed with prometheus_client's own parser."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from runtime.observe.event import Event

BASE = {"pop": "edge-test", "tier": "edge", "geo": "fra"}


def event(**fields: Any) -> Event:
    defaults: dict[str, Any] = {"ts": 1_700_000_000.0, "rid": "r-1", "pop": "edge-test",
                                "tier": "edge", "geo": "fra", "client": "127.0.0.1",
                                "method": "GET", "host": "localhost", "path": "/hello",
                                "status": 200, "target": "hello@1a2b3c4d",
                                "route": "/hello", "duration_ms": 1.0, "bytes_out": 10}
    return Event(**{**defaults, **fields})


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """{(sample name, labels): value} of an exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def scrape(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return samples(generate_latest(registry).decode())


def value(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float | None:
    return found.get((name, frozenset({**BASE, **labels}.items())))


def series(found: dict[tuple[str, frozenset[tuple[str, str]]], float],
           name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in found.items() if n == name}
