"""`Catalog`: the worker's models as the OpenAI API shows them, with what must
stay stable between calls: each model's ``created`` (its weights file's mtime
where the engine reports one, else when this PoP first saw it) and its
``system_fingerprint`` (a hash of the model's build: its engine and reported
details -- weights file name, size and mtime, context -- a LoRA adapter's file
and its base model's build, llama-cpp-python's and edgefn's versions). Same
fingerprint and same ``seed``: same output."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

import msgspec

from gpu_worker.client import WorkerClient

TTL = 5.0  # seconds a listing is reused (an adapter the worker loaded otherwise shows within this)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "none"


BUILD = (_version("edgefn"), _version("llama_cpp_python"))


def fingerprint(model: dict[str, Any], parent: dict[str, Any] | None = None) -> str:
    """``fp_`` and 10 hex digits of what makes `model` answer as it does."""
    build = [model.get("engine"), model.get("details") or {},
             parent.get("details") if parent else None, BUILD]
    return "fp_" + hashlib.blake2b(msgspec.json.encode(build, order="sorted"),
                                   digest_size=5).hexdigest()


class Catalog:
    """The worker's models: listed fresh, looked up (per generation, for its
    fingerprint) from a copy at most `TTL` seconds old and made since the last
    change `version` counts (`AIService.models_version`: an adapter added or
    removed through the PoP, whose answers kept the old one's fingerprint for up to
    `TTL`, and cached, for the cache's TTL)."""

    def __init__(self, client: WorkerClient, version: Callable[[], int] = lambda: 0) -> None:
        self.client = client
        self.version = version
        self.seen = -1  # the version the copy was made at
        self.first_seen: dict[str, int] = {}
        self.models: dict[str, dict[str, Any]] = {}
        self.fetched = -TTL

    async def listing(self) -> list[dict[str, Any]]:
        """Every model with ``created`` and ``fingerprint``, asked of the worker now
        (``GET /v1/models`` must show an adapter added a moment ago). Raises
        `WorkerError`."""
        await self._fetch()
        return list(self.models.values())

    async def get(self, model: str) -> dict[str, Any] | None:
        """`model`'s entry (fetched again once if unknown), or None. Raises `WorkerError`."""
        if model not in self.models or time.monotonic() - self.fetched >= TTL \
                or self.seen != self.version():
            await self._fetch()
        return self.models.get(model)

    async def _fetch(self) -> None:
        seen = self.version()
        found = {m["id"]: m for m in await self.client.models()}
        now = int(time.time())
        for m in found.values():
            parent = found.get(m.get("parent") or "")
            mtime = (m.get("details") or {}).get("mtime")
            m["created"] = mtime if isinstance(mtime, int) else self.first_seen.setdefault(
                m["id"], now)
            m["fingerprint"] = fingerprint(m, parent)
        self.models, self.fetched, self.seen = found, time.monotonic(), seen
