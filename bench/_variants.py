"""Variants of a benchmark measured in alternating rounds (the order reverses every
round, so that none always runs first on a machine that warms or tires), and the
medians of each variant's figures with their ratios to the first variant's; and the
ratios paired within each round (`paired`), which a slow spell that takes both
variants of a round down cancels out of."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Sequence


def alternate[V: Hashable](variants: Sequence[V], rounds: int,
                           run: Callable[[V], dict[str, float]],
                           report: Callable[[int, V, dict[str, float]], None],
                           pause: float = 2.0) -> dict[V, list[dict[str, float]]]:
    """`run(variant)` for every variant in each of `rounds` rounds; `report(round,
    variant, figures)` after each; `pause` seconds after each (the last run's
    processes gone). Raises what `run` raises."""
    results: dict[V, list[dict[str, float]]] = {v: [] for v in variants}
    for n in range(rounds):
        for variant in variants if n % 2 == 0 else variants[::-1]:
            figures = run(variant)
            results[variant].append(figures)
            report(n + 1, variant, figures)
            time.sleep(pause)
    return results


def ratio(a: float, b: float) -> float:
    """a / b; NaN where b is 0 (a figure a variant does not have: a WASM function's
    isolate hosts)."""
    return a / b if b else float("nan")


def medians[V: Hashable](results: dict[V, list[dict[str, float]]], keys: Sequence[str]
                         ) -> list[tuple[V, dict[str, float], dict[str, float]]]:
    """Each variant (in order), the medians of its `keys`, and their ratios to the
    first variant's."""
    rows, first = [], None
    for variant, runs in results.items():
        m = {k: statistics.median(r[k] for r in runs) for k in keys}
        first = first or m
        rows.append((variant, m, {k: ratio(m[k], first[k]) for k in keys}))
    return rows


def paired[V: Hashable](results: dict[V, list[dict[str, float]]], keys: Sequence[str]
                        ) -> list[tuple[V, dict[str, tuple[float, float, float]]]]:
    """Each variant after the first (in order), and for each of `keys` the median,
    lowest and highest of its ratio to the first variant's figure of the same round.
    Raises ValueError when a variant has not as many rounds as the first."""
    variants = list(results)
    first = results[variants[0]]
    rows = []
    for variant in variants[1:]:
        runs = results[variant]
        if len(runs) != len(first):
            raise ValueError(f"{variant!r} has {len(runs)} rounds, the first {len(first)}")
        spans = {}
        for k in keys:
            ratios = [ratio(r[k], f[k]) for r, f in zip(runs, first, strict=True)]
            spans[k] = (statistics.median(ratios), min(ratios), max(ratios))
        rows.append((variant, spans))
    return rows


def print_paired[V: Hashable](results: dict[V, list[dict[str, float]]],
                              figures: dict[str, str], label: Callable[[V], str]) -> None:
    """`paired`'s rows, a line a later variant (`label` names it): each of `figures`
    (printed name: key) as median (lowest-highest); nothing for one variant."""
    rows = paired(results, tuple(figures.values()))
    if rows:
        print("x the first within each round (the first's figure of the same round), "
              "median (range):")
    for variant, spans in rows:
        print(f"  {label(variant)}: " + ", ".join(
            "{} {:.2f} ({:.2f}-{:.2f})".format(name, *spans[key])
            for name, key in figures.items()))
