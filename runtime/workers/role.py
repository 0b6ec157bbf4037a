"""Which of the ``workers = N`` PoP processes this one is."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Role:
    index: int  # 0: the admin worker
    count: int  # N
    data_dir: Path
    ack_timeout: float = 30.0  # seconds a worker has to follow a change before it is killed
    table: str | None = None  # where the shared rate-limit table opens (`native.SharedTable`)

    @property
    def leader(self) -> bool:
        """The admin worker: the one that changes what is deployed."""
        return self.index == 0

    def address(self, index: int) -> str:
        """Worker `index`'s control socket: in the abstract namespace (no file to
        clean up after a SIGKILL, no path-length limit), named after the data dir."""
        return f"\0edgefn-workers-{self._key()}-{index}"

    def events_address(self) -> str:
        """Where the admin worker takes the other workers' events
        (`runtime.workers.events`), in the abstract namespace as `address`."""
        return f"\0edgefn-workers-{self._key()}-events"

    def _key(self) -> str:
        return hashlib.sha256(str(self.data_dir.resolve()).encode()).hexdigest()[:24]
