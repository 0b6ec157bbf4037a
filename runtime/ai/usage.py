"""`UsageRecord`: what a model call of the OpenAI API did, for the request's
event (``ctx.decisions["ai"]``, an `AIUsage` the ``events`` stage moves to
`Event.ai`): model, adapter, tokens, time to first token, tokens/s, finish reason."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gpu_worker.protocol import Done
from runtime.observe.event import AIUsage

if TYPE_CHECKING:
    from runtime.pipeline.stage import Context

_clock = time.perf_counter


class UsageRecord:
    """Fills `usage` as the call goes; recorded into `ctx` at once (so a call that
    fails half-way still says what it asked for)."""

    def __init__(self, ctx: Context | None, operation: str, model: str, *,
                 stream: bool = False, adapter: str | None = None,
                 prompt: str | None = None) -> None:
        self.started = ctx.started if ctx is not None else _clock()
        self.first: float | None = None
        self.usage = AIUsage(operation=operation, model=model, adapter=adapter, stream=stream,
                             prompt=prompt)
        if ctx is not None:
            ctx.decide("ai", self.usage)

    def first_token(self) -> None:
        """The first token arrived now (once; later calls are ignored)."""
        if self.first is None:
            self.first = _clock()
            self.usage.ttft_ms = round((self.first - self.started) * 1000, 3)

    def finish(self, done: Done | None, tokens_so_far: int = 0,
               reason: str | None = "cancelled") -> None:
        """The generation ended with `done`, or (None) was cut off after
        `tokens_so_far` tokens for `reason` (the client went away: "cancelled";
        the call failed: "error"; refused for its input: None)."""
        u = self.usage
        if done is not None:
            u.prompt_tokens, u.completion_tokens = done.prompt_tokens, done.completion_tokens
            u.finish_reason = done.finish_reason
        else:
            u.completion_tokens, u.finish_reason = tokens_so_far, reason
        chunked = self.first is not None
        self.first_token()  # a reply with no chunk: its first token came with the end
        assert self.first is not None
        spent = _clock() - self.first
        # tokens after the first over the time they took (vLLM's inter-token rate); a
        # reply that came whole (not streamed) says nothing of it: none
        if chunked and u.completion_tokens > 1 and spent > 0:
            u.tokens_per_s = round((u.completion_tokens - 1) / spent, 2)

    def counted(self, tokens: int) -> None:
        """An embedding or rerank call's input tokens."""
        self.usage.prompt_tokens = tokens


def prompt_of(params: dict[str, Any]) -> str | None:
    """The text a generation was asked about: a completion's prompt, or a chat's
    last user message (when it is plain text)."""
    prompt = params.get("prompt")
    if isinstance(prompt, str):
        return prompt
    for message in reversed(params.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else None
    return None
