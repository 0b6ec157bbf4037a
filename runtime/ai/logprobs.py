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
    """A completion choice's ``logprobs``; `offset`: where this text starts in the
    whole output (for ``text_offset``)."""
    tokens = [e.token.decode("utf-8", "replace") for e in entries]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t.decode("utf-8", "replace"): lp for t, lp in e.top}
                             for e in entries], "text_offset": offsets}
