"""Per-sequence LoRA adapters (the llama.cpp that .ci/llama-wheel patches): a batch
mixing adapters decodes in one call, and each sequence gets what its adapter alone
gives. Real model (SmolLM2-135M, F16), real adapters, real llama.cpp."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import llama_cpp as ll
import numpy as np
import pytest

from gpu_worker.adapters import write_random_lora
from gpu_worker.engines.llama_model import LlamaModel
from gpu_worker.models import converted, packaged_model

# (slot, adapter, scale): ranks 8, 12 and 16 (stacked, padded to 16), one at half scale
SEQS: list[tuple[int, str | None, float]] = [(0, None, 1.0), (1, "a0", 1.0), (2, "a1", 0.5),
                                             (3, "a2", 1.0)]


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaModel]:
    tmp = tmp_path_factory.mktemp("lora")
    model = LlamaModel(converted(packaged_model(), "f16"), 1024, 4, 2, 0)
    for i in range(3):
        path = tmp / f"a{i}.gguf"
        write_random_lora(packaged_model(), path, rank=8 + 4 * i, seed=i, std=0.1)
        model.load_adapter(f"a{i}", str(path))
    try:
        yield model
    finally:
        model.close()


def _logits(lm: LlamaModel, index: int) -> np.ndarray:
    return np.ctypeslib.as_array(ll.llama_get_logits_ith(lm.ctx, index),
                                 shape=(lm.n_vocab,)).copy()


def _prompt(lm: LlamaModel, slot: int, tokens: list[int]) -> list[tuple[int, int, int, bool]]:
    return [(t, i, slot, i == len(tokens) - 1) for i, t in enumerate(tokens)]


def _alone(lm: LlamaModel, tokens: list[int]) -> dict[int, np.ndarray]:
    """Each sequence of SEQS decoded by itself, its adapter set on the whole context
    (llama.cpp's own path)."""
    lm.use_adapters([(slot, None, 1.0) for slot, _, _ in SEQS])  # none from the stack
    per_seq, lm.per_seq = lm.per_seq, False
    out = {}
    try:
        for slot, name, scale in SEQS:
            lm.use_adapter(name, scale)
            assert lm.decode(_prompt(lm, slot, tokens)) == 0
            out[slot] = _logits(lm, len(tokens) - 1)
            lm.forget(slot)
        lm.use_adapter(None, 1.0)
    finally:
        lm.per_seq = per_seq
    return out


def test_this_build_stacks_the_adapters(lm: LlamaModel) -> None:
    assert lm.per_seq, "llama-cpp-python lacks the per-sequence LoRA patch (make venv)"
    assert {name: lm.stacked[name] for name in ("a0", "a1", "a2")} == {"a0": 0, "a1": 1, "a2": 2}


def test_a_mixed_batch_gives_each_sequence_its_own_adapter(lm: LlamaModel) -> None:
    tokens = lm.tokenize("The capital of France is")
    alone = _alone(lm, tokens)
    lm.use_adapters(SEQS)
    items = [item for slot, _, _ in SEQS for item in _prompt(lm, slot, tokens)]
    assert lm.decode(items) == 0  # one call for all four
    n = len(tokens)
    for slot, name, _ in SEQS:
        got = _logits(lm, slot * n + n - 1)
        if name is None:  # exact zeros from the stack; the batch's shape alone moves
            assert np.abs(got - alone[slot]).max() < 1e-3  # the sums' order (~1e-6)
            continue
        effect = np.abs(alone[slot] - alone[0]).max()  # what the adapter changes
        assert effect > 5, effect
        # the same sums in another order: float rounding, far below the adapter's effect
        assert np.abs(got - alone[slot]).max() < 0.05, (name, np.abs(got - alone[slot]).max())
        assert got.argmax() == alone[slot].argmax()
        assert np.abs(got - alone[0]).max() > 5  # not the base model's logits
    for slot, _, _ in SEQS:
        lm.forget(slot)


def test_a_batch_of_base_sequences_after_a_mixed_one_is_the_base_model(lm: LlamaModel) -> None:
    tokens = lm.tokenize("Name three colours.")
    alone = _alone(lm, tokens)
    lm.use_adapters(SEQS)
    assert lm.decode(_prompt(lm, 1, tokens) + _prompt(lm, 2, tokens)) == 0  # adapters
    lm.forget(1)
    lm.forget(2)
    lm.use_adapters([(1, None, 1.0)])
    assert lm.decode(_prompt(lm, 1, tokens)) == 0
    assert np.array_equal(_logits(lm, len(tokens) - 1), alone[0])
    lm.forget(1)


def test_adapters_loaded_later_join_the_stack(lm: LlamaModel, tmp_path: Path) -> None:
    path = tmp_path / "late.gguf"
    write_random_lora(packaged_model(), path, rank=4, seed=9, std=0.1)
    lm.load_adapter("late", str(path))
    assert lm.per_seq and lm.stacked["late"] == 3
    tokens = lm.tokenize("Hello")
    lm.use_adapters([(0, "late", 1.0)])
    assert lm.decode(_prompt(lm, 0, tokens)) == 0
    late = _logits(lm, len(tokens) - 1)
    lm.forget(0)
    lm.use_adapters([(0, None, 1.0)])
    assert lm.decode(_prompt(lm, 0, tokens)) == 0
    assert np.abs(late - _logits(lm, len(tokens) - 1)).max() > 1
    lm.forget(0)


def test_an_unloaded_adapter_leaves_the_stack_and_the_others_keep_theirs(
        tmp_path: Path) -> None:
    """`lora rm` kept a removed adapter's rows in every mixed step; unloading restacks
    without it, and the adapters left answer as they did."""
    model = LlamaModel(converted(packaged_model(), "f16"), 512, 2, 1, 0)
    try:
        for i, name in enumerate(("x", "y")):
            path = tmp_path / f"{name}.gguf"
            write_random_lora(packaged_model(), path, rank=8, seed=20 + i, std=0.1)
            model.load_adapter(name, str(path))
        tokens = model.tokenize("Hello there")

        def with_y() -> np.ndarray:
            model.use_adapters([(0, "y", 1.0)])
            assert model.decode(_prompt(model, 0, tokens)) == 0
            out = _logits(model, len(tokens) - 1)
            model.forget(0)
            return out

        before = with_y()
        model.unload_adapter("x")
        assert model.per_seq and model.stacked == {"y": 0}
        after = with_y()  # a stack of another shape: the same sums in another order
        assert np.abs(after - before).max() < 0.05 and after.argmax() == before.argmax()
        model.unload_adapter("y")
        assert model.stacked == {} and "y" not in model.adapters
        model.use_adapters([(0, None, 1.0)])
        assert model.decode(_prompt(model, 0, tokens)) == 0  # the base model, no stack
    finally:
        model.close()
