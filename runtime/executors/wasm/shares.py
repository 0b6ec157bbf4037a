"""The WASM worker threads one event loop's functions share, owner by owner.

Each owner (`Manifest.tenant`) holds at most `per_owner` of the `total` threads at
once, and the last `reserve` of them go only to owners holding none: caps alone let
three owners with functions that block or loop (3 x 6 of 16) hold every thread, and
a fourth owner's request waited out its wall limit. With the reserve, up to
`total - reserve` threads go to whoever asks (owners under their cap), and then each
owner without a thread still gets one, `reserve` such owners at once.

A waiting request takes the first thread it may take, in the order they asked: one
owner at its cap does not hold back another's request behind it. Everything here
runs on the loop's thread (a worker thread gives its thread back through
``loop.call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
from collections import deque


class ThreadShares:
    def __init__(self, total: int, per_owner: int, reserve: int) -> None:
        """Raises `ValueError` unless 0 < `per_owner` <= `total` - `reserve` and
        0 <= `reserve` < `total`."""
        if not (0 <= reserve < total and 0 < per_owner <= total - reserve):
            raise ValueError(f"thread shares: {per_owner} per owner and {reserve} in "
                             f"reserve do not fit {total} threads")
        self.total, self.per_owner, self.reserve = total, per_owner, reserve
        self.held: dict[str, int] = {}  # threads each owner holds (owners holding none: absent)
        self.in_use = 0
        self.waiting: deque[tuple[str, asyncio.Future[None]]] = deque()

    def may_take(self, owner: str) -> bool:
        """Whether `owner` may take a thread now."""
        held = self.held.get(owner, 0)
        return held < self.per_owner and (self.in_use < self.total - self.reserve
                                          or (held == 0 and self.in_use < self.total))

    async def acquire(self, owner: str) -> None:
        """Take one of the threads for `owner`, once it may. Cancelled while it
        waits, it takes none (or gives back the one it was just granted)."""
        if self.may_take(owner):
            self._take(owner)
            return
        granted = asyncio.get_running_loop().create_future()
        entry = (owner, granted)
        self.waiting.append(entry)
        try:
            await granted
        except BaseException:
            if granted.done() and not granted.cancelled():  # granted, then cancelled
                self.release(owner)
            elif entry in self.waiting:  # (`_wake` drops a cancelled one it meets)
                self.waiting.remove(entry)
            raise

    def release(self, owner: str) -> None:
        """`owner` gives one thread back; waiting requests that may take one now do."""
        left = self.held[owner] - 1
        if left:
            self.held[owner] = left
        else:
            del self.held[owner]
        self.in_use -= 1
        if self.waiting:
            self._wake()

    def _take(self, owner: str) -> None:
        self.held[owner] = self.held.get(owner, 0) + 1
        self.in_use += 1

    def _wake(self) -> None:
        still: deque[tuple[str, asyncio.Future[None]]] = deque()
        for owner, granted in self.waiting:
            if not granted.done() and self.may_take(owner):
                self._take(owner)
                granted.set_result(None)
            elif not granted.done():
                still.append((owner, granted))
        self.waiting = still
