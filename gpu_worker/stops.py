"""Incremental text output with stop strings: decide, as tokens arrive, which text
may be sent now and where the output ends."""

from __future__ import annotations

import codecs


class StopText:
    """Feed token bytes; get back text that is safe to send.

    Text that could be the start of a stop string is held back until it can't be;
    bytes of a UTF-8 character split across tokens are held until complete.
    """

    def __init__(self, stops: list[str]) -> None:
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.pending = ""
        self.stopped = False

    def feed(self, data: bytes) -> str:
        """Text to send now; sets `stopped` when a stop string appeared (the stop
        string and anything after it are dropped)."""
        if self.stopped:
            return ""
        self.pending += self.decoder.decode(data)
        for stop in self.stops:
            at = self.pending.find(stop)
            if at >= 0:
                self.stopped = True
                out, self.pending = self.pending[:at], ""
                return out
        cut = self._safe_end()
        out, self.pending = self.pending[:cut], self.pending[cut:]
        return out

    def flush(self) -> str:
        """The rest, at the end of generation."""
        if self.stopped:
            return ""
        out = self.pending + self.decoder.decode(b"", final=True)
        self.pending = ""
        return out

    def _safe_end(self) -> int:
        """The longest prefix of `pending` that no stop string can begin in."""
        text = self.pending
        for i in range(max(0, len(text) - self.hold), len(text)):
            tail = text[i:]
            if any(s.startswith(tail) for s in self.stops):
                return i
        return len(text)
