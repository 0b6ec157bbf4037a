"""The PoP's side of the model worker: starts and supervises it (through
`gpu_worker.client`), keeps the LoRA adapters added at run time (persisted in
DATA/ai/loras.json and registered again whenever the worker restarts), and
is what the ``ai`` binding (`runtime.bindings.ai`) and the OpenAI API call.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import msgspec

from edgefn_core.errors import WorkerError
from gpu_worker.client import WorkerClient

log = logging.getLogger("edgefn.ai")
# a model call's failures that say its origin is down, overloaded or silent, not that
# the call was refused: what a fallback ([ai] fallback, a stale cache entry) answers
ORIGIN_DOWN = frozenset({"worker_unavailable", "overloaded", "upstream_unavailable",
                         "upstream_error", "timeout"})


class Lora(msgspec.Struct):
    name: str
    path: str
    base: str | None = None
    scale: float = 1.0


class AIService:
    """One model worker for the PoP."""

    def __init__(self, data_dir: Path, config: str | None = None, socket: str | None = None,
                 fallback: dict[str, str] | None = None) -> None:
        """`fallback`: ``[ai] fallback``, the model that answers for another when that
        one's origin fails (`ORIGIN_DOWN`), for the OpenAI API and the ``ai`` binding."""
        self.fallback = fallback or {}
        self.dir = data_dir / "ai"
        self.dir.mkdir(parents=True, exist_ok=True)
        path = socket or str(self.dir / "worker.sock")
        self.client = WorkerClient.spawning(path, config) if socket is None else \
            WorkerClient(path)
        self.client.on_connect = self._registered_again
        self.loras_file = self.dir / "loras.json"
        self.loras: list[Lora] = []
        if self.loras_file.exists():
            self.loras = msgspec.json.decode(self.loras_file.read_bytes(), type=list[Lora])
        self.loop: asyncio.AbstractEventLoop | None = None  # the PoP's, once started
        # bumped when the worker's models change (an adapter added or removed, here or
        # by another PoP worker: `models_changed`): a listing made before is stale
        self.models_version = 0

    async def start(self, wait: bool = True) -> None:
        """Start the worker. With `wait`, raises `WorkerDead` if it does not come up."""
        self.loop = asyncio.get_running_loop()
        await self.client.start(wait)

    async def close(self) -> None:
        await self.client.close()

    # -- LoRA -----------------------------------------------------------------------------
    async def add_lora(self, name: str, path: str, base: str | None = None,
                       scale: float = 1.0) -> dict[str, Any]:
        """Register an adapter now and after every restart. Raises `WorkerError`."""
        path = str(Path(path).resolve())
        info = await self.client.add_lora(name, path, base, scale)
        self.models_changed()
        # (one registered before under the name did not load after a restart: replaced)
        self.loras = [lo for lo in self.loras if lo.name != name]
        self.loras.append(Lora(name, path, base, scale))
        self._save()
        return info

    async def remove_lora(self, name: str) -> dict[str, Any]:
        """Stop serving adapter `name`, now and after restarts; one registered that
        no longer loads (its file gone) is forgotten. Raises `WorkerError` (404 for
        an unknown model, 400 for a base model)."""
        try:
            info = await self.client.remove_lora(name)
        except WorkerError as e:
            if e.status != 404 or not any(lo.name == name for lo in self.loras):
                raise
            info = {"removed": name}  # the worker never loaded it again
        self.models_changed()
        self.loras = [lo for lo in self.loras if lo.name != name]
        self._save()
        return info

    def models_changed(self) -> None:
        """The worker's models changed (an adapter added or removed under a name):
        what was listed before, fingerprints included, is listed again."""
        self.models_version += 1

    def _save(self) -> None:
        tmp = self.loras_file.with_suffix(".tmp")
        tmp.write_bytes(msgspec.json.encode(self.loras))
        tmp.replace(self.loras_file)

    async def _registered_again(self) -> None:
        self.models_changed()
        for lo in self.loras:
            try:
                await self.client.add_lora(lo.name, lo.path, lo.base, lo.scale, early=True)
            except WorkerError as e:
                log.error("LoRA adapter %s no longer loads: %s", lo.name, e)
