"""Bindings: what a function may reach outside itself (KV namespaces, vector
indexes), checked against what its manifest declares. One `Bindings` per
deployed version; the WASM host functions and the Python host-call channel both
go through `call`, so both runtimes get the same API and the same denials.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

from gpu_worker.client import WorkerError
from kv import KVError, KVStore
from kv.vectors import VectorStore

from .ai import AIService
from .manifest import Manifest

AI_TIMEOUT = 300.0


class BindingError(Exception):
    """A call the function may not make, or one that failed; the message is for it."""


class Stores:
    """The PoP's KV store and vector store, opened lazily in the data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._kv: KVStore | None = None
        self._vectors: VectorStore | None = None
        self.ai: AIService | None = None  # set when the PoP runs a model worker
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def kv(self) -> KVStore:
        if self._kv is None:
            self._kv = KVStore(self.data_dir / "kv")
        return self._kv

    @property
    def vectors(self) -> VectorStore:
        if self._vectors is None:
            self._vectors = VectorStore(self.data_dir / "vectors")
        return self._vectors

    def prepare(self, m: Manifest) -> None:
        """Create the namespaces a manifest declares (indexes are created explicitly,
        since they need a dimension)."""
        for ns in m.bindings.kv:
            self.kv.create_namespace(ns)

    def purge_expired(self) -> int:
        """Delete expired KV keys, if the KV store was ever opened."""
        return self._kv.purge_expired() if self._kv is not None else 0

    def close(self) -> None:
        if self._kv is not None:
            self._kv.close()
        if self._vectors is not None:
            self._vectors.close()


class Bindings:
    def __init__(self, stores: Stores, manifest: Manifest | None) -> None:
        """`manifest` None: the operator's access (admin API, CLI), allowed everywhere."""
        self.stores = stores
        self.name = manifest.name if manifest else "<admin>"
        self.admin = manifest is None
        self.kv_allowed = frozenset(manifest.bindings.kv if manifest else ())
        self.vectors_allowed = frozenset(manifest.bindings.vectors if manifest else ())
        self.ai_allowed = manifest.bindings.ai if manifest else True

    def call(self, name: str, args: dict[str, Any]) -> Any:
        """Run binding `name` ("kv.get", "vectors.query", ...) with JSON-ish args.

        Raises `BindingError` for an undeclared namespace or index, an unknown
        call, or a store error (its message names what was wrong).
        """
        kind, _, op = name.partition(".")
        if kind == "ai":
            return self._ai(op, args)
        try:
            if kind == "kv":
                return self._kv(op, args)
            if kind == "vectors":
                return self._vectors(op, args)
        except KVError as e:
            raise BindingError(str(e)) from None
        except (KeyError, TypeError, ValueError) as e:
            raise BindingError(f"bad arguments to {name}: {e}") from None
        raise BindingError(f"unknown binding {name!r}")

    def _ai(self, op: str, args: dict[str, Any]) -> Any:
        """On the event loop's thread, a coroutine (the caller awaits it); on any
        other thread (a WASM guest), the result, waited for. Raises `BindingError`."""
        if not self.ai_allowed:
            raise BindingError(f"function {self.name!r} did not declare the AI binding "
                               "(add `ai = true` to [bindings] in edgefn.toml)")
        ai, loop = self.stores.ai, self.stores.loop
        if ai is None or loop is None:
            raise BindingError("this PoP runs no model worker (start it without --no-ai)")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            return self._ai_call(ai, op, args)
        if running is not None:
            raise BindingError("AI bindings cannot be called from this thread")
        future = asyncio.run_coroutine_threadsafe(self._ai_call(ai, op, args), loop)
        return future.result(AI_TIMEOUT)

    @staticmethod
    async def _ai_call(ai: AIService, op: str, args: dict[str, Any]) -> Any:
        try:
            return await ai.binding(op, args)
        except WorkerError as e:
            raise BindingError(f"ai.{op}: {e}") from None
        except (KeyError, TypeError, ValueError) as e:
            raise BindingError(f"bad arguments to ai.{op}: {e!r}") from None

    def _kv(self, op: str, a: dict[str, Any]) -> Any:
        ns = a["namespace"]
        if self.admin and op == "create":
            self.stores.kv.create_namespace(ns)
            return None
        if ns not in self.kv_allowed and not self.admin:
            raise BindingError(f"function {self.name!r} did not declare KV namespace {ns!r} "
                               "(add it to [bindings] kv in edgefn.toml)")
        kv = self.stores.kv
        key = a["key"].encode() if "key" in a else b""
        if op == "get":
            entry = kv.get_entry(ns, key)
            if entry is None:
                return None
            return {"value": _b64(entry.value), "metadata": entry.metadata,
                    "version": entry.version, "expires_at": entry.expires_at}
        if op == "put":
            return kv.put(ns, key, _unb64(a["value"]), ttl=a.get("ttl"),
                          metadata=a.get("metadata"))
        if op == "delete":
            return kv.delete(ns, key)
        if op == "increment":
            return kv.increment(ns, key, int(a.get("delta", 1)))
        if op == "cas":
            return kv.cas(ns, key, a.get("expected_version"), _unb64(a["value"]),
                          ttl=a.get("ttl"), metadata=a.get("metadata"))
        if op == "list":
            page = kv.list(ns, a.get("prefix", "").encode(), a.get("cursor"),
                           int(a.get("limit", 100)))
            return {"keys": [{"key": k.key.decode("utf-8", "replace"), "metadata": k.metadata,
                              "expires_at": k.expires_at} for k in page.keys],
                    "cursor": page.cursor}
        raise BindingError(f"unknown KV operation {op!r}")

    def _vectors(self, op: str, a: dict[str, Any]) -> Any:
        index = a["index"]
        if self.admin and op in ("create", "stats"):
            if op == "stats":
                return self.stores.vectors.stats(index)
            config = self.stores.vectors.create(index, int(a["dim"]), a.get("metric", "cos"),
                                                a.get("dtype", "f32"))
            return config.__dict__
        if index not in self.vectors_allowed and not self.admin:
            raise BindingError(f"function {self.name!r} did not declare vector index {index!r} "
                               "(add it to [bindings] vectors in edgefn.toml)")
        vs = self.stores.vectors
        if op == "query":
            matches = vs.query(index, a["vector"], int(a.get("k", 10)), a.get("filter"))
            return [{"id": m.id, "distance": m.distance, "metadata": m.metadata}
                    for m in matches]
        if op == "upsert":
            items = a["items"]
            if items and index not in vs.names():  # first write: the dimension is known now
                vs.create(index, len(items[0]["vector"]))
            return vs.upsert(index, [(i["id"], i["vector"], i.get("metadata")) for i in items])
        if op == "delete":
            return vs.delete(index, a["ids"])
        raise BindingError(f"unknown vectors operation {op!r}")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode(), validate=True)
