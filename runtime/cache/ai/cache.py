"""`AICache`: the exact and semantic caches of model calls, one per PoP, shared
by the OpenAI API's ``ai_cache`` stage and every function's ``ai`` binding.

A caller asks `lookup(call, policy)` and gets a `Lookup`:

- ``hit-exact``: an entry with the same exact key (`keys.Call.key`), fresh;
- ``hit-semantic``: an entry of the same scope whose query embedding has cosine
  similarity >= the threshold with this one's and that no guard vetoes
  (`guards.veto`);
- ``miss``: the caller calls the model and hands the result to `complete`
  (or calls `abandon` when the call failed);
- ``bypass``: the cache is off, the call is not deterministic (with
  ``deterministic_only``), or the request said ``no-cache``/``bypass`` (its
  answer is still stored, for exact hits) or ``no-store`` (nothing stored).

Single flight: while a miss is being answered, an identical call (same exact
key) waits for it and is served its answer, and so does a call of the same
scope whose query passes the semantic test against the in-flight one's (both
are embedded anyway). If the leader fails, the waiters go on as misses.

`purge(model=..., tenant=...)` drops the entries of a model, a tenant, both or
all. A call in flight that a purge matches stores nothing, and the calls waiting
for it look up again (and lead a model call of their own): its answer was asked
for before the purge, theirs is given after it.

Stale if error: with ``stale_if_error_s``, an entry is kept that long past its
TTL (never a hit then) so that `stale` can answer a miss whose model call failed
(the origin overloaded or down) with it: the exact key's entry, else the nearest
of the scope that passes the semantic test and the guards.

Entries live ``ttl`` seconds on `clock` (lazily removed), at most
``max_entries_per_scope`` per scope (least recently used go first) and at most
``max_scopes`` scopes (the least recently used scope goes with its entries).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgefn_core.errors import EdgefnError
from runtime.cache.ai import guards
from runtime.cache.ai.entry import Embedded, Entry, Result
from runtime.cache.ai.keys import Call
from runtime.cache.ai.semantic import ScopeIndex, as_vector, cosine
from runtime.cache.settings import AICacheOverride, AICacheSettings
from runtime.cache.stats import CacheStats
from runtime.security.settings import merge

log = logging.getLogger("edgefn.cache.ai")

# (model, texts, client: whose fair share of the model worker) -> {"embeddings": ...}
type Embedder = Callable[[str, list[str], str | None], Awaitable[dict[str, Any]]]
FLIGHT_WAIT = 300.0  # seconds a waiter waits for an in-flight identical call at most


@dataclass(frozen=True, slots=True)
class Policy:
    """What one call may do with the cache: the PoP's ``[ai_cache]`` merged with
    a function's ``[cache.ai]`` and the request's own wishes."""

    enabled: bool = True
    semantic: bool = True
    deterministic_only: bool = True
    threshold: float = guards.DEFAULT_THRESHOLD
    ttl: float = 3600.0
    lookup: bool = True  # False: ``no-cache`` / ``x-edgefn-cache: bypass``
    store: bool = True  # False: ``no-store``


class Flight:
    """A miss being answered; others with its key (or a close enough query in its
    scope) wait for its entry (None: it failed)."""

    def __init__(self, call: Call, vector: np.ndarray | None) -> None:
        self.call = call
        self.vector = vector
        self.purged = False  # a purge matched it: its answer is handed on, not stored
        self.done: asyncio.Future[Entry | None] = asyncio.get_running_loop().create_future()

    def end(self, entry: Entry | None) -> None:
        if not self.done.done():
            self.done.set_result(entry)

    async def wait(self) -> Entry | None:
        try:
            return await asyncio.wait_for(asyncio.shield(self.done), FLIGHT_WAIT)
        except TimeoutError:
            return None


@dataclass(slots=True)
class Lookup:
    call: Call
    policy: Policy
    outcome: str  # hit-exact | hit-semantic | miss | bypass
    entry: Entry | None = None  # the entry served (a hit)
    similarity: float | None = None  # a semantic hit's (or the best vetoed candidate's)
    guard: str | None = None  # the guard that vetoed the best candidate
    reason: str | None = None  # why a bypass (off, nondeterministic, no-cache, no-store)
    coalesced: bool = False  # served the answer of a call in flight
    vector: np.ndarray | None = None  # the query's embedding
    embedded: str | None = None  # where `vector` came from: "here" | "given" (another tier's)
    flight: Flight | None = None  # a miss this caller leads: `complete` or `abandon` it

    @property
    def hit(self) -> bool:
        return self.entry is not None


class Scope:
    """One scope's entries (least recently used first) and vectors."""

    __slots__ = ("entries", "flights", "index", "labels")

    def __init__(self) -> None:
        self.entries: OrderedDict[bytes, Entry] = OrderedDict()
        self.index: ScopeIndex | None = None
        self.labels: dict[int, Entry] = {}
        self.flights: list[Flight] = []


