"""Token budgets and stream caps: the counting, in memory or on Redis.

One algorithm on both: a sliding-window counter of reserved tokens. A bucket's
use at time t is ``previous window * (1 - elapsed fraction) + current window``;
a reservation of n tokens fits when, for every bucket it is charged to,
use + n <= the bucket's limit, and then n is added to each bucket's current
window (all or nothing). Settling adds ``used - reserved`` to the window the
reservation was made in (a refund when negative; never below zero).

A stream slot is a counter per bucket, taken if below its cap and given back
when the stream ends.

`MemoryBudgetStore` is this module; `SharedBudgetStore` keeps its token windows and
stream slots in the table the PoP processes of ``workers = N`` share
(native_src/counters_table.c.h, the same steps in C); `redis_budget.RedisBudgetStore`
runs them in Lua, so a reserve is atomic across every PoP sharing the server.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

WINDOW = 60  # seconds: budgets are per minute


class Refusal:
    """Bucket `index` cannot take the request now; it may after `retry_after` s.
    `used` is the bucket's use when refused."""

    __slots__ = ("index", "retry_after", "used")

    def __init__(self, index: int, used: float, retry_after: float) -> None:
        self.index, self.used, self.retry_after = index, used, retry_after


def wait_until_fits(prev: float, cur: float, amount: int, limit: int, frac: float) -> float:
    """Seconds until ``prev * (1 - f) + cur + amount <= limit`` as `frac` grows,
    assuming nothing else is reserved meanwhile; when it cannot fit in this
    window, the next window's start (a hint: a client may have to wait more)."""
    room = limit - amount - cur
    if room >= 0 and prev > 0:
        return max(0.0, (1 - room / prev) - frac) * WINDOW
    return (1 - frac) * WINDOW


class BudgetStore:
    """Where reservations and stream slots are counted."""

    async def reserve(self, buckets: Sequence[str], limits: Sequence[int], amount: int
                      ) -> int | Refusal:
        """Reserve `amount` in every bucket, or in none. The window id it was
        charged to, or the first refusing bucket."""
        raise NotImplementedError

    async def settle(self, buckets: Sequence[str], window: int, delta: int) -> None:
        """Add `delta` (used - reserved) to each bucket's `window`."""
        raise NotImplementedError

    async def acquire(self, slots: Sequence[str], caps: Sequence[int]) -> int | None:
        """Take a stream slot in each of `slots`, or none: the index of the first
        full one, or None when all were taken."""
        raise NotImplementedError

    async def release(self, slots: Sequence[str]) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        """Drop connections (nothing in memory)."""


class MemoryBudgetStore(BudgetStore):
    """This PoP only. `clock`: seconds (tests move it)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.windows: dict[tuple[str, int], int] = {}
        self.streams: dict[str, int] = {}
        self.reserves = 0  # since the last sweep of old windows

    async def reserve(self, buckets: Sequence[str], limits: Sequence[int], amount: int
                      ) -> int | Refusal:
        return self.reserve_now(buckets, limits, amount)

    def reserve_now(self, buckets: Sequence[str], limits: Sequence[int], amount: int
                    ) -> int | Refusal:
        now = self.clock() / WINDOW
        wid = math.floor(now)
        frac = now - wid
        for i, (bucket, limit) in enumerate(zip(buckets, limits, strict=True)):
            prev = self.windows.get((bucket, wid - 1), 0)
            cur = self.windows.get((bucket, wid), 0)
            if prev * (1 - frac) + cur + amount > limit:
                return Refusal(i, prev * (1 - frac) + cur,
                               wait_until_fits(prev, cur, amount, limit, frac))
        for bucket in buckets:
            self.windows[(bucket, wid)] = self.windows.get((bucket, wid), 0) + amount
        self._expire(wid)
        return wid

    async def settle(self, buckets: Sequence[str], window: int, delta: int) -> None:
        for bucket in buckets:
            key = (bucket, window)
            if key in self.windows:
                self.windows[key] = max(0, self.windows[key] + delta)

    async def acquire(self, slots: Sequence[str], caps: Sequence[int]) -> int | None:
        for i, (slot, cap) in enumerate(zip(slots, caps, strict=True)):
            if self.streams.get(slot, 0) >= cap:
                return i
        for slot in slots:
            self.streams[slot] = self.streams.get(slot, 0) + 1
        return None

    async def release(self, slots: Sequence[str]) -> None:
        for slot in slots:
            left = self.streams.get(slot, 0) - 1
            if left > 0:
                self.streams[slot] = left
            else:
                self.streams.pop(slot, None)

    def _expire(self, wid: int) -> None:
        """Forget windows older than the previous one, every 1024 reservations."""
        self.reserves += 1
        if self.reserves >= 1024:
            self.reserves = 0
            for key in [k for k in self.windows if k[1] < wid - 1]:
                del self.windows[key]


class SharedBudgetStore(MemoryBudgetStore):
    """Token windows and stream slots in the shared table of ``workers = N``
    (`native.SharedTable`), by the same steps for every worker at once (`counters`: a
    `Counters` on that table). `worker`: (which, of how many) this process is: its
    stream slots are counted as that worker's (an earlier incarnation's, one that
    died holding some, count no more); None: this process's own, as in memory."""

    def __init__(self, counters: Any, clock: Callable[[], float] = time.time,
                 worker: tuple[int, int] | None = None) -> None:
        """Raises ValueError for a worker the table cannot count (past 256)."""
        super().__init__(clock)
        self.counters = counters
        self.worker = worker
        if worker is not None:
            counters.join(*worker)

    def reserve_now(self, buckets: Sequence[str], limits: Sequence[int], amount: int
                    ) -> int | Refusal:
        now = self.clock()
        got = self.counters.reserve(list(buckets), list(limits), amount, now)
        if isinstance(got, int):
            return got
        i, prev, cur = got
        frac = now / WINDOW - math.floor(now / WINDOW)
        return Refusal(i, prev * (1 - frac) + cur,
                       wait_until_fits(prev, cur, amount, limits[i], frac))

    async def settle(self, buckets: Sequence[str], window: int, delta: int) -> None:
        self.counters.settle(list(buckets), window, delta)

    async def acquire(self, slots: Sequence[str], caps: Sequence[int]) -> int | None:
        if self.worker is None:
            return await super().acquire(slots, caps)
        return self.counters.acquire(list(slots), list(caps))

    async def release(self, slots: Sequence[str]) -> None:
        if self.worker is None:
            await super().release(slots)
        else:
            self.counters.release(list(slots))
