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

`admits_all` and `count` take a request's checks at once (the native lane's question
before a function runs, and its count once answered). native_src/counters.c is the
same class in C, which a PoP uses where it builds (`native.counters`); this one is
the reference the property tests hold it to, and the fallback.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable

from runtime.security.ratelimit.headers import POLICY, STATE

SWEEP_AT = 50_000

# (key, algorithm, amount, window, name): one limit of a request, as `admits_all` and
# `count` take it (`RateLimit.lane_checks` makes them)
type Check = tuple[object, str, int, int, str]


class Counters:
    table: str | None = None  # this process's memory only (the C ones may share a table)

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.state: dict[object, list] = {}  # key -> [algorithm's state..., expires]
        self.lock = threading.Lock()  # the stage runs on one loop; tests hit from threads
        self.sweep_at = self.sweep_floor = SWEEP_AT
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

    def admits_all(self, checks: list[Check], now: float) -> bool:
        """Whether `hit` at `now` would admit a request on each of `checks`, counting
        nothing."""
        return all(self.admits(key, algorithm, amount, window, now)
                   for key, algorithm, amount, window, _ in checks)

    def count(self, checks: list[Check], now: float, fields: bool) -> bytes:
        """Hit each of `checks` at `now`, in order: with `fields`, the RateLimit
        fields `headers.fields` makes of them, as header lines (else b""). Raises
        RuntimeError if one refuses (`admits_all` admitted the request at `now`, and
        nothing counted since: a bug)."""
        policy, state = [], []
        for key, algorithm, amount, window, name in checks:
            admitted, remaining, reset = self.hit(key, algorithm, amount, window, now)
            if not admitted:
                raise RuntimeError(f"rate limit {name!r} refused at {now!r} what it admitted "
                                   "then")
            if fields:
                policy.append(f'"{name}";q={amount};w={window}')
                state.append(f'"{name}";r={max(0, remaining)};t={max(0, math.ceil(reset - now))}')
        if not fields or not checks:
            return b""
        return b"%s: %s\r\n%s: %s\r\n" % (POLICY, ", ".join(policy).encode(), STATE,
                                          ", ".join(state).encode())

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
            self.sweep_at = max(self.sweep_floor, 2 * len(self.state))
