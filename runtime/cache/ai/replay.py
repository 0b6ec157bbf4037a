"""A stored result rendered for the request it serves, in the shapes
`runtime.ai.openai_api` produces: a completion JSON with a new id, a valid SSE
stream (role chunk, the stored content chunks, finish chunk, usage chunk if
asked, ``data: [DONE]``), an embeddings list, or an ``ai`` binding result.
Usage reports the prompt as cached: ``prompt_tokens_details.cached_tokens``."""

from __future__ import annotations

import base64
import secrets
import struct
import time
from typing import Any

from runtime.cache.ai.entry import Embedded, Generated
from runtime.net.openai_sse import DONE, Chunks


def usage(r: Generated) -> dict[str, Any]:
    return {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
            "total_tokens": r.prompt_tokens + r.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": r.prompt_tokens}}


def _rid(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)


def completion(r: Generated, model: str, chat: bool) -> dict[str, Any]:
    """The body of a non-streamed ``/v1/chat/completions`` or ``/v1/completions``."""
    if chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": r.text}}
    else:
        choice = {"index": 0, "text": r.text, "logprobs": None}
    choice["finish_reason"] = r.finish_reason
    return {"id": _rid(chat), "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "system_fingerprint": r.fingerprint,
            "choices": [choice], "usage": usage(r)}


def sse(r: Generated, model: str, chat: bool, include_usage: bool) -> bytes:
    """The whole SSE body of a streamed request, ending in ``data: [DONE]``."""
    chunks = Chunks(_rid(chat), model, chat, r.fingerprint, include_usage)
    out = chunks.opening()
    out += [chunks.chunk(c) for c in r.chunks]
    out.append(chunks.closing(r.finish_reason))
    if include_usage:
        out.append(chunks.usage(usage(r)))
    out.append(DONE)
    return b"".join(out)


def embeddings(r: Embedded, model: str, encoding_format: str) -> dict[str, Any]:
    data = [{"object": "embedding", "index": i,
             "embedding": _b64(v) if encoding_format == "base64" else v}
            for i, v in enumerate(r.embeddings)]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": r.tokens, "total_tokens": r.tokens}}


def _b64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def binding(r: Generated | Embedded) -> dict[str, Any]:
    """What the ``ai`` binding's chat/complete/embed return."""
    if isinstance(r, Embedded):
        return {"embeddings": r.embeddings, "tokens": r.tokens}
    return {"text": r.text, "finish_reason": r.finish_reason,
            "usage": {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
                      "cached_tokens": r.prompt_tokens}}
