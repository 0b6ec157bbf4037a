"""An ``n>1`` chat whose prompt fits in the KV cache once but not twice, on an
idle PoP: the real worker (llama.cpp, the packaged model) runs its choices one
after another, each longer than ``max_queue_seconds``, and answers all of them
(the later choices were turned away 503 ``overloaded``: "no batch slot came
free", with every slot free)."""

from __future__ import annotations

from pathlib import Path

import openai

from tests.support import pop_thread

CHAT = "smollm2-135m"
CONTEXT = 1024
NO_END = {"0": -100, "2": -100}  # <|endoftext|>, <|im_end|>: each choice runs to max_tokens


def test_n_choices_that_fit_only_one_at_a_time_all_come_back(tmp_path: Path) -> None:
    worker = tmp_path / "worker.toml"
    worker.write_text(f'[[models]]\nname = "{CHAT}"\nengine = "llamacpp"\nmax_batch = 4\n'
                      f'context = {CONTEXT}\nmax_queue_seconds = 0.3\n')
    content = " ".join(f"w{i}" for i in range(200)) + "\nSummarize."
    with pop_thread(tmp_path / "data", ai=True, ai_config=str(worker)) as pop:
        client = openai.OpenAI(base_url=f"http://{pop.host}:{pop.port}/v1", api_key="unused",
                               max_retries=0, timeout=120)
        r = client.chat.completions.create(
            model=CHAT, messages=[{"role": "user", "content": content}], n=3, max_tokens=24,
            seed=1, logit_bias=NO_END)
    prompt = r.usage.prompt_tokens  # counted once, as OpenAI does
    assert CONTEXT // 2 < prompt <= CONTEXT - 24, prompt  # fits once, not twice
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.finish_reason for c in r.choices] == ["length"] * 3
    assert r.usage.completion_tokens == 3 * 24
