"""The WASM worker threads one event loop's functions share, owner by owner, and the
guest memory those threads' requests may hold together.

Threads: each owner (`Manifest.tenant`) holds at most `per_owner` of the `total`
threads at once, and the last `reserve` of them go only to owners holding none:
caps alone let three owners with functions that block or loop (3 x 6 of 16) hold
every thread, and a fourth owner's request waited out its wall limit. With the
reserve, up to `total - reserve` threads go to whoever asks (owners under their
cap), and then each owner without a thread still gets one, `reserve` such owners at
once.

Memory (`memory_mb`, 0: not bounded): a request on a thread counts its function's
``limits.memory_mb`` (what its guest may grow to) until it ends, and the threads'
requests together count at most `memory_mb` (`[wasm] max_thread_memory_mb`):
twenty requests of functions allowed 1 GiB each could hold 20 GiB of a PoP's
memory, and the kernel's OOM killer then ended the PoP, every tenant with it. It is
shared as the threads are: an owner counts at most `per_owner` / (`total` -
`reserve`) of it, and the same fraction as the threads' reserve is kept for owners
holding none. A request counts at most an owner's share (a function allowed more
than that runs alone among its owner's).

A waiting request takes the first thread it may take, in the order they asked: one
owner at its cap does not hold back another's request behind it. Everything here
runs on the loop's thread (a worker thread gives its thread back through
``loop.call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
from collections import deque

Waiter = tuple[str, int, asyncio.Future[None]]  # owner, MiB, granted


class ThreadShares:
    def __init__(self, total: int, per_owner: int, reserve: int, memory_mb: int = 0) -> None:
        """Raises `ValueError` unless 0 < `per_owner` <= `total` - `reserve`,
        0 <= `reserve` < `total` and `memory_mb` >= 0."""
        if not (0 <= reserve < total and 0 < per_owner <= total - reserve and memory_mb >= 0):
            raise ValueError(f"thread shares: {per_owner} per owner and {reserve} in "
                             f"reserve do not fit {total} threads (or memory_mb "
                             f"{memory_mb} < 0)")
        self.total, self.per_owner, self.reserve = total, per_owner, reserve
        self.memory = memory_mb
        self.memory_per_owner = memory_mb * per_owner // (total - reserve)
        self.memory_reserve = memory_mb * reserve // total
        self.held: dict[str, int] = {}  # threads each owner holds (owners holding none: absent)
        self.in_use = 0
        self.held_mb: dict[str, int] = {}  # MiB each owner's requests count (as `held`)
        self.mb_in_use = 0
        self.waiting: deque[Waiter] = deque()

    def counted(self, mb: int) -> int:
        """The MiB a request of a function allowed `mb` counts (0: memory is not bounded)."""
        return min(mb, self.memory_per_owner) if self.memory else 0

    def may_take(self, owner: str, mb: int = 0) -> bool:
        """Whether `owner` may take a thread now for a request counting `mb` MiB
        (`counted`)."""
        held = self.held.get(owner, 0)
        if not (held < self.per_owner and (self.in_use < self.total - self.reserve
                                           or (held == 0 and self.in_use < self.total))):
            return False
        if not mb:
            return True
        used = self.mb_in_use + mb
        return self.held_mb.get(owner, 0) + mb <= self.memory_per_owner and (
            used <= self.memory - self.memory_reserve or (held == 0 and used <= self.memory))

    async def acquire(self, owner: str, mb: int = 0) -> None:
        """Take one of the threads for `owner`, for a request counting `mb` MiB
        (`counted`), once it may. Cancelled while it waits, it takes none (or
        gives back the one it was just granted)."""
        if self.may_take(owner, mb):
            self._take(owner, mb)
            return
        granted = asyncio.get_running_loop().create_future()
        entry = (owner, mb, granted)
        self.waiting.append(entry)
        try:
            await granted
        except BaseException:
            if granted.done() and not granted.cancelled():  # granted, then cancelled
                self.release(owner, mb)
            elif entry in self.waiting:  # (`_wake` drops a cancelled one it meets)
                self.waiting.remove(entry)
            raise

    def release(self, owner: str, mb: int = 0) -> None:
        """`owner` gives one thread back, and the `mb` MiB its request counted;
        waiting requests that may take one now do."""
        left = self.held[owner] - 1
        if left:
            self.held[owner] = left
        else:
            del self.held[owner]
        self.in_use -= 1
        if mb:
            left = self.held_mb[owner] - mb
            if left:
                self.held_mb[owner] = left
            else:
                del self.held_mb[owner]
            self.mb_in_use -= mb
        if self.waiting:
            self._wake()

    def _take(self, owner: str, mb: int) -> None:
        self.held[owner] = self.held.get(owner, 0) + 1
        self.in_use += 1
        if mb:
            self.held_mb[owner] = self.held_mb.get(owner, 0) + mb
            self.mb_in_use += mb

    def _wake(self) -> None:
        still: deque[Waiter] = deque()
        for owner, mb, granted in self.waiting:
            if not granted.done() and self.may_take(owner, mb):
                self._take(owner, mb)
                granted.set_result(None)
            elif not granted.done():
                still.append((owner, mb, granted))
        self.waiting = still
