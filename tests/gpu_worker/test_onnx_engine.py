"""OnnxEngine on the real packaged all-MiniLM-L6-v2 (int8 ONNX); no mocks."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from edgefn_core.errors import EngineError
from gpu_worker.config import ModelSpec
from gpu_worker.engines.onnx import (
    MAX_INPUTS,
    MAX_TEXT_CHARS,
    MAX_TOKENS,
    PREFIX_CHARS,
    OnnxEngine,
    libstdcxx_clash,
    model_files,
    splits_at_spaces,
)

MODEL = "all-minilm-l6-v2"
ROOT = Path(__file__).resolve().parents[2]
# the red team's request: the most inputs, each of the most characters (MAX_TOKENS tokens)
LONG = [(f"{i} " + "lighthouse keeper " * MAX_TEXT_CHARS)[:MAX_TEXT_CHARS]
        for i in range(MAX_INPUTS)]
SHORT = ["is it going to rain in lisbon tomorrow"]


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


def edge_texts(seed: int) -> list[str]:
    """Texts past `PREFIX_CHARS` whose tokens a cut could change: a long word, a word
    or a control character at the cut, no spaces, CJK, accents, punctuation."""
    rng = np.random.default_rng(seed)
    pieces = ["word", "x" * 150, "é", "\x1c", "\u3000", "日本語", ",", "don't", "  ", "\t"]
    texts = ["lighthouse " * 2000, "x" * (PREFIX_CHARS + 10), "日本" * PREFIX_CHARS,
             " " * PREFIX_CHARS + "word " * 10]
    for cut_piece in pieces:
        for shift in (-3, -1, 0, 1, 2):
            head = "w " * ((PREFIX_CHARS + shift) // 2)
            texts.append(head + cut_piece * 40 + " tail" * 300)
    for _ in range(40):
        texts.append("".join(rng.choice(pieces, PREFIX_CHARS // 2)))
    return texts


def test_long_texts_get_the_tokens_of_the_whole_text(engine: OnnxEngine) -> None:
    """`encode` reads a prefix of a long text where that gives the same tokens."""
    embedder = engine._embedder_for(MODEL)
    for text in edge_texts(seed=7):
        whole = embedder.tokenizer.encode(text)
        ids, types = embedder.encode(text)
        assert ids.tolist() == whole.ids, repr(text[PREFIX_CHARS - 20:PREFIX_CHARS + 20])
        assert types.tolist() == whole.type_ids


def test_only_tokenizers_that_split_at_spaces_read_a_prefix(engine: OnnxEngine) -> None:
    """A tokenizer whose tokens may span a space (a Metaspace pre-tokenizer that
    keeps it, a normalizer that removes spaces) reads the whole text."""
    from tokenizers import normalizers, pre_tokenizers

    tokenizer = engine._embedder_for(MODEL).tokenizer
    assert splits_at_spaces(tokenizer)
    other = Tokenizer.from_str(tokenizer.to_str())
    other.pre_tokenizer = pre_tokenizers.Metaspace()
    assert not splits_at_spaces(other)
    other = Tokenizer.from_str(tokenizer.to_str())
    other.normalizer = normalizers.Replace(" ", "")
    assert not splits_at_spaces(other)


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


def test_a_long_query_is_named_as_one_text(engine: OnnxEngine) -> None:
    """It was "query[0] has 32769 characters" for one query string."""
    with pytest.raises(EngineError, match=rf"^query has {MAX_TEXT_CHARS + 1} characters;"):
        rerank(engine, "q" * (MAX_TEXT_CHARS + 1), ["d"])
    with pytest.raises(EngineError, match=rf"^documents\[1\] has {MAX_TEXT_CHARS + 1} "):
        rerank(engine, "q", ["d", "d" * (MAX_TEXT_CHARS + 1)])


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


def best_time(eng: OnnxEngine, texts: list[str]) -> float:
    """The faster of two solo embeddings of `texts`, in seconds (the machine is shared)."""
    times = []
    for _ in range(2):
        started = time.monotonic()
        embed(eng, texts)
        times.append(time.monotonic() - started)
    return min(times)


def test_a_short_embedding_waits_for_a_few_batches_of_a_long_one_not_all(
        engine: OnnxEngine) -> None:
    """Two such LONG requests made every other embedding (the PoP's semantic cache
    too) wait 91-111 s: the engine ran requests whole, in FIFO order."""
    step = best_time(engine, LONG[:4])  # one tokenizing step and one inference batch
    solo = best_time(engine, SHORT)
    bound = 2 * solo + 3 * step

    async def go() -> tuple[np.ndarray, float]:
        long = asyncio.ensure_future(engine.embed(MODEL, LONG))
        await asyncio.sleep(step)  # it is running
        started = time.monotonic()
        try:
            vecs, _ = await asyncio.wait_for(engine.embed(MODEL, SHORT), bound)
        finally:
            long.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await long
        return np.array(vecs), time.monotonic() - started

    vecs, waited = asyncio.run(go())
    assert waited < bound, (waited, solo, step)
    assert np.array_equal(vecs, embed(engine, SHORT)[0])


def test_interleaved_requests_get_what_they_get_alone_and_short_ones_end_first(
        engine: OnnxEngine) -> None:
    texts = [LONG[i][:40 * (i % 9 + 1)] for i in range(96)]  # several tokenizing steps and
    # batches of several widths
    docs = ["It is sunny and warm.", "Quarterly revenue grew."]
    alone = embed(engine, texts), embed(engine, SHORT), rerank(engine, "weather today", docs)
    ended: list[str] = []

    async def one(name: str, work: Any) -> Any:
        out = await work
        ended.append(name)
        return out

    async def go() -> tuple[Any, ...]:
        return await asyncio.gather(one("long", engine.embed(MODEL, texts)),
                                    one("short", engine.embed(MODEL, SHORT)),
                                    one("rerank", engine.rerank(MODEL, "weather today", docs)))

    (long_vecs, long_tokens), (short_vecs, short_tokens), scores = asyncio.run(go())
    assert ended == ["short", "rerank", "long"]
    assert np.array_equal(long_vecs, alone[0][0]) and long_tokens == alone[0][1]
    assert np.array_equal(short_vecs, alone[1][0]) and short_tokens == alone[1][1]
    assert scores == alone[2]


def test_a_cancelled_long_embedding_frees_the_thread_within_a_step(engine: OnnxEngine) -> None:
    step = best_time(engine, LONG[:4])
    bound = 2 * best_time(engine, SHORT) + 2 * step

    async def go() -> tuple[float, float]:
        long = asyncio.ensure_future(engine.embed(MODEL, LONG))
        await asyncio.sleep(step)
        long.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await long
        started = time.monotonic()
        await asyncio.wait_for(engine.embed(MODEL, SHORT), bound)
        waited = time.monotonic() - started
        cpu = time.process_time()
        await asyncio.sleep(1.0)
        return waited, time.process_time() - cpu

    waited, busy = asyncio.run(go())
    assert waited < bound
    assert busy < 0.1  # the engine thread sits idle: the long request no longer runs


def test_a_burst_of_long_inputs_leaves_the_memory_it_found() -> None:
    """16 inputs of MAX_TOKENS ran as one batch and onnxruntime's arena kept the
    ~0.5 GB it grew to (2048 of them: the worker went 741 MB -> 2.27 GB, and stayed)."""
    code = f"""
