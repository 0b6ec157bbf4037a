"""A generation whose caller names no ``max_tokens`` (`protocol.Generate`): the
default cap, within what the model's context leaves after the prompt, on a real
worker process with a 256-token context (the packaged smollm2-135m). A prompt
that fits was refused for the default's 256 tokens nobody asked for."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_worker.client import WorkerError
from gpu_worker.protocol import DEFAULT_MAX_TOKENS
from tests.gpu_worker.harness import Harness

CHAT = "smollm2-135m"
CONTEXT = 256
NO_END = {0: -100.0, 2: -100.0}  # <|endoftext|>, <|im_end|>: it runs to its cap


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    tmp = tmp_path_factory.mktemp("cap")
    config = tmp / "worker.toml"
    config.write_text(f'[[models]]\nname = "{CHAT}"\nengine = "llamacpp"\n'
                      f"threads = 1\ncontext = {CONTEXT}\nmax_batch = 1\n")
    with Harness(str(tmp / "w.sock"), str(config)) as w:
        yield w


def chat(words: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "Repeat: " + "cat " * words}]


def generate(w: Harness, words: int, **params: Any) -> tuple[str, Any]:
    async def go() -> tuple[str, Any]:
        gen = await w.client.generate(CHAT, messages=chat(words), temperature=0.0,
                                      logit_bias=NO_END, stream=False, **params)
        return await gen.collect()
    return w.run(go())


def test_without_max_tokens_a_long_prompt_gets_what_the_context_leaves(
        worker: Harness) -> None:
    _, done = generate(worker, 200)
    assert 200 < done.prompt_tokens < CONTEXT - 8
    assert (done.finish_reason, done.completion_tokens) == (
        "length", CONTEXT - done.prompt_tokens)  # not refused: 256 more would not fit
    with pytest.raises(WorkerError) as e:  # asked for, the same cap is refused
        generate(worker, 200, max_tokens=DEFAULT_MAX_TOKENS)
    assert (e.value.code, e.value.status) == ("context_length_exceeded", 400)


def test_without_max_tokens_a_short_prompt_gets_the_default(tmp_path: Path) -> None:
    """In a context with room for more, the default still caps it."""
    config = tmp_path / "worker.toml"
    config.write_text(f'[[models]]\nname = "{CHAT}"\nengine = "llamacpp"\n'
                      f"threads = 1\ncontext = 1024\nmax_batch = 1\n")
    with Harness(str(tmp_path / "w.sock"), str(config)) as w:
        _, done = generate(w, 3)
    assert (done.finish_reason, done.completion_tokens) == ("length", DEFAULT_MAX_TOKENS)


def test_without_max_tokens_a_prompt_that_fills_the_context_is_refused(
        worker: Harness) -> None:
    with pytest.raises(WorkerError) as e:
        generate(worker, 400)
    assert (e.value.code, e.value.status) == ("context_length_exceeded", 400)
    assert "leaves none to generate" in str(e.value)
