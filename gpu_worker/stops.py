"""Incremental text output with stop strings: decide, as tokens arrive, which text
may be sent now and where the output ends.

The output ends before the earliest occurrence of any stop string in the whole
text (the order of the stop list does not matter; two that start at the same place
cut at the same place), whichever way the text arrives in tokens: the text sent
never contains a stop string.

Stop strings apply to an answer's text, never to tool calls: where the request has
tools, an output that opens with the tool-call markup (`protocol.TOOL_CALL_OPEN`,
after newlines) is read as calls by the API (`runtime.ai.tool_calls.CallReader`,
which reads any other output as content, all of it) and no stop string cuts it, so
that ``stop=["\\n"]`` or ``'"'`` cannot cut a call's markup or its arguments.
"""

from __future__ import annotations

import codecs

from .protocol import TOOL_CALL_OPEN


class StopText:
    """Feed token bytes; get back text that is safe to send.

    Text that could be the start of a stop string is held back until it can't be
    (also where a stop string already appeared after it: a longer one may still
    start earlier); bytes of a UTF-8 character split across tokens are held until
    complete. With `calls` (the request has tools), text that may still open a tool
    call is held back until it shows whether it does.
    """

    def __init__(self, stops: list[str], calls: bool = False) -> None:
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.pending = ""
        self.stopped = False
        # "content": stops apply; "calls": the output is tool calls, no stop applies;
        # None: not known yet (it may still open a call)
        self.mode: str | None = None if calls and self.stops else "content"

    def feed(self, data: bytes) -> str:
        """Text to send now; sets `stopped` when a stop string appeared (the stop
        string and anything after it are dropped)."""
        if self.stopped:
            return ""
        self.pending += self.decoder.decode(data)
        return self._take(final=False)

    def flush(self) -> str:
        """The rest, at the end of generation (cut at a stop string held back
        there: `stopped` is then set)."""
        if self.stopped:
            return ""
        self.pending += self.decoder.decode(b"", final=True)
        return self._take(final=True)

    def _take(self, final: bool) -> str:
        if self.mode is None:
            head = self.pending.lstrip("\n")
            if head.startswith(TOOL_CALL_OPEN):
                self.mode = "calls"
            elif final or not TOOL_CALL_OPEN.startswith(head):
                self.mode = "content"
            else:  # it may still open a call: held until it shows
                return ""
        if self.mode == "calls":
            out, self.pending = self.pending, ""
            return out
        at = self._first_stop()
        end = len(self.pending) if final else self._safe_end()
        if at is not None and at <= end:  # no stop string can begin before this one
            self.stopped = True
            out, self.pending = self.pending[:at], ""
            return out
        out, self.pending = self.pending[:end], self.pending[end:]
        return out

    def _first_stop(self) -> int | None:
        """Where the earliest stop string in `pending` begins, or None."""
        found = [at for at in (self.pending.find(s) for s in self.stops) if at >= 0]
        return min(found, default=None)

    def _safe_end(self) -> int:
        """The longest prefix of `pending` that no stop string can begin in."""
        text = self.pending
        for i in range(max(0, len(text) - self.hold), len(text)):
            tail = text[i:]
            if any(s.startswith(tail) for s in self.stops):
                return i
        return len(text)
