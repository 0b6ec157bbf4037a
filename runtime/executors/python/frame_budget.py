"""The PoP's memory for Python isolates' large frames while they arrive, owner by owner.

A frame an isolate sends (a whole response, up to its ``limits.max_response_mb``
plus 1 MiB) is held in the PoP until its last byte has come: 32 isolates of one
function allowed 256 MiB responses could hold 8 GiB of a PoP's memory at once, the
kernel's OOM killer then ending the PoP and every tenant with it. A frame of
`COUNTED_FROM` bytes or more therefore counts its size here from its first bytes
until it is whole (or its isolate's socket closes); one that does not fit now waits
with its socket unread (its guest blocks in its send; its wall limit still runs),
and is read on once it fits, in the order they asked.

The budget (`[python] max_frame_memory_mb`: "auto", a quarter of the machine's
memory; with ``workers = N`` each worker process holds 1/N of it) is shared as the
WASM worker threads' memory is (`runtime.executors.wasm.shares`): an owner
(`Manifest.tenant`) counts at most `PER_OWNER` of it, and the last `RESERVE` of it
goes only to owners counting nothing; a frame counts at most an owner's share (a
larger one arrives alone among its owner's). Everything here runs on the loop's
thread.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections import deque
from collections.abc import Callable

COUNTED_FROM = 1 << 20  # smaller frames are not counted (at most this per isolate)
PER_OWNER = 3 / 8
RESERVE = 1 / 5
_total = 0  # `configure`'s; 0: "auto"

Waiter = tuple[str, int, Callable[[], None]]  # owner, bytes counted, called once granted


def auto_bytes() -> int:
    """"auto": a quarter of the machine's memory."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4


def configure(total: int) -> None:
    """The bytes each event loop's budget holds from now on (0: `auto_bytes`); budgets
    made before keep theirs."""
    global _total
    _total = total


class FrameBudget:
    def __init__(self, total: int) -> None:
        """Raises `ValueError` unless `total` > 0."""
        if total <= 0:
            raise ValueError(f"a frame budget of {total} bytes")
        self.total = total
        self.per_owner = int(total * PER_OWNER)
        self.reserve = int(total * RESERVE)
        self.held: dict[str, int] = {}  # bytes each owner's frames count (none: absent)
        self.in_use = 0
        self.waiting: deque[Waiter] = deque()

    def counted(self, size: int) -> int:
        """What a frame of `size` bytes counts."""
        return min(size, self.per_owner)

    def may_take(self, owner: str, n: int) -> bool:
        held = self.held.get(owner, 0)
        used = self.in_use + n
        return held + n <= self.per_owner and (
            used <= self.total - self.reserve or (held == 0 and used <= self.total))

    def ask(self, owner: str, n: int, granted: Callable[[], None]) -> bool:
        """Count `n` bytes (`counted`) for `owner` now (True), or once they fit,
        calling `granted` then (False; `withdraw` takes the wait back). Waiting
        frames are granted in the order asked, each as soon as it fits."""
        if self.may_take(owner, n):
            self._take(owner, n)
            return True
        self.waiting.append((owner, n, granted))
        return False

    def withdraw(self, granted: Callable[[], None]) -> None:
        """Forget the wait `ask` queued with `granted` (its socket closed)."""
        self.waiting = deque(w for w in self.waiting if w[2] != granted)  # (a bound method)
        self._wake()

    def give_back(self, owner: str, n: int) -> None:
        """`owner`'s frame that counted `n` bytes is whole (or gone); waiting frames
        that fit now are granted."""
        left = self.held[owner] - n
        if left:
            self.held[owner] = left
        else:
            del self.held[owner]
        self.in_use -= n
        self._wake()

    def _take(self, owner: str, n: int) -> None:
        self.held[owner] = self.held.get(owner, 0) + n
        self.in_use += n

    def _wake(self) -> None:
        """Grant, in order, each waiting frame that fits now (one owner at its share
        does not hold back another's behind it)."""
        still: deque[Waiter] = deque()
        granted: list[Callable[[], None]] = []
        for owner, n, call in self.waiting:
            if self.may_take(owner, n):
                self._take(owner, n)
                granted.append(call)
            else:
                still.append((owner, n, call))
        self.waiting = still
        for call in granted:
            call()


_budgets: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FrameBudget] = \
    weakref.WeakKeyDictionary()


def budget_of(loop: asyncio.AbstractEventLoop) -> FrameBudget:
    """The loop's budget, made at its first use with the bytes `configure` set."""
    budget = _budgets.get(loop)
    if budget is None:
        budget = _budgets[loop] = FrameBudget(_total or auto_bytes())
    return budget
