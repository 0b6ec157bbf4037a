"""OnnxEngine on the real packaged all-MiniLM-L6-v2 (int8 ONNX); no mocks."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgefn_core.errors import EngineError
from gpu_worker.config import ModelSpec
from gpu_worker.engines.onnx import (
    MAX_TEXT_CHARS,
    MAX_TOKENS,
    OnnxEngine,
    libstdcxx_clash,
    model_files,
)

MODEL = "all-minilm-l6-v2"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def engine() -> Iterator[OnnxEngine]:
    """The packaged model, loaded once for the module."""
    if libstdcxx_clash():
        pytest.skip("onnxruntime would segfault here: usearch was imported first "
                    "(see gpu_worker/engines/onnx.py)")
    eng = OnnxEngine(ModelSpec(MODEL, "onnx"))
    asyncio.run(eng.start())
    yield eng
    eng.close()


def embed(eng: OnnxEngine, texts: list[Any], model: str = MODEL) -> tuple[np.ndarray, int]:
    vecs, tokens = asyncio.run(eng.embed(model, texts))
    return np.array(vecs), tokens


def rerank(eng: OnnxEngine, query: Any, docs: list[Any]) -> tuple[list[float], int]:
    return asyncio.run(eng.rerank(MODEL, query, docs))


def test_models_reports_dim_and_rerank_method(engine: OnnxEngine) -> None:
    (info,) = engine.models()
    assert (info.id, info.kind, info.engine) == (MODEL, "embed", "onnx")
    assert info.details["dim"] == 384
    assert "cosine" in info.details["rerank"]


def test_embedding_has_dim_384_and_unit_norm(engine: OnnxEngine) -> None:
    vecs, tokens = embed(engine, ["hello world", "A longer sentence about something else."])
    assert vecs.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert tokens > 4


def test_tokens_count_non_pad_tokens_and_long_inputs_truncate(engine: OnnxEngine) -> None:
    _, tokens = embed(engine, ["hello world"])  # [CLS] hello world [SEP]
    assert tokens == 4
    _, tokens = embed(engine, ["hello world", "word " * 1000])
    assert tokens == 4 + MAX_TOKENS


def test_embedding_is_deterministic(engine: OnnxEngine) -> None:
    text = ["The quick brown fox jumps over the lazy dog."]
    first, _ = embed(engine, text)
    second, _ = embed(engine, text)
    assert np.array_equal(first, second)


def test_batch_of_40_matches_one_at_a_time(engine: OnnxEngine) -> None:
    # Varied lengths so batches pad, and 40 > one batch of 32.
    texts = [f"Sentence number {i} " + "about cats and dogs " * (i % 7) for i in range(40)]
    batch, batch_tokens = embed(engine, texts)
    singles = [embed(engine, [t]) for t in texts]
    np.testing.assert_allclose(batch, np.vstack([v for v, _ in singles]), atol=1e-5)
    assert batch_tokens == sum(n for _, n in singles)


def test_similar_sentences_are_closer(engine: OnnxEngine) -> None:
    vecs, _ = embed(engine, ["A man is playing a guitar.", "Someone plays an instrument.",
                             "The stock market fell today."])
    guitar, instrument, stocks = vecs
    assert guitar @ instrument > 0.5
    assert guitar @ instrument > guitar @ stocks + 0.3


def test_rerank_puts_the_answer_first(engine: OnnxEngine) -> None:
    docs = ["Berlin is the capital of Germany.", "The Eiffel Tower is tall.",
            "Paris is the capital of France.", "I like to eat apples.",
            "France borders Spain and Italy."]
    scores, tokens = rerank(engine, "What is the capital of France?", docs)
    assert len(scores) == len(docs)
    assert int(np.argmax(scores)) == 2
    assert scores[3] == min(scores)
    assert all(-1.0 - 1e-5 <= s <= 1.0 + 1e-5 for s in scores)
    assert tokens > len(docs) * 2


def test_rerank_scores_are_cosine_of_embeddings(engine: OnnxEngine) -> None:
    query, docs = "weather today", ["It is sunny and warm.", "Quarterly revenue grew."]
    scores, _ = rerank(engine, query, docs)
    vecs, _ = embed(engine, [query, *docs])
    np.testing.assert_allclose(scores, vecs[1:] @ vecs[0], atol=1e-5)


@pytest.mark.parametrize("inputs", [[], [""], ["ok", ""], [1], ["ok", None], "a string",
                                    ["x"] * 2049, ["ok", "word " * (MAX_TEXT_CHARS // 5 + 1)]])
def test_bad_embed_inputs_are_invalid_requests(engine: OnnxEngine, inputs: Any) -> None:
    with pytest.raises(EngineError) as e:
        embed(engine, inputs)
    assert (e.value.code, e.value.status) == ("invalid_request", 400)


def test_an_input_of_max_text_chars_is_embedded() -> None:
    from gpu_worker.engines.onnx import _check_texts

    assert _check_texts(["x" * MAX_TEXT_CHARS], "input", 1) == ["x" * MAX_TEXT_CHARS]


@pytest.mark.parametrize(("query", "docs"), [("", ["doc"]), (None, ["doc"]), ("q", []),
                                             ("q", [""]), ("q", [3]), ("q", ["d"] * 1001),
                                             ("q" * (MAX_TEXT_CHARS + 1), ["d"]),
                                             ("q", ["d", "d" * (MAX_TEXT_CHARS + 1)])])
def test_bad_rerank_inputs_are_invalid_requests(engine: OnnxEngine, query: Any,
                                                docs: Any) -> None:
    with pytest.raises(EngineError) as e:
        rerank(engine, query, docs)
    assert e.value.code == "invalid_request"


def test_other_model_is_not_found(engine: OnnxEngine) -> None:
    with pytest.raises(EngineError) as e:
        embed(engine, ["hi"], model="nope")
    assert (e.value.code, e.value.status) == ("model_not_found", 404)


def test_missing_path_is_invalid_config(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    eng = OnnxEngine(ModelSpec("x", "onnx", path=str(missing)))
    with pytest.raises(EngineError) as e:
        asyncio.run(eng.start())
    assert (e.value.code, e.value.status) == ("invalid_config", 500)
    assert str(missing) in str(e.value)
    eng.close()


def test_dir_without_tokenizer_is_invalid_config(tmp_path: Path) -> None:
    onnx_file, _ = model_files(MODEL, "auto")
    (tmp_path / "model.onnx").symlink_to(onnx_file)
    eng = OnnxEngine(ModelSpec("x", "onnx", path=str(tmp_path)))
    with pytest.raises(EngineError) as e:
        asyncio.run(eng.start())
    assert e.value.code == "invalid_config"
    assert str(tmp_path / "tokenizer.json") in str(e.value)
    eng.close()


def test_model_directory_path_loads_and_close_stops_serving(engine: OnnxEngine,
                                                            tmp_path: Path) -> None:
    onnx_file, tokenizer_file = model_files(MODEL, "auto")
    (tmp_path / "model.onnx").symlink_to(onnx_file)
    (tmp_path / "tokenizer.json").symlink_to(tokenizer_file)
    eng = OnnxEngine(ModelSpec("local", "onnx", path=str(tmp_path), threads=1))
    asyncio.run(eng.start())
    mine, _ = embed(eng, ["same text"], model="local")
    packaged, _ = embed(engine, ["same text"])
    np.testing.assert_allclose(mine, packaged, atol=1e-5)
    eng.close()
    with pytest.raises(EngineError) as e:
        embed(eng, ["after close"], model="local")
    assert e.value.code == "internal"


def test_usearch_loaded_first_is_a_clean_error_not_a_crash() -> None:
    code = """
import asyncio, usearch.compiled
from gpu_worker.config import ModelSpec
from edgefn_core.errors import EngineError
from gpu_worker.engines.onnx import OnnxEngine
eng = OnnxEngine(ModelSpec("m", "onnx"))
try:
    asyncio.run(eng.start())
except EngineError as e:
    print(e.code, e)
eng.close()
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("internal onnxruntime cannot load"), out.stdout
