"""Legacy ``/v1/completions`` logprobs as OpenAI gives them: ``text_offset`` counts
from the start of the prompt (``echo`` is refused, so the first is ``len(prompt)``),
and each ``top_logprobs`` map holds the sampled token as well as the ``logprobs``
most likely ones (up to ``logprobs + 1`` entries). Units over `runtime.ai.logprobs`
and `runtime.ai.shaping`, then the real PoP and worker with the packaged model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from gpu_worker.protocol import TokenLogprob
from runtime.ai import logprobs as lp
from runtime.ai.shaping import ChoiceStream, choice
from tests.support import pop_thread

CHAT = "smollm2-135m"
PROMPT = "The capital of France is"  # 24 characters

ENTRIES = [TokenLogprob(b" Paris", -0.5, [(b" Paris", -0.5)]),
           TokenLogprob(b",", -3.0, [(b".", -0.2)]),  # sampled outside the top 1
           TokenLogprob(b" a", -1.5, [])]  # logprobs=0: no alternatives asked


def test_completion_logprobs_count_text_offset_from_the_given_start() -> None:
    assert lp.completion(ENTRIES, 24)["text_offset"] == [24, 30, 31]
    assert lp.completion(ENTRIES)["text_offset"] == [0, 6, 7]


def test_each_top_logprobs_map_holds_its_sampled_token() -> None:
    shaped = lp.completion(ENTRIES, 24)
    assert shaped["top_logprobs"] == [{" Paris": -0.5}, {".": -0.2, ",": -3.0}, {" a": -1.5}]
    assert shaped["tokens"] == [" Paris", ",", " a"]
    assert shaped["token_logprobs"] == [-0.5, -3.0, -1.5]


def test_chat_top_logprobs_stay_the_most_likely_only() -> None:
    """Chat's ``top_logprobs`` are the ``top_logprobs`` most likely, as OpenAI's."""
    assert [[t["token"] for t in c["top_logprobs"]] for c in lp.chat(ENTRIES)["content"]] == [
        [" Paris"], ["."], []]


def test_a_whole_completion_choice_starts_its_text_offset_after_the_prompt() -> None:
    params = {"prompt": PROMPT, "logprobs": 1}
    shaped = choice(False, params, " Paris, a", "length", ENTRIES)["logprobs"]
    assert shaped["text_offset"] == [24, 30, 31]


class _Chunks:
    chat = False
    head: dict[str, Any] = {"id": "cmpl-1", "object": "text_completion"}


class _Gen:
    def __init__(self) -> None:
        self.logprobs: list[TokenLogprob] = []


def test_a_streamed_completion_choice_starts_its_text_offset_after_the_prompt() -> None:
    stream = ChoiceStream(_Chunks(), {"prompt": PROMPT, "logprobs": 1})  # type: ignore[arg-type]
    gen = _Gen()
    offsets = []
    for entry in ENTRIES:
        gen.logprobs.append(entry)
        for ev in stream.events(entry.token.decode(), gen):  # type: ignore[arg-type]
            body = json.loads(ev.decode().removeprefix("data: ").strip())
            offsets += body["choices"][0]["logprobs"]["text_offset"]
    assert offsets == [24, 30, 31]


# -- through the real PoP and worker -------------------------------------------------------

@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    with pop_thread(tmp_path_factory.mktemp("logprobs-pop"), ai=True) as pop, \
            pop.openai(timeout=300) as c:
        yield c


def _check(lps: Any, text: str, start: int, k: int) -> None:
    assert "".join(lps.tokens) == text
    assert lps.text_offset[0] == start
    assert lps.text_offset == [start + len("".join(lps.tokens[:i]))
                               for i in range(len(lps.tokens))]
    for token, logprob, top in zip(lps.tokens, lps.token_logprobs, lps.top_logprobs,
                                   strict=True):
        assert token in top and len(top) <= k + 1, (token, top)
        if "\ufffd" not in token:  # (a piece of a character may share its key)
            assert top[token] == pytest.approx(logprob)


def test_completion_logprobs_as_openai_gives_them(client: openai.OpenAI) -> None:
    r = client.completions.create(model=CHAT, prompt=PROMPT, max_tokens=12, logprobs=1,
                                  temperature=2, seed=11)
    c = r.choices[0]
    assert len(c.logprobs.tokens) == r.usage.completion_tokens
    _check(c.logprobs, c.text, len(PROMPT), 1)
    # at temperature 2 the sampled token is often not the most likely one: the map
    # then has it beside the most likely (it had only that one: 9 tokens of 12)
    assert any(len(top) == 2 for top in c.logprobs.top_logprobs)

    streamed = client.completions.create(model=CHAT, prompt=PROMPT, max_tokens=12, logprobs=1,
                                         temperature=2, seed=11, stream=True)
    chunks = [ch.choices[0] for ch in streamed if ch.choices and ch.choices[0].logprobs]
    tokens = [t for ch in chunks for t in ch.logprobs.tokens]
    assert tokens == c.logprobs.tokens
    assert [o for ch in chunks for o in ch.logprobs.text_offset] == c.logprobs.text_offset
    assert [t for ch in chunks for t in ch.logprobs.top_logprobs] == c.logprobs.top_logprobs