class AICache:
    def __init__(self, settings: AICacheSettings, embed: Embedder | None,
                 stats: CacheStats | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`embed(model, texts, client) -> {"embeddings": [...]}`: the worker's embeddings
        (None: exact cache only); `clock`: seconds, for the TTLs."""
        self.settings = settings
        self.embed = embed
        self.stats = stats if stats is not None else CacheStats()
        self.clock = clock
        self.scopes: OrderedDict[bytes, Scope] = OrderedDict()
        self.exact: dict[bytes, Entry] = {}
        self.flights: dict[bytes, Flight] = {}
        self.labels = itertools.count(1)
        self.purges = 0  # how many purges ran: a caller that stores later without a
        # flight (a function's stream, `runtime.bindings.ai`) stores nothing past one

    def policy(self, override: AICacheOverride | None = None, *, lookup: bool = True,
               store: bool = True, ttl: float | None = None) -> Policy:
        s = merge(self.settings, override)
        threshold = guards.DEFAULT_THRESHOLD if s.threshold is None else s.threshold
        return Policy(s.enabled, s.semantic, s.deterministic_only, threshold,
                      s.ttl_seconds if ttl is None else ttl, lookup, store)

    # -- lookup ---------------------------------------------------------------------------
    async def lookup(self, call: Call, policy: Policy, vector: np.ndarray | None = None,
                     client: str | None = None) -> Lookup:
        """What the cache has for `call`. A ``miss`` with a `flight` must be ended
        with `complete` or `abandon`. `vector`: the query's embedding if another tier
        computed it (`runtime.cache.ai.forward`), used instead of embedding it here
        (in `client`'s fair share of the model worker: the caller's)."""
        reason = self._bypass(call, policy)
        if reason is not None:
            return Lookup(call, policy, "bypass", reason=reason)
        found = Lookup(call, policy, "miss")
        embedded = not (policy.semantic and call.scope is not None and self.embed is not None)
        waited: list[Flight] = []
        while True:
            entry = self._fresh(call.key)
            if entry is not None:
                found.outcome, found.entry, found.coalesced = "hit-exact", entry, bool(waited)
                return found
            flight = self.flights.get(call.key)
            if flight is not None and flight not in waited:
                waited.append(flight)  # if it fails, one waiter leads and the others wait again
                await flight.wait()
                continue
            if not embedded:
                embedded = True
                if vector is not None:
                    found.vector, found.embedded = vector, "given"
                    continue
                found.vector = await self._embedding(call.query, client)
                found.embedded = "here" if found.vector is not None else None
                continue  # the exact entry or flight may have come meanwhile
            if found.vector is not None and await self._semantic(found):
                return found
            break
        found.flight = Flight(call, found.vector)
        self.flights.setdefault(call.key, found.flight)
        if call.scope is not None and found.vector is not None:
            self._scope(call.bucket).flights.append(found.flight)
        return found

    def _bypass(self, call: Call, policy: Policy) -> str | None:
        if not policy.enabled:
            return "off"
        if not policy.store:
            return "no-store"
        if policy.deterministic_only and not call.deterministic:
            return "nondeterministic"
        return None if policy.lookup else "no-cache"

    def _fresh(self, key: bytes) -> Entry | None:
        entry = self.exact.get(key)
        if entry is None:
            return None
        now = self.clock()
        if entry.expires <= now:
            if entry.expires + self.settings.stale_if_error_s <= now:
                self._remove(entry)
            return None
        scope = self.scopes.get(entry.call.bucket)
        if scope is not None:
            scope.entries.move_to_end(key)
            self.scopes.move_to_end(entry.call.bucket)
        return entry

    async def _embedding(self, text: str, client: str | None) -> np.ndarray | None:
        assert self.embed is not None
        try:
            out = await self.embed(self.settings.embedding_model, [text], client)
            return as_vector(out["embeddings"][0])
        except (EdgefnError, KeyError, IndexError, TypeError, ValueError) as e:
            log.warning("ai cache: no embedding for a semantic lookup (%s); exact only", e)
            return None

    async def _semantic(self, found: Lookup) -> bool:
        """A semantic hit into `found`, from an entry or (waited for) a flight of
        its scope. Records the similarity and guard of the best refused one."""
        call, vector = found.call, found.vector
        assert call.scope is not None and vector is not None
        scope = self.scopes.get(call.bucket)
        if scope is None:
            return False
        entry = self._nearest(found, scope, lambda e: self._fresh(e.call.key) is e)
        if entry is not None:
            found.outcome, found.entry = "hit-semantic", entry
            self.scopes.move_to_end(call.bucket)
            return True
        return await self._near_flight(found, scope)

    def _nearest(self, found: Lookup, scope: Scope, usable: Callable[[Entry], bool]
                 ) -> Entry | None:
        """The nearest `usable` entry of `scope` at or above the threshold that no
        guard vetoes (its similarity into `found`), or None."""
        if scope.index is None or found.vector is None:
            return None
        for label, sim in scope.index.nearest(found.vector):
            if sim < found.policy.threshold:
                break
            entry = scope.labels.get(label)
            if entry is not None and usable(entry) and self._allowed(found, entry.call, sim):
                found.similarity = sim
                return entry
        return None

    def _allowed(self, found: Lookup, cached: Call, sim: float) -> bool:
        """Whether `cached`'s answer may serve `found` (similar enough): the same
        numbers and operators (`text.formula`), and no guard that vetoes."""
        guard = "formula" if found.call.formula != cached.formula else \
            guards.veto(found.call.said or found.call.query, cached.said or cached.query)
        if guard is not None and found.guard is None:
            found.guard, found.similarity = guard, sim
        return guard is None

    async def _near_flight(self, found: Lookup, scope: Scope) -> bool:
        assert found.vector is not None
        for flight in list(scope.flights):
            if flight.vector is None or flight.call.key == found.call.key:
                continue
            sim = cosine(found.vector, flight.vector)
            if sim >= found.policy.threshold and self._allowed(found, flight.call, sim):
                entry = await flight.wait()
                if entry is not None:
                    found.outcome, found.entry, found.similarity = "hit-semantic", entry, sim
                    found.coalesced = True
                    return True
                return False
        return False

    def stale(self, found: Lookup) -> Entry | None:
        """For a miss whose model call failed: an entry past its TTL by less than
        ``stale_if_error_s`` (or a fresh one stored meanwhile) for `found`'s call:
        its exact key's, else the nearest of its scope that passes the semantic test
        and the guards. Sets `found`'s outcome to ``stale``; None when there is none."""
        window = self.settings.stale_if_error_s
        if not window or found.outcome != "miss":
            return None
        deadline = self.clock() - window  # an entry that expired after this may serve
        entry = self.exact.get(found.call.key)
        scope = self.scopes.get(found.call.bucket)
        if (entry is None or entry.expires <= deadline) and scope is not None:
            entry = self._nearest(found, scope, lambda e: e.expires > deadline)
        if entry is not None:
            found.outcome, found.entry = "stale", entry
        return entry

    # -- store ----------------------------------------------------------------------------
    def complete(self, found: Lookup, result: Result, origin_ms: float) -> Entry | None:
        """Store the answer to a miss or a ``no-cache`` bypass, and hand it to the
        calls waiting for it. Returns the entry (None if nothing may be stored)."""
        p = found.policy
        if found.hit or not p.enabled or not p.store or found.reason == "nondeterministic":
            self.abandon(found)
            return None
        call = found.call
        entry = Entry("aic-" + secrets.token_hex(8), call, result, time.time(),
                      self.clock() + p.ttl, round(origin_ms, 3))
        if found.flight is not None and found.flight.purged:
            self.abandon(found)  # asked for before a purge: its waiters ask again
            return None
        old = self.exact.get(call.key)
        if old is not None:
            self._remove(old)
        scope = self._scope(call.bucket)
        scope.entries[call.key] = entry
        self.exact[call.key] = entry
        if found.vector is not None and call.scope is not None:
            self._index(scope, entry, found.vector)
        while len(scope.entries) > self.settings.max_entries_per_scope:
            self._remove(next(iter(scope.entries.values())))
        self._end(found, entry)
        return entry

    def abandon(self, found: Lookup) -> None:
        """The call `found` led failed: its waiters go on as misses."""
        self._end(found, None)

    def _end(self, found: Lookup, entry: Entry | None) -> None:
        flight, found.flight = found.flight, None
        if flight is None:
            return
        if self.flights.get(flight.call.key) is flight:
            del self.flights[flight.call.key]
        scope = self.scopes.get(flight.call.bucket)
        if scope is not None and flight in scope.flights:
            scope.flights.remove(flight)
        flight.end(entry)

    def _index(self, scope: Scope, entry: Entry, vector: np.ndarray) -> None:
        if scope.index is None:
            scope.index = ScopeIndex(vector.shape[0])
        label = next(self.labels)
        try:
            scope.index.add(label, vector)
        except ValueError as e:  # the embedding model changed dimension
            log.warning("ai cache: entry %s not indexed: %s", entry.id, e)
            return
        entry.label = label
        scope.labels[label] = entry

    def _scope(self, bucket: bytes) -> Scope:
        scope = self.scopes.get(bucket)
        if scope is None:
            scope = self.scopes[bucket] = Scope()
            while len(self.scopes) > self.settings.max_scopes:
                self._drop(next(iter(self.scopes)))
        self.scopes.move_to_end(bucket)
        return scope

    def _drop(self, bucket: bytes) -> None:
        scope = self.scopes.pop(bucket)
        for key in scope.entries:
            self.exact.pop(key, None)

    def _remove(self, entry: Entry) -> None:
        key = entry.call.key
        if self.exact.get(key) is entry:
            del self.exact[key]
        scope = self.scopes.get(entry.call.bucket)
        if scope is None:
            return
        if scope.entries.get(key) is entry:
            del scope.entries[key]
        if entry.label is not None and scope.labels.pop(entry.label, None) is not None:
            assert scope.index is not None
            scope.index.remove(entry.label)

    # -- purges ---------------------------------------------------------------------------
    def purge(self, *, model: str | None = None, tenant: str | None = None) -> int:
        """Drop every entry of `model` (a LoRA adapter is its own model) and of
        `tenant` ("" is the anonymous caller); None matches any, so both None
        drops everything. Calls in flight that match store nothing. Returns how
        many entries went."""
        def matches(call: Call) -> bool:
            return (model is None or call.model == model) and \
                (tenant is None or call.tenant == tenant)

        self.purges += 1
        gone = [e for e in entries(self) if matches(e.call)]
        for entry in gone:
            self._remove(entry)
        flying = {*self.flights.values(), *(f for sc in self.scopes.values() for f in sc.flights)}
        for flight in [f for f in flying if matches(f.call)]:
            self._forget(flight)
        for bucket in [b for b, sc in self.scopes.items() if not sc.entries and not sc.flights]:
            del self.scopes[bucket]
        return len(gone)

    def _forget(self, flight: Flight) -> None:
        """New calls no longer join `flight`; its answer will not be stored."""
        flight.purged = True
        if self.flights.get(flight.call.key) is flight:
            del self.flights[flight.call.key]
        scope = self.scopes.get(flight.call.bucket)
        if scope is not None and flight in scope.flights:
            scope.flights.remove(flight)

    # -- accounting -----------------------------------------------------------------------
    def account(self, found: Lookup, function: str = "") -> dict[str, Any]:
        """Count `found` in the PoP's `CacheStats` and return the decision record
        for ``ctx.decide("ai_cache", ...)``."""
        entry = found.entry
        nbytes = entry.result.nbytes if entry is not None else 0
        saved = entry.origin_ms if entry is not None else 0.0
        self.stats.record("ai", found.outcome, function=function, model=found.call.model,
                          tenant=found.call.tenant, nbytes=nbytes, saved_ms=saved)
        return _record(found)

    def account_stale(self, found: Lookup, function: str = "") -> dict[str, Any]:
        """Count a miss answered stale (`stale`) as such, and return its decision
        record (the miss's, now ``stale``, with the entry and its age past expiry)."""
        entry = found.entry
        assert entry is not None and found.outcome == "stale"
        self.stats.reclassify("ai", "miss", "stale", function=function, model=found.call.model,
                              tenant=found.call.tenant, nbytes=entry.result.nbytes,
                              saved_ms=entry.origin_ms)
        return {**_record(found),
                "expired_s": round(max(0.0, self.clock() - entry.expires), 3)}

    def __len__(self) -> int:
        return len(self.exact)


def _record(found: Lookup) -> dict[str, Any]:
    """The decision record of `found` for ``ctx.decide("ai_cache", ...)``."""
    entry = found.entry
    record: dict[str, Any] = {"outcome": found.outcome,
                              "bytes": entry.result.nbytes if entry is not None else 0,
                              "saved_ms": entry.origin_ms if entry is not None else 0.0}
    if found.similarity is not None:
        record["similarity"] = round(found.similarity, 4)
    for name in ("guard", "reason"):
        if getattr(found, name) is not None:
            record[name] = getattr(found, name)
    if entry is not None:
        record["entry"] = entry.id
        r = entry.result  # the prompt tokens the hit did not send to the model
        record["cached_tokens"] = r.tokens if isinstance(r, Embedded) else r.prompt_tokens
    if found.coalesced:
        record["coalesced"] = True
    if found.embedded == "given":
        record["embedding"] = "given"  # by the tier below (`runtime.cache.ai.forward`)
    return record


def entries(cache: AICache) -> list[Entry]:
    """Every entry, for tests and stats."""
    return [e for s in cache.scopes.values() for e in s.entries.values()]

