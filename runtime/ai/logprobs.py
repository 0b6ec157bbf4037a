"""OpenAI's logprobs shapes from the worker's `TokenLogprob`s: chat's
``{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}`` and the legacy
completions' ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``."""

from __future__ import annotations

from typing import Any

from gpu_worker.protocol import TokenLogprob


def _alt(token: bytes, logprob: float) -> dict[str, Any]:
    return {"token": token.decode("utf-8", "replace"), "logprob": logprob, "bytes": list(token)}


def chat(entries: list[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's ``logprobs``."""
    return {"content": [{**_alt(e.token, e.logprob), "top_logprobs": [_alt(*t) for t in e.top]}
                        for e in entries], "refusal": None}


def completion(entries: list[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """A completion choice's ``logprobs``, as OpenAI's legacy completions give them:
    `offset` is where this text starts counted from the start of the prompt (the
    output's first character is at ``len(prompt)``: ``echo`` is refused), for
    ``text_offset``; each ``top_logprobs`` map holds the sampled token too (up to
    ``logprobs + 1`` entries), which the most likely ones may leave out."""
    tokens = [e.token.decode("utf-8", "replace") for e in entries]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    tops = []
    for token, e in zip(tokens, entries, strict=True):
        top = {t.decode("utf-8", "replace"): lp for t, lp in e.top}
        top.setdefault(token, e.logprob)
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": tops, "text_offset": offsets}
