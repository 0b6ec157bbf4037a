"""`SeenSet`: values seen within a time-to-live, in bounded memory.

Replay protection for Web Bot Auth signatures and single use for proof-of-work
solutions. When it is full of values still alive it refuses new ones (`add`
answers False) rather than forget one that could then be replayed: it fails
closed.
"""

from __future__ import annotations

from collections import OrderedDict


class SeenSet:
    def __init__(self, ttl: float, capacity: int = 100_000) -> None:
        self.ttl = ttl
        self.capacity = capacity
        self._expires: OrderedDict[bytes, float] = OrderedDict()  # insertion = expiry order

    def add(self, value: bytes, now: float) -> bool:
        """Record `value` as seen at `now`: True if it was not seen within the TTL
        and there was room for it, False otherwise."""
        self._expire(now)
        if value in self._expires or len(self._expires) >= self.capacity:
            return False
        self._expires[value] = now + self.ttl
        return True

    def seen(self, value: bytes, now: float) -> bool:
        """Whether `value` was added within the TTL before `now`."""
        expiry = self._expires.get(value)
        return expiry is not None and expiry > now

    def __len__(self) -> int:
        return len(self._expires)

    def _expire(self, now: float) -> None:
        entries = self._expires
        while entries:
            value, expiry = next(iter(entries.items()))
            if expiry > now:
                return
            del entries[value]
