"""The admin API on its own thread and event loop, so a busy public loop never
delays listings, records or KV administration, and the admin listener keeps
accepting whatever functions do.

Which loop runs what (see `AdminApp`):
- the admin loop: HTTP, the token check, reading and unpacking a deploy package,
  listings (`Registry.functions` is replaced whole on every change, never
  mutated, so reading it from another thread is safe), version records, KV and
  vector operations (the stores are thread-safe; they run on worker threads);
- the PoP's loop: whatever changes routing or touches an executor's loop-bound
  state (deploy, rollback, delete: a Python pool attaches to the loop that
  serves it) and the model worker's client (its connection belongs to that
  loop). `AdminApp.on_pop` hands these over and waits for their result.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import uvloop

from runtime.net import Server, ServerConfig


class AdminThread:
    """A `Server` for `app` on a thread of its own; `start()` and `shutdown()` are
    awaited from the PoP's loop."""

    def __init__(self, app: Any, config: ServerConfig) -> None:
        self.server = Server(app, config)
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="edgefn-admin",
                                        daemon=True)

    async def start(self, host: str, port: int, reuse_port: bool = False) -> None:
        """Start the thread and bind (`reuse_port`: see `Server.start`). Raises
        OSError if the address is unavailable (the thread is stopped again then)."""
        self._thread.start()
        try:
            await self._on_admin(self.server.start(host, port, reuse_port))
        except BaseException:
            await self._stop_thread()
            raise

    @property
    def address(self) -> tuple[str, int]:
        return self.server.address

    async def shutdown(self, grace: float = 1.0) -> None:
        """Let in-flight admin requests finish for `grace` seconds, then stop the thread."""
        if not self._thread.is_alive():
            return
        try:
            await self._on_admin(self.server.shutdown(grace))
        finally:
            await self._stop_thread()

    async def _on_admin(self, coro: Any) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def _stop_thread(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self._thread.join)
        self.loop.close()
