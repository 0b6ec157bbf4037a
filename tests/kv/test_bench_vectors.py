"""bench/bench_vectors.py: its ground truth, recall, corpus and held-out split, and
its `--quick` run end to end (real MiniLM embeddings of real docstrings, a real
usearch sweep and kv.vectors)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def bench_module(name: str) -> ModuleType:
    """A bench/ script as a module (bench/ is not a package; the script puts
    bench/ on sys.path itself, as it does when run)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return bench_module("bench_vectors")


def test_exact_top_is_the_k_highest_cosines_in_order(bench: ModuleType) -> None:
    rng = np.random.default_rng(5)
    data = rng.standard_normal((600, 8)).astype(np.float32)
    data /= np.linalg.norm(data, axis=1, keepdims=True)
    queries = data[:300] + 0.05 * rng.standard_normal((300, 8)).astype(np.float32)
    want = np.argsort(-(queries @ data.T), axis=1, kind="stable")[:, :bench.K]
    assert (bench.exact_top(data, queries) == want).all()  # 300 > one 256-query block
    assert (bench.exact_one(data, queries[7]) == want[7]).all()


def test_recall_counts_the_true_neighbours_found(bench: ModuleType) -> None:
    truth = np.arange(20).reshape(2, 10)
    assert bench.recall(truth[:, ::-1], truth) == 1.0  # order does not matter
    found = truth.copy()
    found[0, :5] = [90, 91, 92, 93, -1]  # -1: usearch's padding when fewer are found
    assert bench.recall(found, truth) == 0.75


def test_sentences_are_prose_of_bounded_length(bench: ModuleType) -> None:
    corpus = sys.modules["_corpus"]
    text = ("Return the number of items in the container, counting duplicates. Short one.\n\n"
            ">>> len([1, 2, 3]) returns three for a list with three items in it\n\n"
            "{{ %% ## 1234567890 1234567890 1234567890 1234567890 ## %% }}")
    assert list(corpus.sentences_of(text)) == [
        "Return the number of items in the container, counting duplicates."]


def test_held_out_queries_are_not_indexed_and_the_split_is_fixed(bench: ModuleType) -> None:
    corpus = sys.modules["_corpus"]
    vecs = np.arange(50, dtype=np.float32).reshape(50, 1)
    index, queries = corpus.split(vecs, 10)
    assert len(index) == 40 and len(queries) == 10
    assert set(index[:, 0]).isdisjoint(queries[:, 0])
    assert set(index[:, 0]) | set(queries[:, 0]) == set(range(50))
    again = corpus.split(vecs, 10)
    assert (again[1] == queries).all()


ROW = re.compile(r"^M=(\d+) add=(\d+) (f32|f16|i8) ef=(\d+)\s+[\d.]+\s+\d+\s+([\d.]+)\s+(\d+)")


@pytest.mark.slow
def test_quick_run_sweeps_real_embeddings_and_picks_a_setting_meeting_recall() -> None:
    r = subprocess.run([sys.executable, "bench/bench_vectors.py", "--quick"], cwd=ROOT,
                       capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "== 4000 x 384, cosine, k=10, 200 held-out queries" in out
    rows = [ROW.match(line) for line in out.splitlines()]
    sweep = [m.groups() for m in rows if m]
    assert {(g[0], g[2]) for g in sweep} >= {("8", "f32"), ("16", "f32")}
    assert {g[2] for g in sweep} == {"f32", "i8"}
    pick = re.search(r"cheapest with recall@10 >= 0.98: M=(\d+) add=(\d+) (\w+) ef=(\d+): "
                     r"recall ([\d.]+), (\d+) QPS = ([\d.]+)x exact", out)
    assert pick is not None, out
    assert float(pick[5]) >= 0.98
    best_met = max(int(g[5]) for g in sweep if float(g[4]) >= 0.98)
    assert int(pick[6]) == best_met  # the fastest of those meeting the target
    store = re.search(r"through kv.vectors.VectorStore, the pick .* recall ([\d.]+)", out)
    assert store is not None and float(store[1]) >= 0.97, out
