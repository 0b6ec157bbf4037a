"""Single flight: while one origin call for a key is in flight, others for the
same key wait for it instead of making their own."""

from __future__ import annotations

import asyncio


class Flights:
    """Origin calls in flight, by key. Runs on one event loop's thread."""

    def __init__(self) -> None:
        self.pending: dict[bytes, asyncio.Future[None]] = {}

    def waiting(self, key: bytes) -> asyncio.Future[None] | None:
        """The flight for `key` to wait for, or None when there is none."""
        return self.pending.get(key)

    def take_off(self, key: bytes) -> None:
        """Start the flight for `key`: the caller makes the origin call and must
        call `land`. Needs a running loop; raises RuntimeError if `key` is flying."""
        if key in self.pending:
            raise RuntimeError(f"a flight for {key!r} is already in progress")
        self.pending[key] = asyncio.get_running_loop().create_future()

    def land(self, key: bytes) -> None:
        """End the flight for `key`: its waiters resume (and look in the cache)."""
        future = self.pending.pop(key, None)
        if future is not None and not future.done():
            future.set_result(None)
