"""A generation's choice in OpenAI's shape, whole or streamed: plain text, or
``tool_calls`` read out of the text (`tool_calls.CallReader`) when the request
had tools, with ``logprobs`` when it asked for them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runtime.ai import logprobs as lp
from runtime.ai.tool_calls import CallReader, Piece, delta, message
from runtime.net.openai_sse import event

if TYPE_CHECKING:
    from gpu_worker.client import Generation
    from gpu_worker.protocol import TokenLogprob
    from runtime.net.openai_sse import Chunks


def _finish(reason: str, pieces: list[Piece]) -> str:
    return "tool_calls" if reason == "stop" and any(p.kind == "call" for p in pieces) else reason


def choice(chat: bool, params: dict[str, Any], text: str, reason: str,
           entries: list[TokenLogprob], index: int = 0) -> dict[str, Any]:
    """Choice `index`, whole; `params` are the Generate fields the request asked for."""
    wants_lp = params.get("logprobs") is not None
    if not chat:  # text_offset counts from the prompt's start, as OpenAI's does
        return {"index": index, "text": text, "finish_reason": reason,
                "logprobs": lp.completion(entries, _prompt_chars(params)) if wants_lp
                else None}
    pieces: list[Piece] = [Piece("content", text)]
    if _reads_calls(params):
        reader = CallReader()
        pieces = reader.feed(text) + reader.end()
    return {"index": index, "message": message(pieces), "finish_reason": _finish(reason, pieces),
            "logprobs": lp.chat(entries) if wants_lp else None}


def _prompt_chars(params: dict[str, Any]) -> int:
    """Where a completion's output starts in OpenAI's ``text_offset``: after its prompt."""
    return len(params.get("prompt") or "")


def _reads_calls(params: dict[str, Any]) -> bool:
    return bool(params.get("tools")) and params.get("tool_choice") != "none"


class ChoiceStream:
    """The chunks of a streamed choice, one call of `events` per text chunk read."""

    def __init__(self, chunks: Chunks, params: dict[str, Any], index: int = 0) -> None:
        self.chunks = chunks
        self.index = index
        self.reader = CallReader() if chunks.chat and _reads_calls(params) else None
        self.logprobs = params.get("logprobs") is not None
        self.seen = 0  # logprobs of the generation already read
        # logprobs read but not sent yet: those of text the call reader still holds (the
        # markup), sent with the next piece whatever its kind, or at the end
        self.unsent: list[TokenLogprob] = []
        self.offset = _prompt_chars(params)  # completions: where the next text starts
        self.pieces: list[Piece] = []

    def plain(self) -> bool:
        """Whether chunks are plain text (`Chunks.chunk` does them, no shaping)."""
        return self.reader is None and not self.logprobs

    def events(self, text: str, gen: Generation) -> list[bytes]:
        """The chunk(s) for `text`, just read from `gen`."""
        self.unsent += gen.logprobs[self.seen:]
        self.seen = len(gen.logprobs)
        pieces = self.reader.feed(text) if self.reader else [Piece("content", text)]
        return self._events(pieces)

    def end(self) -> list[bytes]:
        """Chunks for what the reader still held when the generation ended; logprobs
        still unsent (those of a call's closing markup) come in a chunk of their own
        with an empty delta, so that the stream lists every token the whole response
        does."""
        out = self._events(self.reader.end()) if self.reader else []
        if self.unsent and self.chunks.chat:
            choice = {"index": self.index, "delta": {}, "finish_reason": None,
                      "logprobs": lp.chat(self.unsent)}
            self.unsent = []
            out.append(event({**self.chunks.head, "choices": [choice]}))
        return out

    def finish(self, reason: str) -> str:
        return _finish(reason, self.pieces)

    def _events(self, pieces: list[Piece]) -> list[bytes]:
        self.pieces += pieces
        out = []
        for p in pieces:
            # the logprobs read so far go with the first piece: a call's start or its
            # arguments carry theirs as content does (the whole response lists them)
            entries, self.unsent = self.unsent, []
            choice: dict[str, Any] = self._shape(p, entries)
            out.append(event({**self.chunks.head, "choices": [choice]}))
        return out

    def _shape(self, p: Piece, entries: list[TokenLogprob]) -> dict[str, Any]:
        if not self.chunks.chat:
            shaped = lp.completion(entries, self.offset) if self.logprobs else None
            self.offset += len(p.text)
            return {"index": self.index, "text": p.text, "logprobs": shaped, "finish_reason": None}
        out: dict[str, Any] = {"index": self.index, "delta": delta(p), "finish_reason": None}
        if self.logprobs:
            out["logprobs"] = lp.chat(entries)
        return out
