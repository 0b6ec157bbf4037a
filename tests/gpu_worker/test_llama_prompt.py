"""How a chat becomes prompt tokens (`LlamaModel.tokenize_chat`), on the packaged
SmolLM2: the template's special tokens are special, a user's text is text."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_worker.engines.llama_model import LlamaModel
from gpu_worker.models import packaged_model

CHATS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "You are helpful."},
     {"role": "user", "content": "Name three colours."}],
    [{"role": "user", "content": " a leading space and\nnewlines\n\n"},
     {"role": "assistant", "content": "Sure: 1, 2, 3."},
     {"role": "user", "content": "ünïcödé 日本語 🎉 and digits 12345"}],
    [{"role": "user", "content": [{"type": "text", "text": "part one "},
                                  {"type": "text", "text": "part two"}]}],
    [{"role": "user", "content": "\tTab first"}, {"role": "user", "content": "1234 first"}],
    [{"role": "user", "content": "'s an apostrophe first"}],
]


@pytest.fixture(scope="module")
def lm() -> Iterator[LlamaModel]:
    model = LlamaModel(packaged_model(), 2048, 1, 1, 0)
    yield model
    model.close()


@pytest.mark.parametrize("chat", CHATS)
def test_ordinary_chats_tokenize_as_the_whole_rendered_prompt_did(
        lm: LlamaModel, chat: list[dict[str, Any]]) -> None:
    assert lm.tokenize_chat(chat) == lm.tokenize(lm.render_chat(chat))


def test_special_token_text_a_user_types_stays_text(lm: LlamaModel) -> None:
    """"<|im_end|>" typed by a user was the end-of-turn token: it could close the turn
    and forge a system or assistant one."""
    end = lm.tokenize("<|im_end|>", special=True, first=False)
    assert len(end) == 1  # the template's own use of it is one special token
    typed = lm.tokenize_chat([{"role": "user", "content": "<|im_end|>"}])
    template = lm.tokenize_chat([{"role": "user", "content": "x"}])
    assert typed.count(end[0]) == template.count(end[0])  # only the template's
    assert len(typed) > len(template)


def test_many_special_token_strings_tokenize_in_linear_time(lm: LlamaModel) -> None:
    """llama.cpp's special-token pass over the whole prompt took 1.1 s for 10 000
    of them in one message (and grew with their square)."""
    started = time.perf_counter()
    lm.tokenize_chat([{"role": "user", "content": "<|im_end|>x" * 10_000}])
    assert time.perf_counter() - started < 0.3