import asyncio
from gpu_worker.config import ModelSpec
from gpu_worker.engines.onnx import OnnxEngine

def rss():
    return next(int(line.split()[1]) >> 10 for line in open("/proc/self/status")
                if line.startswith("VmRSS"))

async def main():
    eng = OnnxEngine(ModelSpec({MODEL!r}, "onnx"))
    await eng.start()
    await eng.embed({MODEL!r}, ["warm up"] * 32)
    long = [(f"{{i}} " + "lighthouse keeper " * 2000)[:{MAX_TEXT_CHARS}] for i in range(16)]
    before = rss()
    await eng.embed({MODEL!r}, long)
    print(before, rss())
    eng.close()

asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    before, after = map(int, out.stdout.split())
    assert after - before < 100, (before, after)  # MB


def steps(gen: Any) -> int:
    """How many turns a job of steps takes (its ``next()`` calls)."""
    n = 0
    try:
        while True:
            next(gen)
            n += 1
    except StopIteration:
        return n + 1


def test_a_short_request_takes_one_turn_and_a_long_one_never_runs_two_kinds_of_work_in_one(
        engine: OnnxEngine) -> None:
    """Its last tokenizing step and its first batch were one turn: a short request
    behind it waited for both (helper 110's review)."""
    embedder = engine._embedder_for(MODEL)
    assert steps(embedder.embed_steps(["a short one"] * 8)) == 1
    texts = [f"text number {i}" for i in range(40)]  # 2 tokenizing steps, 2 batches
    assert steps(embedder.embed_steps(texts)) == 4
