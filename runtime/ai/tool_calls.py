"""Tool calls out of a generation's text: the worker writes each call as
``TOOL_CALL_OPEN{"name": "<name>", "arguments": <JSON>}TOOL_CALL_CLOSE``
(`gpu_worker.protocol`; the llama.cpp engine's grammar guarantees that layout),
and `CallReader` turns that text, as it streams, into OpenAI's pieces: plain
``content``, a call's start (id, name) and its ``arguments`` fragments.

A text that does not start with the opening markup is content, all of it.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any, NamedTuple

from gpu_worker.protocol import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

HEAD = re.compile(r'\n?' + re.escape(TOOL_CALL_OPEN) + r'\{"name": "([^"]*)", "arguments": ')
TAIL = "}" + TOOL_CALL_CLOSE
# a call's head cut after its name (by max_tokens): the call, without arguments
NAMED = re.compile(r'\n?' + re.escape(TOOL_CALL_OPEN) + r'\{"name": "([^"]*)"')


class Piece(NamedTuple):
    """``kind``: "content" (`text`), "call" (call number `call` starts: `text` is its
    name, `id` its id) or "args" (more of call `call`'s arguments)."""

    kind: str
    text: str
    call: int = 0
    id: str = ""


class CallReader:
    """Splits a streamed generation into content and tool calls."""

    def __init__(self) -> None:
        self.buf = ""
        self.mode: str | None = None  # None until the text shows what it is: content or calls
        self.in_args = False
        self.calls = 0
        self.args = ""  # the current call's arguments given out so far

    def feed(self, text: str) -> list[Piece]:
        """The pieces `text` completes (text that may still be markup is held back)."""
        self.buf += text
        if self.mode is None:
            self._decide()
        if self.mode == "content":
            out, self.buf = ([Piece("content", self.buf)] if self.buf else []), ""
            return out
        return self._calls() if self.mode == "calls" else []

    def end(self) -> list[Piece]:
        """What is left when the generation ended. A call cut short by max_tokens
        keeps its partial arguments, as OpenAI's do, or is a call without any when
        it was cut right after its name; markup cut before a call's name is whole
        is nobody's text, never content (``"<tool"`` reached clients as the answer)."""
        if self.mode == "calls":
            rest = self._calls()
            if self.in_args and self.buf:
                kept = self._cut()
                if kept:
                    rest.append(Piece("args", kept, self.calls - 1))
            elif not self.in_args and (m := NAMED.match(self.buf)) is not None:
                rest.append(Piece("call", m[1], self.calls, "call_" + secrets.token_hex(12)))
                self.calls += 1
            return rest
        if self.mode is None:  # it ended on what could only open a call: its markup
            return []
        return [Piece("content", self.buf)] if self.buf else []

    def _cut(self) -> str:
        """What of the held-back text is arguments when the generation ended: not
        the start of the closing markup (``}\n</tool_call`` reached the client
        after complete arguments), keeping a ``}`` that completes their JSON."""
        buf = self.buf
        for k in range(len(buf), -1, -1):
            if TAIL.startswith(buf[k:]) and _is_json(self.args + buf[:k]):
                return buf[:k]
        for k in range(len(buf)):  # cut inside the arguments: drop only what is markup
            if len(buf) - k >= 2 and TAIL.startswith(buf[k:]):
                return buf[:k]
        return buf

    def _decide(self) -> None:
        head = self.buf.lstrip("\n")
        if head.startswith(TOOL_CALL_OPEN):
            self.mode = "calls"
        elif not TOOL_CALL_OPEN.startswith(head):
            self.mode = "content"

    def _calls(self) -> list[Piece]:
        out: list[Piece] = []
        while True:
            if not self.in_args:
                m = HEAD.match(self.buf)
                if m is None:
                    return out
                out.append(Piece("call", m[1], self.calls, "call_" + secrets.token_hex(12)))
                self.buf, self.in_args, self.args = self.buf[m.end():], True, ""
                self.calls += 1
            at = self.buf.find(TAIL)
            if at < 0:  # all but what may be the start of the closing markup
                safe = max(0, len(self.buf) - len(TAIL) + 1)
                if safe:
                    out.append(Piece("args", self.buf[:safe], self.calls - 1))
                    self.args += self.buf[:safe]
                    self.buf = self.buf[safe:]
                return out
            if at:
                out.append(Piece("args", self.buf[:at], self.calls - 1))
                self.args += self.buf[:at]
            self.buf, self.in_args = self.buf[at + len(TAIL):], False


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def message(pieces: list[Piece]) -> dict[str, Any]:
    """A chat completion's ``message`` from all the pieces of one generation."""
    content = "".join(p.text for p in pieces if p.kind == "content")
    calls: list[dict[str, Any]] = []
    for p in pieces:
        if p.kind == "call":
            calls.append({"id": p.id, "type": "function",
                          "function": {"name": p.text, "arguments": ""}})
        elif p.kind == "args":
            calls[p.call]["function"]["arguments"] += p.text
    if not calls:
        return {"role": "assistant", "content": content}
    for call in calls:
        call["function"]["arguments"] = call["function"]["arguments"].strip()
    return {"role": "assistant", "content": content or None, "tool_calls": calls}


def delta(p: Piece) -> dict[str, Any]:
    """A streamed ``delta`` for one piece, as OpenAI streams calls: the first delta
    of a call has its id, type and name, the next ones ``arguments`` fragments."""
    if p.kind == "content":
        return {"content": p.text}
    if p.kind == "call":
        return {"tool_calls": [{"index": p.call, "id": p.id, "type": "function",
                                "function": {"name": p.text, "arguments": ""}}]}
    return {"tool_calls": [{"index": p.call, "function": {"arguments": p.text}}]}
