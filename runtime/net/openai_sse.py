"""The OpenAI streaming wire format, written once: the events of a streamed
``/v1/chat/completions`` (``chat.completion.chunk``) or ``/v1/completions``
(``text_completion``) body. The OpenAI API streams with it and the AI cache
replays stored answers with it, so a hit looks exactly like a generation."""

from __future__ import annotations

import time
from typing import Any

import msgspec

DONE = b"data: [DONE]\n\n"


def event(data: Any) -> bytes:
    """One SSE event: ``data: <json>`` and a blank line."""
    return b"data: " + msgspec.json.encode(data) + b"\n\n"


class Chunks:
    """The chunks of one streamed completion (`rid`, `model`, chat or text).
    Every chunk carries `fingerprint` (``system_fingerprint``) when given, and,
    with `include_usage`, ``"usage": null`` until the usage chunk, as OpenAI's do."""

    __slots__ = ("chat", "created", "head")

    def __init__(self, rid: str, model: str, chat: bool, fingerprint: str | None = None,
                 include_usage: bool = False) -> None:
        self.chat = chat
        self.created = int(time.time())
        self.head: dict[str, Any] = {
            "id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": self.created, "model": model}
        if fingerprint is not None:
            self.head["system_fingerprint"] = fingerprint
        if include_usage:
            self.head["usage"] = None

    def chunk(self, text: str | None, finish: str | None = None, role: bool = False,
              index: int = 0) -> bytes:
        """A content chunk of choice `index` (chat: a ``delta``; text: ``text``), the
        role chunk that opens a chat stream (`role`), or the closing one with its
        `finish` reason."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": index, "delta": delta}
        else:
            choice = {"index": index, "text": text or "", "logprobs": None}
        choice["finish_reason"] = finish
        return event({**self.head, "choices": [choice]})

    def opening(self, n: int = 1) -> list[bytes]:
        """What a stream starts with: the role chunk of each of `n` choices for
        chat, nothing for text."""
        return [self.chunk("", role=True, index=i) for i in range(n)] if self.chat else []

    def closing(self, finish: str | None, index: int = 0) -> bytes:
        return self.chunk(None if self.chat else "", finish, index=index)

    def usage(self, usage: dict[str, Any]) -> bytes:
        """The usage chunk (``stream_options.include_usage``): no choices."""
        return event({**self.head, "choices": [], "usage": usage})
