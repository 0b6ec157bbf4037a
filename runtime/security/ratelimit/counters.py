"""`Counters`: the three algorithms of the `limits` library for one PoP's memory,
as plain per-key state behind one lock.

`limits`' own MemoryStorage costs 7-10 us per rule on the hello path (a lock per
key, expiry events, a timer thread; bench/bench_ratelimit.py), a third of the
whole request: these counters keep the same arithmetic in about a microsecond.

- ``fixed_window``: a count that starts over `window` seconds after its first hit.
- ``sliding_window`` (the sliding window counter): windows aligned on multiples
  of `window`; a request is admitted while ``floor(previous * (1 - elapsed) +
  current) + 1 <= amount``, ``elapsed`` being the fraction of the current window
  gone (limits' `SlidingWindowCounterRateLimiter`).
- ``moving_window``: the time of every admitted hit in the last `window`
  seconds, admitted while fewer than `amount` (exact; memory O(amount) per key).

State whose window has passed is dropped by a sweep once more than `SWEEP_AT`
keys are held, so memory follows the clients active in one window.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable

SWEEP_AT = 50_000


class Counters:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.state: dict[object, list] = {}  # key -> [algorithm's state..., expires]
        self.lock = threading.Lock()  # the stage runs on one loop; tests hit from threads
        self.sweep_at = SWEEP_AT
        self.steps = {"sliding_window": self._sliding, "fixed_window": self._fixed,
                      "moving_window": self._moving}

    def hit(self, key: object, algorithm: str, amount: int, window: int,
            now: float | None = None) -> tuple[bool, int, float]:
        """Count one request at `now` (default: the clock): (admitted, remaining
        after it, reset time (epoch s))."""
        if now is None:
            now = self.clock()
        with self.lock:
            if len(self.state) >= self.sweep_at:
                self._sweep(now)
            return self.steps[algorithm](key, amount, window, now)

    def admits(self, key: object, algorithm: str, amount: int, window: int, now: float
               ) -> bool:
        """Whether `hit` at `now` would admit a request, counting nothing (the native
        lane asks before it runs a function, and hits once it answered)."""
        with self.lock:
            s = self.state.get(key)
            if algorithm == "fixed_window":
                return (0 if s is None or now >= s[1] else s[0]) + 1 <= amount
            if algorithm == "sliding_window":
                index = int(now // window)
                if s is None or s[0] < index - 1:
                    previous, current = 0, 0
                elif s[0] == index - 1:
                    previous, current = s[2], 0
                else:
                    previous, current = s[1], s[2]
                left = window - (now - index * window)
                return previous * left / window + current < amount
            if s is None:
                return amount > 0
            hits: deque[float] = s[0]
            old = 0
            for t in hits:  # oldest first: those `_moving` would drop
                if t >= now - window:
                    break
                old += 1
            return len(hits) - old < amount

    def _fixed(self, key: object, amount: int, window: int, now: float
               ) -> tuple[bool, int, float]:
        s = self.state.get(key)
        if s is None or now >= s[1]:
            s = self.state[key] = [0, now + window]
        s[0] += 1
        return s[0] <= amount, amount - s[0], s[1]

    def _sliding(self, key: object, amount: int, window: int, now: float
                 ) -> tuple[bool, int, float]:
        index = int(now // window)
        s = self.state.get(key)
        if s is None or s[0] < index - 1:
            s = self.state[key] = [index, 0, 0, 0.0]  # index, previous, current, expires
        elif s[0] == index - 1:
            s[0], s[1], s[2] = index, s[2], 0
        s[3] = (index + 2) * window
        left = window - (now - index * window)  # seconds to the end of the current window
        previous = s[1]
        weighted = previous * left / window + s[2]
        admitted = weighted < amount  # floor(weighted) + 1 <= amount, weighted >= 0
        if admitted:
            s[2] += 1
            weighted += 1
        reset = left % (window / previous) if previous else math.inf
        if s[2]:
            reset = min(reset, left % window)
        return admitted, amount - int(weighted), now + (0.0 if reset == math.inf else reset)

    def _moving(self, key: object, amount: int, window: int, now: float
                ) -> tuple[bool, int, float]:
        s = self.state.get(key)
        if s is None:
            s = self.state[key] = [deque(), 0.0]
        hits: deque[float] = s[0]
        while hits and hits[0] < now - window:  # a hit exactly one window old still counts
            hits.popleft()
        admitted = len(hits) < amount
        if admitted:
            hits.append(now)
        s[1] = now + window
        return admitted, amount - len(hits), (hits[0] if hits else now) + window

    def _sweep(self, now: float) -> None:
        """Drop state whose windows have passed; if nothing could be dropped, wait
        for twice as many keys before the next sweep."""
        before = len(self.state)
        self.state = {k: s for k, s in self.state.items() if s[-1] > now}
        if len(self.state) > before // 2:
            self.sweep_at = max(SWEEP_AT, 2 * len(self.state))
