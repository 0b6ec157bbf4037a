"""A request the model worker has no batch slot for within `max_queue_seconds`
gets 503 ``overloaded`` with ``Retry-After`` then, not a 504 minutes later: a
real worker (llama.cpp, the packaged model) with one slot, held by a stream that
cannot end early (its end-of-generation tokens banned)."""

from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest

from tests.support import pop_thread

CHAT = "smollm2-135m"
WAIT = 1.0  # max_queue_seconds
NO_END = {"0": -100, "2": -100}  # <|endoftext|>, <|im_end|>: the stream runs to max_tokens


def test_a_request_with_no_slot_within_max_queue_seconds_gets_503_and_retry_after(
        tmp_path: Path) -> None:
    worker = tmp_path / "worker.toml"
    worker.write_text(f'[[models]]\nname = "{CHAT}"\nengine = "llamacpp"\nmax_batch = 1\n'
                      f'max_queue_seconds = {WAIT}\n')
    with pop_thread(tmp_path / "data", ai=True, ai_config=str(worker)) as pop:
        client = openai.OpenAI(base_url=f"http://{pop.host}:{pop.port}/v1", api_key="unused",
                               max_retries=0)
        holder = client.chat.completions.create(
            model=CHAT, messages=[{"role": "user", "content": "Count to a thousand."}],
            max_tokens=2000, logit_bias=NO_END, stream=True)
        try:
            next(iter(holder))  # running: it holds the only slot from here
            started = time.monotonic()
            with pytest.raises(openai.InternalServerError) as e:
                client.chat.completions.create(
                    model=CHAT, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
            waited = time.monotonic() - started
        finally:
            holder.close()
        assert e.value.status_code == 503 and e.value.code == "overloaded"
        assert e.value.response.headers["retry-after"] == "2"
        assert f"no batch slot came free within {WAIT:g} s" in e.value.message
        assert WAIT <= waited < WAIT + 2.0, waited  # (loaded 2-core CI: steps slow down)
        # the slot comes free once the stream is gone; meanwhile the official client
        # retries the 503 after its Retry-After
        retrying = client.with_options(max_retries=5)
        again = retrying.chat.completions.create(
            model=CHAT, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        assert again.choices[0].finish_reason in ("length", "stop")
