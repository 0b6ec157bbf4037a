"""A real model worker process and the event loop its client lives on, for the
tests that reach the worker over its socket as the PoP does."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from gpu_worker.client import WorkerClient


class Harness:
    """One event loop on which the worker client lives for the whole module."""

    def __init__(self, sock: str, config: str | None = None) -> None:
        """`config`: the worker's TOML file (None: the default models)."""
        self.loop = asyncio.new_event_loop()
        self.client = WorkerClient.spawning(sock, config)
        self.run(self.client.start())

    def run[T](self, coro: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.run(self.client.close())
        self.loop.close()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
