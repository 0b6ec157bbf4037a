"""Per-sequence LoRA adapters (the llama.cpp that .ci/llama-wheel patches): a batch
mixing adapters decodes in one call, and each sequence gets what its adapter alone
gives, whether the stack is applied by the CPU op or by the ggml ops a GPU uses.
Real model (SmolLM2-135M, F16), real adapters, real llama.cpp."""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Iterator
from pathlib import Path

import llama_cpp as ll
import numpy as np
import pytest

from gpu_worker.adapters import write_random_lora
from gpu_worker.engines.llama_model import LlamaModel, quiet
from gpu_worker.models import converted, packaged_model

# llama.cpp layers offloaded: 0 here; EDGEFN_TEST_GPU_LAYERS=-1 runs these on a CUDA
# build's GPU, where the stack lives in device memory and only the ggml ops apply it
GPU_LAYERS = int(os.environ.get("EDGEFN_TEST_GPU_LAYERS", "0"))

# (slot, adapter, scale): ranks 8, 12 and 16 (stacked, padded to 16), one at half scale
SEQS: list[tuple[int, str | None, float]] = [(0, None, 1.0), (1, "a0", 1.0), (2, "a1", 0.5),
                                             (3, "a2", 1.0)]


@pytest.fixture(scope="module", params=["cpu-op", "graph-ops"])
def lm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
       ) -> Iterator[LlamaModel]:
    """The model with three adapters, stacked. "graph-ops": the stack applied with the
    ggml ops (every adapter, masked) that adapters offloaded to a GPU use, here on the CPU
    (EDGEFN_LORA_STACK_GRAPH, read by every stacking while the tests run)."""
    with pytest.MonkeyPatch.context() as env:
        if request.param == "graph-ops":
            env.setenv("EDGEFN_LORA_STACK_GRAPH", "1")
        else:
            env.delenv("EDGEFN_LORA_STACK_GRAPH", raising=False)
        tmp = tmp_path_factory.mktemp("lora")
        model = LlamaModel(converted(packaged_model(), "f16"), 1024, 4, 2, GPU_LAYERS)
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


@pytest.fixture(autouse=True)
def _forget_every_slot(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that fails half way leaves no KV cache behind for the next one."""
    yield
    if "lm" in request.fixturenames:
        model = request.getfixturevalue("lm")
        for slot, _, _ in SEQS:
            model.forget(slot)


def test_a_mixed_batch_gives_each_sequence_its_own_adapter(lm: LlamaModel) -> None:
    tokens = lm.tokenize("The capital of France is")
    alone = _alone(lm, tokens)
    n = len(tokens)
    items = [item for slot, _, _ in SEQS for item in _prompt(lm, slot, tokens)]
    lm.use_adapters([(slot, None, 1.0) for slot, _, _ in SEQS])  # no adapter: the stock graph
    assert lm.decode(items) == 0
    stock = _logits(lm, n - 1)  # the base sequence in a batch of this shape
    for slot, _, _ in SEQS:
        lm.forget(slot)
    lm.use_adapters(SEQS)
    assert lm.decode(items) == 0  # one call for all four
    got = {slot: _logits(lm, slot * n + n - 1) for slot, _, _ in SEQS}
    # the stack adds exact zeros to a sequence without an adapter, on a GPU too
    assert np.array_equal(got[0], stock), float(np.abs(got[0] - stock).max())
    # the batch's shape alone moves the base model's logits (other kernels, sums in
    # another order): ~1e-5 on a CPU, up to 0.08 on a GPU; an adapter's sequence may be
    # off its own path by that and the rounding of its own sums (<= 0.05 on a CPU)
    shape = float(np.abs(stock - alone[0]).max())
    off = {name: float(np.abs(got[slot] - alone[slot]).max()) for slot, name, _ in SEQS if name}
    for slot, name, _ in SEQS:
        if name is None:
            continue
        effect = np.abs(alone[slot] - alone[0]).max()  # what the adapter changes
        assert effect > 5, effect
        assert off[name] < 0.05 + 2 * shape, (off, shape)
        assert got[slot].argmax() == alone[slot].argmax()
        assert np.abs(got[slot] - alone[0]).max() > 5  # not the base model's logits


# where the KV cache's cells are moves a GPU's attention sums (0.016 measured on an
# H200 when a sequence's cells follow another's); a CPU's are exact
KV_CELLS_MOVE = 0.05 if GPU_LAYERS else 0.0


def test_a_batch_of_base_sequences_after_a_mixed_one_is_the_base_model(lm: LlamaModel) -> None:
    tokens = lm.tokenize("Name three colours.")
    alone = _alone(lm, tokens)
    lm.use_adapters(SEQS)
    assert lm.decode(_prompt(lm, 1, tokens) + _prompt(lm, 2, tokens)) == 0  # adapters
    lm.forget(1)
    lm.forget(2)
    lm.use_adapters([(1, None, 1.0)])
    assert lm.decode(_prompt(lm, 1, tokens)) == 0
    assert np.abs(_logits(lm, len(tokens) - 1) - alone[0]).max() <= KV_CELLS_MOVE
    lm.forget(1)


def test_the_stack_is_applied_by_the_ops_asked_for(lm: LlamaModel, tmp_path: Path,
                                                  request: pytest.FixtureRequest) -> None:
    """Stacking logs how many weights each way applies; "graph-ops" must really take
    the ggml ops' path (a library that ignored EDGEFN_LORA_STACK_GRAPH would pass the
    other tests on the CPU op)."""
    lines: list[str] = []

    @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    def capture(level: int, text: bytes, _: object) -> None:
        lines.append(text.decode(errors="replace"))

    path = tmp_path / "extra.gguf"
    write_random_lora(packaged_model(), path, rank=8, seed=11, std=0.1)
    ll.llama_log_set(capture, None)
    try:
        lm.load_adapter("extra", str(path))  # restacks every loaded adapter
    finally:
        quiet()
        lm.unload_adapter("extra")
    found = [m for line in lines if (m := re.search(
        r"(\d+) adapters stacked: (\d+) weights by ggml ops, (\d+) by the CPU op", line))]
    assert found, f"no stacking line in {len(lines)} log lines"
    adapters, graph, cpu = (int(g) for g in found[-1].groups())
    assert adapters == len(lm.adapters) + 1 and graph + cpu > 0
    if request.node.callspec.params["lm"] == "graph-ops" or (lm.gpu and GPU_LAYERS):
        assert cpu == 0
    else:
        assert graph == 0


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
    model = LlamaModel(converted(packaged_model(), "f16"), 512, 2, 1, GPU_LAYERS)
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
