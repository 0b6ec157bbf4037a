"""The semantic cache's decision rule on the held-out split of
bench/data/semantic_eval.jsonl, with real MiniLM embeddings (the worker's ONNX
engine): at `DEFAULT_THRESHOLD`, wrong answers on at most 1 % of the traps while
serving at least 30 % of the should-hit paraphrases. A guard regression fails here.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gpu_worker.config import ModelSpec
from gpu_worker.engines.onnx import OnnxEngine, libstdcxx_clash
from runtime.cache.ai.guards import DEFAULT_THRESHOLD, normalize, veto

DATA = Path(__file__).resolve().parents[3] / "bench" / "data" / "semantic_eval.jsonl"
MODEL = "all-minilm-l6-v2"
KINDS = {"paraphrase", "negation", "number", "date", "unit", "entity", "comparative",
         "constraint", "scope", "word-order"}


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    return [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def engine() -> Iterator[OnnxEngine]:
    if libstdcxx_clash():
        pytest.skip("onnxruntime would segfault here: usearch was imported first")
    eng = OnnxEngine(ModelSpec(MODEL, "onnx"))
    asyncio.run(eng.start())
    yield eng
    eng.close()


def similarities(engine: OnnxEngine, rows: list[dict[str, str]]) -> np.ndarray:
    """Cosine similarity of each pair's normalized prompts (one batched call)."""
    texts = sorted({normalize(r[k]) for r in rows for k in ("a", "b")})
    vecs, _ = asyncio.run(engine.embed(MODEL, texts))
    index = {t: np.asarray(v) for t, v in zip(texts, vecs, strict=True)}
    return np.array([index[normalize(r["a"])] @ index[normalize(r["b"])] for r in rows])


def test_the_set_is_labelled_split_and_balanced(rows: list[dict[str, str]]) -> None:
    assert len(rows) >= 400
    assert {r["kind"] for r in rows} == KINDS
    assert all((r["label"] == "hit") == (r["kind"] == "paraphrase") for r in rows)
    per_kind = Counter((r["kind"], r["split"]) for r in rows)
    for kind in KINDS - {"paraphrase"}:
        assert per_kind[kind, "train"] >= 10 and per_kind[kind, "test"] >= 10, kind
    labels = Counter(r["label"] for r in rows)
    assert 0.4 <= labels["hit"] / len(rows) <= 0.6
    split_of: dict[str, set[str]] = {}
    for r in rows:
        split_of.setdefault(r["group"], set()).add(r["split"])
    assert all(len(s) == 1 for s in split_of.values()), "an intent in both splits"


@pytest.mark.slow
def test_held_out_targets_at_the_default_threshold(engine: OnnxEngine,
                                                   rows: list[dict[str, str]]) -> None:
    test = [r for r in rows if r["split"] == "test"]
    sims = similarities(engine, test)
    served = [bool(s >= DEFAULT_THRESHOLD) and veto(r["a"], r["b"]) is None
              for r, s in zip(test, sims, strict=True)]
    hits = [s for s, r in zip(served, test, strict=True) if r["label"] == "hit"]
    traps = [(r["kind"], r["a"], r["b"]) for s, r in zip(served, test, strict=True)
             if r["label"] == "trap" and s]
    n_traps = sum(r["label"] == "trap" for r in test)
    assert len(traps) <= 0.01 * n_traps, f"traps served: {traps}"
    assert sum(hits) >= 0.30 * len(hits), f"served {sum(hits)} of {len(hits)} paraphrases"


@pytest.mark.slow
def test_default_threshold_is_what_the_train_split_picks(engine: OnnxEngine,
                                                         rows: list[dict[str, str]]) -> None:
    """The highest threshold (0.60..0.98 by 0.02) at which similarity + guards serve
    no train trap and at least 60 % of train paraphrases (bench_semantic_eval.py)."""
    train = [r for r in rows if r["split"] == "train"]
    sims = similarities(engine, train)
    allowed = [veto(r["a"], r["b"]) is None for r in train]

    def rates(t: float) -> tuple[float, int]:
        served = [bool(s >= t) and ok for s, ok in zip(sims, allowed, strict=True)]
        hits = [s for s, r in zip(served, train, strict=True) if r["label"] == "hit"]
        return sum(hits) / len(hits), sum(s for s, r in zip(served, train, strict=True)
                                          if r["label"] == "trap")

    grid = [round(0.60 + 0.02 * i, 2) for i in range(20)]
    picked = max(t for t in grid if rates(t)[1] == 0 and rates(t)[0] >= 0.60)
    assert picked == pytest.approx(DEFAULT_THRESHOLD)
