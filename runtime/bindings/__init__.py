"""Bindings: what a function may reach outside itself, as capabilities.

A deployment's `Bindings` is prepared once from its manifest: one capability per
kind (`KVBinding`, `VectorsBinding`, `AIBinding`, `FetchBinding`), each checking in one place
the namespaces or indexes it declared; anything it did not declare is denied.
The WASM host functions and the Python host-call channel both go through
`Bindings.call`, so both runtimes get the same API and the same denials. The
operator's access (admin API, CLI) goes through `operate`, not this path.

Blocking work (a synced KV write, a KV list, a vector query or index write,
which may save the index) asked for on the event loop's thread comes back as an
awaitable run on one of its owner's threads (`runtime.bindings.threads`: no owner
queues behind another's backlog); on any other thread (a WASM guest) it runs in
place.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb

from edgefn_core.errors import BindingError, Failure, StoreError
from kv import KVStore
from kv.vectors import VectorStore
from runtime.ai.egress import Egress
from runtime.ai.service import AIService
from runtime.bindings import kv as kv_binding
from runtime.bindings import stop as stopping
from runtime.bindings import vectors as vectors_binding
from runtime.bindings.ai import AIBinding
from runtime.bindings.codec import json_kind
from runtime.bindings.fetch import LOOP_ARG, FetchBinding, Lineage, Subrequests
from runtime.bindings.owners import Owners
from runtime.bindings.threads import PER_OWNER, OwnerThreads
from runtime.cache.ai.cache import AICache
from runtime.cache.settings import AICacheSettings
from runtime.cache.stats import CacheStats
from runtime.functions.manifest import Manifest
from runtime.observe.traceparent import parse
from runtime.security.ratelimit.admission import TokenBudgets
from runtime.security.residency import ResidencySettings

AI_TIMEOUT = 300.0


class Stores:
    """The PoP's KV store and vector store (opened lazily in the data dir), who owns
    their namespaces and indexes, and its model worker service, if it runs one."""

    def __init__(self, data_dir: Path, ai: AIService | None = None,
                 budgets: TokenBudgets | None = None,
                 ai_cache: AICacheSettings | None = None,
                 residency: ResidencySettings | None = None, pop: str = "",
                 binding_threads: int = PER_OWNER) -> None:
        """`budgets`: what functions' ``ai`` calls are charged to (their tenant's
        token budget and stream cap); None: not limited. `ai_cache`: the AI
        caches' settings (with `ai`, one `AICache` for the OpenAI API's
        ``ai_cache`` stage and every function's ``ai`` binding). `residency`
        (on PoP `pop`): where a pinned tenant's model calls may go (`egress`).
        `binding_threads`: the threads each owner's blocking binding calls run on
        (`threads`). Raises `ValueError` if it is below 1."""
        self.data_dir = data_dir
        self.egress = Egress(residency or ResidencySettings(), pop)
        self.ai = ai
        self.budgets = budgets
        self._kv: KVStore | None = None
        self._vectors: VectorStore | None = None
        self._owners: Owners | None = None
        # bytes the KV namespaces of one owner may hold together through functions'
        # writes (0: no quota; the operator's tools are not held to it)
        self.kv_quota = 0
        self.vectors_quota = 0  # the same for the vectors of one owner's indexes
        self._opening = threading.Lock()  # the stores are opened lazily, from any thread
        self.threads = OwnerThreads(binding_threads)  # functions' blocking calls, per owner
        self.cache_stats = CacheStats()  # what the HTTP and AI caches decided
        self.subrequests = Subrequests()  # fetches per request tree, every function's
        # the hosts fetch may reach at a private address (`[fetch] private_hosts`)
        self.private_hosts: tuple[tuple[str, int | None], ...] = (("*", None),)
        self.ai_cache: AICache | None = None
        if ai is not None:
            self.ai_cache = AICache(ai_cache or AICacheSettings(), _embedder(ai),
                                    self.cache_stats)

    @property
    def owners(self) -> Owners:
        if self._owners is None:
            self._owners = Owners(self.data_dir / "owners.json")
        return self._owners

    def new_namespaces(self, m: Manifest) -> list[str]:
        """Create those of `m`'s KV namespaces that do not exist yet, so that its
        warm-up, which runs before the deploy commits, finds them: the ones
        created (a failed deploy removes them). Raises `InvalidValue`."""
        have = set(self.kv.namespaces())
        made = [ns for ns in m.bindings.kv if ns not in have]
        for ns in made:
            self.kv.create_namespace(ns)
        return made

    def claim(self, m: Manifest) -> None:
        """Create `m`'s KV namespaces and claim what it binds for its owner (see
        `Owners.commit`). Raises `OSError` if the claims cannot be saved."""
        for ns in m.bindings.kv:
            self.kv.create_namespace(ns)
        self.owners.commit(m)

    @property
    def kv(self) -> KVStore:
        """Opened at first use, once: WASM host calls and off-loop writes reach here
        from several threads (two opening it raced: "already open in this process")."""
        if self._kv is None:
            with self._opening:
                if self._kv is None:
                    self._kv = KVStore(self.data_dir / "kv")
        return self._kv

    @property
    def vectors(self) -> VectorStore:
        if self._vectors is None:
            with self._opening:
                if self._vectors is None:
                    self._vectors = VectorStore(self.data_dir / "vectors")
        return self._vectors

    def purge_expired(self, stop: Callable[[], bool] | None = None) -> int:
        """Delete expired KV keys, if the KV store was ever opened, in batches
        (`KVStore.purge_expired`, which ends early once `stop()` is true). First free the
        LMDB reader slots of processes that died inside a read (an isolate host killed
        while reading in place, ``EDGEFN_PYTHON_KV=local``): LMDB keeps them, and the
        old pages they pin, until asked. Blocking: run it off the event loop. Raises
        `lmdb.Error` or `StoreClosed` on a closed store."""
        if self._kv is None:
            return 0
        self._kv.env.reader_check()
        return self._kv.purge_expired(stop=stop)

    def close(self) -> None:
        """Wait for the bindings' calls running on threads (dropping those not
        started), then close the stores."""
        self.threads.close()
        if self._kv is not None:
            self._kv.close()
        if self._vectors is not None:
            self._vectors.close()


class Bindings:
    """The capabilities of one deployed version."""

    def __init__(self, owner: str, kv: kv_binding.KVBinding,
                 vectors: vectors_binding.VectorsBinding, ai: AIBinding | None = None,
                 ai_denied: str = "", fetch: FetchBinding | None = None) -> None:
        self.owner = owner
        self.kv = kv
        self.vectors = vectors
        self.ai = ai
        self.fetch = fetch or FetchBinding(owner, [], 0)
        self.ai_denied = ai_denied or (f"function {owner!r} did not declare the AI binding "
                                       "(add `ai = true` to [bindings] in edgefn.toml)")

    @classmethod
    def prepare(cls, stores: Stores, m: Manifest, create: bool = True) -> Bindings:
        """The capabilities `m` declares, checked against their owners on every call.
        With `create`, creates its KV namespaces now (a deploy creates them when it
        commits, `Stores.claim`; indexes are created on first write or explicitly,
        since they need a dimension); without, opens the handles of those that exist
        (`KVStore.open_known`). Blocking."""
        b = m.bindings
        if create:
            for ns in b.kv:
                stores.kv.create_namespace(ns)
        else:  # a stored version (a worker following a deploy): its handles, now
            stores.kv.open_known(b.kv)
        kv = kv_binding.KVBinding(stores, m.name, frozenset(b.kv), m.tenant)
        vectors = vectors_binding.VectorsBinding(stores, m.name, frozenset(b.vectors), m.tenant)
        ai = None
        denied = ""
        if b.ai and stores.ai is not None:
            ai = AIBinding(stores.ai, m.name, m.tenant, stores.budgets, stores.ai_cache,
                           m.cache.ai, stores.egress)
        elif b.ai:
            denied = "this PoP runs no model worker (start it without --no-ai)"
        fetch = FetchBinding(m.name, list(b.fetch), m.limits.wall_ms, stores.subrequests,
                             (stores.threads, m.tenant), stores.private_hosts)
        return cls(m.name, kv, vectors, ai, denied, fetch)

    def call(self, name: str, args: dict[str, Any], caller: str | None = None,
             raw: bool = False) -> Any:
        """Run binding `name` ("kv.get", "vectors.query", "ai.chat", ...) for a
        request of `caller` (its principal's tenant, set by the executor, never by
        the guest: a pinned caller's model calls keep to its region); `raw`: a KV
        value read comes as bytes, not base64 (a Python isolate's, sent raw).

        Returns the result, or an awaitable of it (see the module docstring).
        Raises `BindingError` for an undeclared kind, namespace or index, an
        unknown call, bad arguments, or a store error (its message says which).
        """
        kind, _, op = name.partition(".")
        if not isinstance(args, dict):  # a WASM guest's JSON: `[1, 2]` met list indexing
            raise BindingError(f"arguments to {name} must be a JSON object, got "
                               f"{json_kind(args)}")
        if name == "kv.readable":  # a Python host that reads KV in place asks what it may
            return self.kv.readable()
        if kind == "ai":
            return self._ai(op, args, _trace_of(args), caller)
        if name == "fetch":
            lineage = args.pop(LOOP_ARG, None)
            return self._fetch(args, _trace_of(args),
                               lineage if isinstance(lineage, Lineage) else None)
        if kind not in ("kv", "vectors"):
            raise BindingError(f"unknown binding {name!r}")
        capability: Any = self.kv if kind == "kv" else self.vectors
        # writes wait for fsync; a KV list or a vector query can take milliseconds
        # (expired keys read past; a large k, a filter); a KV read of a namespace whose
        # handle this process has not opened yet (another process created it since)
        # opens it, which waits for the writer lock: none holds the PoP's loop
        blocking = (op in kv_binding.SLOW or not capability.stores.kv.opened(
            args.get("namespace"))) if kind == "kv" else op in vectors_binding.SLOW
        call = functools.partial(self.kv.call, raw=True) if raw and kind == "kv" \
            else capability.call
        run = functools.partial(_checked, call, name, op, args)
        return off_loop(run, capability.stores.threads, capability.tenant) if blocking else run()

    def _ai(self, op: str, args: dict[str, Any], traceparent: str | None,
            caller: str | None = None) -> Any:
        """On the event loop's thread, a coroutine (the caller awaits it); on any
        other thread (a WASM guest), the result, waited for. Raises `BindingError`."""
        if self.ai is None:
            raise BindingError(self.ai_denied)
        loop = self.ai.service.loop
        if loop is None:
            raise BindingError("the model worker has not started yet")
        call = _ai_checked(self.ai.as_caller(caller), op, args, traceparent)
        if _on_loop(loop):
            return call
        future = asyncio.run_coroutine_threadsafe(call, loop)
        stop = stopping.current.get()
        if stop is not None and not stop.hold(future):  # the request has left already
            raise BindingError(stopping.CANCELLED)
        try:
            return future.result(AI_TIMEOUT)
        except concurrent.futures.CancelledError:  # it left while the call ran: the
            raise BindingError(stopping.CANCELLED) from None  # model stopped for it
        finally:
            if stop is not None:
                stop.release(future)

    def _fetch(self, args: dict[str, Any], traceparent: str | None,
               lineage: Lineage | None = None) -> Any:
        """A coroutine on an event loop's thread; on any other thread (a WASM guest),
        the result, fetched on a loop of that thread's own. Raises `BindingError`."""
        call = _fetch_checked(self.fetch, args, traceparent, lineage)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(call)
        return call

    async def close(self) -> None:
        if self.ai is not None:
            await self.ai.close()


def _embedder(ai: AIService) -> Any:
    """The worker's embeddings, for the semantic cache's lookups."""
    async def embed(model: str, texts: list[str], client: str | None) -> dict[str, Any]:
        return await ai.client.embed(model, texts, client)

    return embed


def operate(stores: Stores, kind: str, target: str, op: str, args: dict[str, Any],
            tenant: str | None = None) -> Any:
    """The admin API's and the CLI's access: any namespace or index, plus
    ``kv.create``, ``vectors.create`` and ``vectors.stats``; a write is held to its
    owner's quota, as a function's is, for a tenant's key (`tenant`: the caller
    checked its access), never for the operator (None). Raises `BindingError` (an
    unknown kind or operation, bad arguments), `StoreError` (`LimitExceeded` past a
    quota), and `Failure` (507 ``store_unwritable``) when LMDB cannot write (a full
    disk or map)."""
    try:
        if kind == "kv":
            quota = None if tenant is None else kv_binding.quota_for(stores, target, tenant)
            return kv_binding.run(stores.kv, op, target, args, quota=quota)
        if kind == "vectors":
            quota = None if tenant is None or op != "upsert" else \
                vectors_binding.quota_for(stores, target, tenant)
            return vectors_binding.run(stores.vectors, op, target, args, quota)
    except (KeyError, TypeError, ValueError) as e:
        raise BindingError(f"bad arguments to {kind}.{op}: {_why(e)}") from None
    except lmdb.Error as e:  # a full disk or map: named, not "internal server error"
        raise Failure("store_unwritable", 507, f"the {kind} store could not do {op}: "
                      f"{e}") from None
    raise BindingError(f"unknown store kind {kind!r}")


def _checked(call: Any, name: str, op: str, args: dict[str, Any]) -> Any:
    try:
        return call(op, args)
    except StoreError as e:
        raise BindingError(str(e)) from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise BindingError(f"bad arguments to {name}: {_why(e)}") from None


def _trace_of(args: dict[str, Any]) -> str | None:
    """The calling request's ``traceparent``, which the executors put under that key
    (the WASM host, or the Python isolate's guest runner from the request it runs):
    removed from `args`, and only if well-formed. A guest could name another span
    there; trace context is not a credential."""
    value = args.pop("traceparent", None)
    if not isinstance(value, str) or parse(value.encode("latin-1", "replace")) is None:
        return None
    return value


async def _ai_checked(ai: AIBinding, op: str, args: dict[str, Any],
                      traceparent: str | None = None) -> Any:
    try:
        return await ai.call(op, args, traceparent)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise BindingError(f"bad arguments to ai.{op}: {_why(e)}") from None


async def _fetch_checked(fetch: FetchBinding, args: dict[str, Any],
                         traceparent: str | None = None, lineage: Lineage | None = None
                         ) -> Any:
    try:
        return await fetch.call(args, traceparent, lineage)
    except (KeyError, TypeError, ValueError) as e:
        raise BindingError(f"bad arguments to fetch: {_why(e)}") from None


def _why(e: Exception) -> str:
    """A bad binding call's reason, for the function: a missing key named, not a
    Python repr."""
    if isinstance(e, KeyError) and e.args:
        return f"missing argument {e.args[0]!r}"
    if isinstance(e, AttributeError) and e.name is not None:  # `{"key": 5}`: 'int' ... encode
        wanted = ("a string" if e.name in _STR_METHODS else
                  "an object" if e.name in ("get", "items", "keys", "values") else
                  "an array" if e.name in ("append", "extend") else "another kind")
        return f"an argument is {json_kind(e.obj)} where {wanted} was expected"
    return str(e) or type(e).__name__


_STR_METHODS = frozenset({"encode", "decode", "lower", "upper", "strip", "startswith",
                          "endswith", "partition", "split", "replace"})


def off_loop(run: Any, threads: OwnerThreads, owner: str) -> Any:
    """`run()` on one of `owner`'s `threads` as an awaitable when called on an event
    loop's thread; else `run()` now. Raises `BindingError` once `threads` is closed."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    return threads.run(owner, run)


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


__all__ = ["Bindings", "Stores", "off_loop", "operate"]
