"""`JsonlSink`: events appended to a rotating JSONL file (`[events] file`,
`max_bytes`, `backups`): ``events.jsonl``, then ``events.jsonl.1`` .. ``.N``.

The PoP's loop only collects events; every `FLUSH_SECONDS` the batch goes to a
writer thread, which encodes it (one call) and writes it, so a slow disk never
stalls requests. Handing over per loop iteration instead cost 25 µs a request
(thread wake-ups and GIL hand-offs for batches of a few events;
bench/bench_events.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
from pathlib import Path
from typing import IO

import msgspec

from runtime.observe.event import Event

log = logging.getLogger("edgefn.events")
_STOP: list[Event] = []  # the writer thread's end marker (compared by identity)
FLUSH_SECONDS = 0.1


class JsonlSink:
    """An `Observer`; `close()` writes what is pending and stops the thread."""

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        """Raises OSError if `path` cannot be opened for appending."""
        self.path, self.max_bytes, self.backups = path, max_bytes, backups
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file: IO[bytes] = _private(path, append=True)  # closed by close()
        self.size = self.file.tell()
        self.pending: list[Event] = []
        self.batches: queue.SimpleQueue[list[Event]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="edgefn-events-sink", daemon=True)
        self.thread.start()
        self.closed = False

    def observe(self, event: Event) -> None:
        if not event.sampled or self.closed:
            return
        if not self.pending:
            try:
                asyncio.get_running_loop().call_later(FLUSH_SECONDS, self.flush)
            except RuntimeError:  # no loop (a direct call): hand over at once
                self.pending.append(event)
                self.flush()
                return
        self.pending.append(event)

    def flush(self) -> None:
        """Hand the collected events to the writer thread."""
        if self.pending:
            batch, self.pending = self.pending, []
            self.batches.put(batch)

    def close(self) -> None:
        """Write everything observed so far, then stop. Idempotent."""
        if self.closed:
            return
        self.flush()
        self.closed = True
        self.batches.put(_STOP)
        self.thread.join(10)
        self.file.close()

    def _run(self) -> None:
        encoder = msgspec.json.Encoder()
        while (batch := self.batches.get()) is not _STOP:
            data = encoder.encode_lines(batch)  # one C call for the whole batch
            try:
                self._write(data)
            except OSError as e:  # a full disk: lose this batch, keep serving
                log.error("events file %s: %s", self.path, e)

    def _write(self, data: bytes) -> None:
        if self.size and self.size + len(data) > self.max_bytes:
            self._rotate()
        self.file.write(data)
        self.file.flush()
        self.size += len(data)

    def _rotate(self) -> None:
        """events.jsonl -> .1 -> .2 ... (the oldest beyond `backups` is removed)."""
        self.file.close()
        for i in range(self.backups - 1, 0, -1):
            older = Path(f"{self.path}.{i}")
            if older.exists():
                os.replace(older, f"{self.path}.{i + 1}")
        if self.backups:
            os.replace(self.path, f"{self.path}.1")
        self.file = _private(self.path, append=False)
        self.size = 0


def _private(path: Path, append: bool) -> IO[bytes]:
    """`path` opened for writing, readable by the PoP's user only (events hold client
    addresses, queries, tenants and key ids; a file an older edgefn made 0644 too).
    Raises OSError."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        return os.fdopen(fd, "ab" if append else "wb")
    except BaseException:
        os.close(fd)
        raise
