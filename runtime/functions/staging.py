"""Two-phase deploys and canaries, the part of the `Registry` that rollouts across
PoPs use.

A deploy may be split in two: `stage` does all but the switch (the version is
stored, loaded, warm and its routes checked; it lives in memory, so a restart
forgets it), `activate` switches to it, `abort` drops it. A version activated as
a canary serves a share of request keys beside the live one (`canaries`,
consulted by `runtime.pipeline.targets`); the record keeps it, so a restart
serves it again; a promote, a rollback or any change of the live version ends it.

`Staging` is a mixin of `runtime.functions.registry.Registry`: it uses the
registry's state and its deploy steps, declared below for the type checker.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import msgspec

from edgefn_core.errors import DeployError, Failure, NotFound
from runtime.functions import deploys
from runtime.functions.canary import Split, check_percent
from runtime.functions.deploys import CanaryInfo, Files, VersionInfo
from runtime.functions.registry_core import RegistryCore

if TYPE_CHECKING:
    from runtime.functions.manifest import Manifest
    from runtime.functions.registry import Deployment, DeployResult


class StageResult(msgspec.Struct):
    name: str
    version: str
    previous: str | None  # the live version when it was staged (None: not deployed)
    changed: bool  # False: that version is live already, nothing was staged
    took_ms: float


class Activated(msgspec.Struct):
    name: str
    version: str
    previous: str | None  # the live version before the switch
    canary: float | None  # the share it serves as a canary; None: it is the live version
    changed: bool
    switched_at: float  # time.time() at the switch


class Staged:
    """A version loaded, pre-warmed and activated, that no request is routed to yet."""

    __slots__ = ("action", "created", "fn", "namespaces", "source")

    def __init__(self, fn: Deployment, created: bool, source: str, action: str,
                 namespaces: list[str] | None = None) -> None:
        self.fn = fn
        self.created = created  # its files were written by the stage (an abort removes them)
        self.namespaces = namespaces or []  # KV namespaces it created (an abort removes them)
        self.source = source
        self.action = action  # what the record says when it goes live: deploy | rollback


class Staging(RegistryCore):
    """Stage, activate, abort, promote and the canary split of a `Registry`."""

    if TYPE_CHECKING:  # the registry's state and steps only this mixin uses
        staged: dict[tuple[str, str], Staged]

        async def _checked(self, files: Files, source: str, tenant: str | None
                           ) -> tuple[Manifest, str, str]: ...
        def _undo(self, name: str, version: str, created: bool,
                  cached: frozenset[str], namespaces: list[str]) -> None: ...
        def _commit(self, m: Manifest, version: str, source: str, action: str) -> None: ...
        def _claim(self, m: Manifest) -> None: ...
        def _result(self, fn: Deployment, changed: bool, started: float) -> DeployResult: ...

    # -- two-phase deploys (stage, then activate or abort) and canaries ----------------------
    async def stage(self, files: Files, source: str = "", tenant: str | None = None
                    ) -> StageResult:
        """Do all a deploy does but the switch: validate, check ownership, store,
        compile, pre-warm and check routes; `activate` then switches to it, `abort`
        drops it. Staged versions live in memory: a restart forgets them.

        Raises what `deploy` raises; on error nothing is staged or left behind.
        """
        m, version, label = await self._checked(files, source, tenant)
        started = time.perf_counter()
        async with self.changes:
            done = self._already(m.name, version, started)
            if done is not None:
                return done
            self.stores.owners.check(m, label)
            self._check_tenant_routes(m, label)
            self.stores.kv.check_room(m.bindings.kv)  # before anything is saved
            cached = self.store.cached()
            created = await asyncio.to_thread(self.store.write_version, m.name, version, files)
            made: list[str] = []
            try:
                made = self.stores.new_namespaces(m)  # its warm-up may use them
                fn = await asyncio.to_thread(self._load, m, version)
                self._prepare(fn)
                await self._warm(fn)
            except BaseException:
                await asyncio.to_thread(self._undo, m.name, version, created, cached, made)
                raise
            self.staged[(m.name, version)] = Staged(fn, created, source, "deploy", made)
            return self._staged(m.name, version, True, started)

    async def stage_stored(self, name: str, version: str) -> StageResult:
        """Stage a version stored on this PoP (a rollback in two phases). Raises
        `NotFound` for an unknown function or version, `DeployError` if it no longer
        loads."""
        started = time.perf_counter()
        async with self.changes:
            known = {v.version for v in self.store.record(name).versions}
            if version not in known:
                raise NotFound(f"{name} has no version {version!r}; "
                               f"known: {', '.join(sorted(known))}")
            done = self._already(name, version, started)
            if done is not None:
                return done
            m = await asyncio.to_thread(self._stored, name, version)
            fn = await asyncio.to_thread(self._load, m, version)
            self._prepare(fn)
            await self._warm(fn)
            self.staged[(name, version)] = Staged(fn, False, "", "rollback")
            return self._staged(name, version, True, started)

    def _already(self, name: str, version: str, started: float) -> StageResult | None:
        """The answer to staging a version that is live or staged already, else None."""
        live = self.functions.get(name)
        if live is not None and live.version == version and name not in self.canaries:
            return self._staged(name, version, False, started)
        return self._staged(name, version, True, started) if (name, version) in self.staged \
            else None

    def _staged(self, name: str, version: str, changed: bool, started: float) -> StageResult:
        live = self.functions.get(name)
        return StageResult(name, version, live.version if live else None, changed,
                           round((time.perf_counter() - started) * 1000, 2))

    def _prepare(self, fn: Deployment) -> None:
        """Last warm-up on the loop's thread and a check of its routes against the
        live ones. Raises `RouteConflict`; then `fn` is released."""
        try:
            fn.executor.activate()
            self._check_tenant_routes(fn.manifest, fn.label)
            self._table(fn)
        except BaseException:
            fn.executor.close()
            raise

    async def activate(self, name: str, version: str, canary: float | None = None
                       ) -> Activated:
        """Route to a staged version: as the live version, or with `canary` (a
        percent) beside the live one for that share of request keys. Activating
        the live version again changes nothing.

        Raises `NotFound` if that version is not staged, `InvalidConfig` for a
        share outside (0, 100), `DeployError` for a canary without a live version
        or with other routes, `RouteConflict`, `Failure` if the record cannot be
        saved; then nothing changed and the version stays staged.
        """
        if canary is not None:
            check_percent(canary)
        async with self.changes:
            live = self.functions.get(name)
            previous = live.version if live is not None else None
            staged = self.staged.get((name, version))
            if staged is None:
                if previous == version and canary is None and name not in self.canaries:
                    return Activated(name, version, previous, None, False, time.time())
                raise NotFound(f"{name}@{version} is not staged on this PoP (stage it first)")
            if canary is None:
                self._switch_to(staged)
            else:
                self._start_canary(staged, live, canary)
            at = time.time()
            del self.staged[(name, version)]
            await self._after_switch(staged.fn)
            return Activated(name, version, previous, canary, True, at)

    def _switch_to(self, staged: Staged) -> None:
        """Save the record (the commit point), then route to the staged version."""
        fn = staged.fn
        self._check_tenant_routes(fn.manifest, fn.label)  # others went live meanwhile?
        table = self._table(fn)
        self._commit(fn.manifest, fn.version, staged.source, staged.action)
        self._switch(*table)

    def _start_canary(self, staged: Staged, live: Deployment | None, percent: float) -> None:
        """Save the canary in the record, then split `live`'s requests with it.
        Raises `DeployError` without a live version, for the live version itself, or
        if the routes differ."""
        fn = staged.fn
        if live is None:
            raise DeployError(f"{fn.name} has no live version for a canary to run beside: "
                              "deploy it first")
        if fn.version == live.version:  # staged again while another canary ran
            raise DeployError(f"{fn.label} is already the live version: a canary runs another "
                              f"version beside it (roll back or promote the canary instead)")
        if fn.manifest.route_list() != live.manifest.route_list():
            raise DeployError(f"{fn.label}: a canary must serve the same routes as the live "
                              f"version {live.version}; deploy it instead")
        self._save_canary(fn.name, CanaryInfo(fn.version, percent), staged.source, "canary")
        self._claim(fn.manifest)
        old = self.canaries.get(fn.name)
        self.canaries = {**self.canaries, fn.name: Split(fn, percent)}
        if old is not None:
            old.fn.executor.retire()

    def _save_canary(self, name: str, canary: CanaryInfo | None, source: str,
                     action: str) -> None:
        """Save `name`'s record with `canary` (None: without one). Raises `Failure`
        (500) if the data dir cannot be written."""
        record = self.store.record(name)
        now = time.time()
        if canary is not None and canary.version not in {v.version for v in record.versions}:
            record.versions.append(VersionInfo(canary.version, now, source))
        ended = record.canary.version if record.canary is not None else record.current
        record.canary = canary
        record.history.append(deploys.Event(canary.version if canary else ended, now, action))
        try:
            self.store.save(record)
        except OSError as e:
            raise Failure("deploy_not_saved", 500, f"cannot save the record of {name!r}, "
                          f"nothing changed: {e}") from e

    async def abort(self, name: str, version: str) -> bool:
        """Drop a staged version (and its files, if the stage wrote them); False if
        it was not staged."""
        async with self.changes:
            staged = self.staged.pop((name, version), None)
            if staged is None:
                return False
            staged.fn.executor.close()
            if staged.created:
                await asyncio.to_thread(self.store.remove_version, name, version)
            if staged.namespaces:  # unless a deploy claimed them or a stage uses them
                kept = {ns for ns in staged.namespaces if self.stores.owners.owner("kv", ns)}
                kept |= {ns for other in self.staged.values()
                         for ns in other.fn.manifest.bindings.kv}
                await asyncio.to_thread(self.stores.kv.remove_empty_namespaces,
                                        [ns for ns in staged.namespaces if ns not in kept])
            return True

    async def promote(self, name: str) -> DeployResult:
        """Make the canary the live version (it then serves every request).

        Raises `NotFound` for an unknown function, `DeployError` if it has no
        canary, `Failure` (500) if the record cannot be saved.
        """
        started = time.perf_counter()
        async with self.changes:
            self.store.record(name)
            split = self.canaries.get(name)
            if split is None:
                raise DeployError(f"{name} has no canary to promote (start one with "
                                  "`edgefn deploy DIR --canary 10%`)")
            self._check_tenant_routes(split.fn.manifest, split.fn.label)
            table = self._table(split.fn)
            self._commit(split.fn.manifest, split.fn.version, "", "promote")
            self._switch(*table)
            return self._result(split.fn, True, started)

    def _drop_canary(self, name: str, started: float) -> DeployResult:
        """End `name`'s canary: the live version serves everything. Raises `Failure`."""
        split = self.canaries[name]
        self._save_canary(name, None, "", "canary_dropped")
        self.canaries = {n: s for n, s in self.canaries.items() if n != name}
        split.fn.executor.retire()
        return self._result(self.functions[name], True, started)
