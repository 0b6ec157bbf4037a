"""The registry of deployed functions: deploy, rollback, delete and restore, and the
router that maps requests to the version that serves them.

Routing switches atomically: a deploy compiles and pre-warms the new version,
checks its routes, persists the record, then replaces `self.router` in one
assignment. Requests already running keep the `Deployment` they started with.

The saved record is the commit point, so it comes before the switch. A crash
between the two leaves the new version recorded but never served: the restarted
PoP serves it, and no client saw anything that the restart takes back. The other
order could serve a version whose record a crash then loses, so the restart would
go back to the older one. Deletes follow the same rule: the record goes first.

A deploy may also be split in two (for rollouts across PoPs), and a version may
run as a canary beside the live one: see `runtime.functions.staging`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import lmdb
import msgspec

from edgefn_core.errors import (
    DeployError,
    EdgefnError,
    Failure,
    FunctionError,
    ManifestError,
    NotFound,
    NotOwner,
    RouteConflict,
    VersionTampered,
)
from runtime.bindings import Bindings, Stores
from runtime.executors.base import Executor, WasmEngine, load
from runtime.functions import deploys, manifest, warmup
from runtime.functions.canary import Split
from runtime.functions.changes import Changes
from runtime.functions.deploys import (
    DeployStore,
    Files,
    FunctionRecord,
    VersionInfo,
)
from runtime.functions.following import Following
from runtime.functions.manifest import Manifest, Route
from runtime.functions.router import Router, overlap
from runtime.functions.staging import Staged, Staging
from runtime.net.message import Response, json_response

log = logging.getLogger("edgefn.pop")


class Deployment:
    """One version of one function, loaded and warm."""

    def __init__(self, manifest: Manifest, version: str, executor: Executor) -> None:
        self.name = manifest.name
        self.kind = "function"
        self.tenant: str | None = manifest.tenant
        self.policy = manifest.policy
        self.cache = manifest.cache  # its [cache] settings (runtime.cache.settings)
        self.version = version
        self.manifest = manifest
        self.executor = executor
        self.label = f"{manifest.name}@{version}"
        self.tag = (b"x-edgefn-function", self.label.encode())
        self.concurrency = manifest.limits.concurrency
        self.inflight = 0  # requests being served (see `runtime.pipeline.stages.dispatch`)

    def error_response(self, err: EdgefnError) -> Response:
        """A failure of this function: a 4xx/5xx that says why, in the
        `x-edgefn-error` header and a JSON body."""
        body = {"error": {"kind": err.code, "function": self.name, "version": self.version,
                          "message": f"function {self.name!r} {err}"}}
        headers = [(b"x-edgefn-error", err.code.encode()), self.tag]
        if err.code in ("concurrency_limit", "replaced"):
            headers.append((b"retry-after", b"1"))
        return json_response(body, err.status, headers)

    def crashed(self, exc: Exception) -> EdgefnError:
        return FunctionError("crash", 502, f"failed inside edgefn: {exc!r}")

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {
            "name": self.name, "version": self.version, "abi": self.executor.abi,
            "routes": [msgspec.to_builtins(r) for r in self.manifest.route_list()]}
        if self.manifest.owner is not None:
            out["owner"] = self.manifest.owner
        return out


class DeployResult(msgspec.Struct):
    name: str
    version: str
    routes: list[dict[str, str]]
    changed: bool
    abi: str
    took_ms: float


class Registry(Staging, Following):
    """The functions a PoP serves. Deploys and rollbacks are serialised by a lock;
    reads (`router`, `listing`) never wait."""

    def __init__(self, data_dir: Path, wasm: WasmEngine, stores: Stores,
                 reserved: frozenset[bytes] = frozenset(), insecure_python: bool = False,
                 vet: Callable[[Manifest], None] | None = None) -> None:
        """`reserved`: paths of built-in endpoints that no function route may cover.
        `insecure_python`: run Python functions even without their full sandbox.
        `vet`: the PoP's own checks of a manifest at deploy (a function asking for
        a WAF this PoP cannot run); raises `DeployError` to refuse it."""
        self.insecure_python = insecure_python
        self.vet = vet
        self.data_dir = data_dir
        self.store = DeployStore(data_dir)
        self.wasm = wasm
        self.stores = stores
        self.reserved = reserved
        self.functions: dict[str, Deployment] = {}
        self.router: Router[Deployment] = Router()
        self.canaries: dict[str, Split] = {}  # replaced, never changed in place
        self.staged: dict[tuple[str, str], Staged] = {}  # (name, version)
        # function -> the recorded version that did not load here (at `restore` or a
        # `follow`): not served, and not tried again until its record names another
        self.unserved: dict[str, str] = {}
        self.unserved_tried: dict[str, float] = {}  # when each was last tried (monotonic)
        self.changes = Changes()  # the lock of changes; `abort_changes` at shutdown
        # after routing switched to a version: the PoP's quiet warm-up request through
        # its pipeline (`runtime.pipeline.warm`), which this layer cannot import
        self.switched: Callable[[Deployment], Awaitable[None]] | None = None
        # why a path no function serves may be served soon (`edgefn dev` deploying
        # its folders): `route` answers it 503 ``starting`` then, not 404
        self.starting: str | None = None

    # -- deploys ----------------------------------------------------------------------------
    async def deploy(self, files: Files, source: str = "", tenant: str | None = None,
                     replaces: str | None = None) -> DeployResult:
        """Validate, check ownership, store, compile, pre-warm, save the record, claim
        what it binds and switch routing to a new version. Blocking work (hashing,
        writing files, compiling) runs on a worker thread. `tenant`: the deploy acts
        for this tenant (an API key's), so the manifest's ``owner`` must name it and
        a function of that name must not belong to another. `replaces`: a function
        of the same owner that the new one takes over from (a folder renamed in
        `edgefn dev`): it stops serving in the same switch, and is deleted.

        Raises `ManifestError`, `DeployError` (`NotOwner` for a namespace or index
        of another owner, or a replaced function of another, `RouteConflict`), or
        `Failure` (500) if the record cannot be saved; on error nothing changes, the
        previous version (and the one to replace) keeps serving and nothing this
        deploy wrote is left in the data dir.
        """
        m, version, label = await self._checked(files, source, tenant)
        started = time.perf_counter()
        async with self.changes:
            current = self.functions.get(m.name)
            old = self._replaced(m, replaces)
            if current is not None and current.version == version and old is None:
                return self._result(current, False, started)
            self.stores.owners.check(m, label)
            self._check_tenant_routes(m, label)
            self.stores.kv.check_room(m.bindings.kv)  # before anything is saved
            cached = self.store.cached()
            created = await asyncio.to_thread(self.store.write_version, m.name, version, files)
            made: list[str] = []
            try:
                made = self.stores.new_namespaces(m)  # its warm-up may use them
                fn = await asyncio.to_thread(self._load, m, version)
                await self._warm(fn)
                self._go_live(fn, lambda: self._commit(m, version, source, "deploy"),
                              owners=True, remove=old)
            except BaseException:
                await asyncio.to_thread(self._undo, m.name, version, created, cached, made)
                raise
            if old is not None:
                try:
                    self.store.delete(old)
                except (OSError, NotFound) as e:  # a restart finds both, restores one
                    log.error("%s: replaced, but its record cannot be deleted: %s", old, e)
                self._forget(old)
            await self._after_switch(fn)
            return self._result(fn, True, started)

    def _replaced(self, m: Manifest, name: str | None) -> str | None:
        """The function `m`'s deploy replaces: `name`, if it is another one deployed
        here. Raises `NotOwner` where its owner is not `m`'s (a tenant's deploy names
        its tenant as `m`'s owner: `_checked`)."""
        old = self.functions.get(name) if name is not None and name != m.name else None
        if old is None:
            return None
        if old.manifest.owner != m.owner:
            raise NotOwner(f"function {m.name!r} cannot replace {old.name!r}: it belongs to "
                           f"another owner ({old.manifest.owner!r})")
        return old.name

    def _forget(self, name: str) -> None:
        """After `name` (deleted or replaced) stopped serving: its staged versions and
        grants go (a grant not saved is logged)."""
        for key in [k for k in self.staged if k[0] == name]:
            self.staged.pop(key).fn.executor.close()
        try:
            self.stores.owners.forget(name)
        except OSError as e:
            log.error("%s: cannot save the withdrawal of its grants: %s", name, e)

    async def _checked(self, files: Files, source: str, tenant: str | None
                       ) -> tuple[Manifest, str, str]:
        """The package's manifest, version and label (``SOURCE/edgefn.toml``), after
        the checks that need no lock. Raises `ManifestError`, `DeployError`."""
        label = f"{source or '<package>'}/{manifest.MANIFEST_NAME}"
        raw = files.get(manifest.MANIFEST_NAME)
        if raw is None:
            raise ManifestError(label, "no such file: every function folder needs an edgefn.toml")
        m = manifest.parse(raw, label)
        if m.entry not in files:
            raise ManifestError(label, f"entry file {m.entry!r} is not in the package", "entry")
        self._check_reserved(m, label)
        if self.vet is not None:
            self.vet(m)
        if tenant is not None:
            self._check_tenant(m, tenant, label)
        deploys.check_package(files)
        version = await asyncio.to_thread(deploys.version_of, files)
        return m, version, label

    def _undo(self, name: str, version: str, created: bool, cached: frozenset[str],
              namespaces: list[str]) -> None:
        """Remove what a failed deploy wrote: its version (if it stored it), the
        compiled-code cache entries made since `cached` and the KV `namespaces` it
        created. Blocking."""
        if created:
            self.store.remove_version(name, version)
        self.store.uncache(cached)
        kept = self.stores.kv.remove_empty_namespaces(namespaces)
        if kept:
            log.warning("%s: the refused deploy's new KV namespaces %s hold keys written "
                        "meanwhile: kept", name, ", ".join(kept))

    def _check_tenant(self, m: Manifest, tenant: str, label: str) -> None:
        """Raises `NotOwner` unless `tenant` may deploy `m`."""
        if m.owner != tenant:
            says = f"it says owner = {m.owner!r}" if m.owner is not None else "it sets none"
            raise NotOwner(f"{label}: this API key deploys for tenant {tenant!r}: set "
                           f"owner = {tenant!r} in edgefn.toml ({says})")
        current = self.functions.get(m.name)
        if current is not None and current.tenant != tenant:
            raise NotOwner(f"function {m.name!r} belongs to {current.tenant!r}")

    def _check_tenant_routes(self, m: Manifest, label: str) -> None:
        """Raises `RouteConflict` when a route of `m` (with an `owner`) and a route
        of another tenant's function match some path on some host: the more specific
        one would take the other's requests, and the credentials they carry (bob's
        ``/alice/y`` inside alice's ``/alice/*``). Functions with no ``owner`` (the
        operator's) are not in it."""
        if m.owner is None:
            return
        for fn in self.functions.values():
            owner = fn.manifest.owner
            if owner is None or owner == m.owner or fn.name == m.name:
                continue
            for i, mine in enumerate(m.route_list()):
                theirs = next((r for r in fn.manifest.route_list() if overlap(mine, r)), None)
                if theirs is not None:
                    raise RouteConflict(
                        f"{label}: field `routes[{i}]`: route {mine.path!r} reaches paths of "
                        f"route {theirs.path!r} of function {fn.name!r}, which belongs to "
                        f"another tenant ({owner!r}); tenants' routes may not overlap",
                        mine.path, fn.name)

    def _check_reserved(self, m: Manifest, label: str) -> None:
        """Raises `RouteConflict` for a route that would serve a built-in endpoint
        (on any host); ``/`` and ``/*``, the catch-alls, are let through: built-in
        endpoints still come first."""
        for i, route in enumerate(m.route_list()):
            if route.path.rstrip("/*") == "":
                continue
            alone = Router([(Route(route.path), m.name, None)])
            for path in sorted(self.reserved):
                if alone.match(b"", path) is not None:
                    raise RouteConflict(
                        f"{label}: field `routes[{i}]`: route {route.path!r} would cover the "
                        f"built-in endpoint {path.decode()}; choose another path",
                        route.path, "<built-in>")

    def _load(self, m: Manifest, version: str) -> Deployment:
        """Load and pre-warm a stored version. Blocking. Raises `ManifestError`,
        `DeployError`."""
        executor = load(m, self.store.version_dir(m.name, version), version, self.wasm,
                        Bindings.prepare(self.stores, m, create=False), self.insecure_python)
        try:
            with self.changes.start(executor):
                executor.prewarm()
        except BaseException:
            executor.close()
            raise
        return Deployment(m, version, executor)

    async def _warm(self, fn: Deployment) -> None:
        """Activate `fn` and run its request path (`runtime.functions.warmup`) before
        any request is routed to it. Raises `DeployError`; then `fn` is released."""
        try:
            fn.executor.activate()
            await warmup.warm(fn)
        except BaseException:
            fn.executor.close()
            raise

    async def _after_switch(self, fn: Deployment) -> None:
        """`switched(fn)`, if set, once requests are routed to `fn`. It never raises
        (`runtime.pipeline.warm` logs what fails)."""
        if self.switched is not None:
            await self.switched(fn)

    def _go_live(self, fn: Deployment, persist: Callable[[], None] | None = None,
                 owners: bool = False, remove: str | Iterable[str] | None = None) -> None:
        """Activate a loaded version, check its routes (`owners`: against other owners'
        too, as a deploy or rollback asks; a restore or a follow serves what the record
        says), run `persist` (saving the record: the commit point), then route to it,
        the functions named in `remove` gone in the same switch. Raises
        `RouteConflict` or what activating or `persist` raised; then nothing changed
        and `fn` is released."""
        try:
            fn.executor.activate()
            if owners:
                self._check_tenant_routes(fn.manifest, fn.label)
            table = self._table(fn, remove)
            if persist is not None:
                persist()
        except BaseException:
            fn.executor.close()
            raise
        self._switch(*table)

    def _table(self, fn: Deployment | None, remove: str | Iterable[str] | None = None,
               ) -> tuple[dict[str, Deployment], Router[Deployment]]:
        """The functions and router with `fn` replacing its namesake, without `remove`
        (a name, or several). Raises `RouteConflict` (a `DeployError`)."""
        functions = dict(self.functions)
        if fn is not None:
            functions[fn.name] = fn
        for name in [remove] if isinstance(remove, str) else remove or ():
            functions.pop(name, None)
        # `fn`'s routes go in last, so a conflict names the function already serving
        # the route (it named `fn` itself when `fn` replaced an older entry)
        ordered = [f for f in functions.values() if fn is None or f.name != fn.name]
        if fn is not None:
            ordered.append(fn)
        return functions, Router((r, f.name, f) for f in ordered
                                 for r in f.manifest.route_list())

    def _switch(self, functions: dict[str, Deployment], router: Router[Deployment]) -> None:
        """Serve from `functions` and `router` (one assignment) and retire what left."""
        old = self.functions
        ended = {n: s for n, s in self.canaries.items() if functions.get(n) is not old.get(n)}
        if ended:  # a function whose live version changes ends its canary
            self.canaries = {n: s for n, s in self.canaries.items() if n not in ended}
        self.functions, self.router = functions, router
        for name, previous in old.items():
            if functions.get(name) is not previous:
                previous.executor.retire()  # in-flight requests finish on it first
        for name, split in ended.items():
            if functions.get(name) is not split.fn:
                split.fn.executor.retire()

    def _commit(self, m: Manifest, version: str, source: str, action: str) -> None:
        """Save the record (the commit point), then claim what `m` binds. Raises
        `Failure` (500) if the record cannot be saved; a claim that cannot be saved is
        logged (it holds in memory, and a restart makes it again from the record)."""
        self._record(m.name, version, source, action)
        self._claim(m)

    def _claim(self, m: Manifest) -> None:
        try:
            self.stores.claim(m)
        except (OSError, lmdb.Error) as e:  # the record is saved: a restart claims again
            log.error("%s: cannot save who owns what it binds: %s", m.name, e)

    def _record(self, name: str, version: str, source: str, action: str) -> None:
        """Save `name`'s record with `version` current. Raises `Failure` (500) if the
        data dir cannot be written; the saved record is then still the old one."""
        try:
            self.store.save(self._updated(name, version, source, action))
        except OSError as e:
            raise Failure("deploy_not_saved", 500, f"cannot save the record of {name!r}, "
                          f"nothing changed: {e}") from e

    def _updated(self, name: str, version: str, source: str, action: str) -> FunctionRecord:
        try:
            record = self.store.record(name)
        except NotFound:
            return deploys.new_record(name, version, source, action)
        now = time.time()
        if version not in {v.version for v in record.versions}:
            record.versions.append(VersionInfo(version, now, source))
        record.current = version
        record.canary = None
        record.history.append(deploys.Event(version, now, action))
        return record

    def _result(self, fn: Deployment, changed: bool, started: float) -> DeployResult:
        d = fn.describe()
        return DeployResult(fn.name, fn.version, d["routes"], changed,  # type: ignore[arg-type]
                            fn.executor.abi, round((time.perf_counter() - started) * 1000, 2))

    async def rollback(self, name: str, version: str | None = None) -> DeployResult:
        """Serve an older version again (the one before the current by default),
        saving the record before routing to it as a deploy does. During a canary,
        with no `version`: drop the canary (the live version serves everything).

        Raises `NotFound` for an unknown function or version, `DeployError` if
        there is no older version or it no longer loads, `Failure` (500) if the
        record cannot be saved.
        """
        started = time.perf_counter()
        async with self.changes:
            record = self.store.record(name)
            if version is None and name in self.canaries:
                return self._drop_canary(name, started)
            target = version or record.previous()
            if target is None:
                raise DeployError(
                    f"{name}: {record.current} is the oldest version that served, none before "
                    "it to roll back to (each rollback steps back once through what served, an "
                    f"explicit one to its version; `edgefn rollback {name} VERSION` serves any "
                    f"version `edgefn versions {name}` lists)")
            known = {v.version for v in record.versions}
            if target not in known:
                raise NotFound(f"{name} has no version {target!r}; "
                               f"known: {', '.join(sorted(known))}")
            try:
                m = await asyncio.to_thread(self._stored, name, target)
            except VersionTampered as e:  # it named neither the function nor the version
                raise VersionTampered(f"{name}@{target}: {e}") from None
            fn = await asyncio.to_thread(self._load, m, target)
            await self._warm(fn)
            self._go_live(fn, lambda: self._commit(m, target, "", "rollback"), owners=True)
            await self._after_switch(fn)
            return self._result(fn, True, started)

    async def delete(self, name: str) -> None:
        """Remove `name`'s record and versions, then stop serving it. Raises `NotFound`."""
        async with self.changes:
            self.store.delete(name)
            self._switch(*self._table(None, remove=name))
            self._forget(name)

    def _stored(self, name: str, version: str) -> Manifest:
        """The manifest of a stored version whose files are intact, whose bindings
        its owner may still use and which this PoP takes (`vet`). Blocking (hashes
        every file). Raises `VersionTampered` (naming the file), `ManifestError`,
        `NotOwner`, and what `vet` raises (`OutOfRegion`, `DeployError`)."""
        self.store.verify(name, version)
        d = self.store.version_dir(name, version)
        m = manifest.load(d, new=False)  # what an older edgefn stored keeps loading
        self.stores.owners.check(m, str(d / manifest.MANIFEST_NAME))
        if self.vet is not None:  # this PoP's config may have changed since (a tenant
            self.vet(m)  # pinned to another region: a restart served its functions here)
        return m

    def versions(self, name: str) -> FunctionRecord:
        """Raises `NotFound`."""
        return self.store.record(name)

    def listing(self) -> list[dict[str, object]]:
        """Each live function's `describe()`, with ``canary``: {version, percent} if
        one runs beside it."""
        out = []
        for fn in sorted(self.functions.values(), key=lambda f: f.name):
            d = fn.describe()
            split = self.canaries.get(fn.name)
            if split is not None:
                d["canary"] = {"version": split.fn.version, "percent": split.percent}
            out.append(d)
        return out

    # -- lifecycle --------------------------------------------------------------------------
    def restore(self) -> list[str]:
        """Load every persisted function, warm, before the PoP listens. A function that
        no longer loads is logged and skipped; returns their errors. One refused for a
        namespace of another owner is tried again after the others (whose grants its
        owner's functions make again as they load)."""
        errors: dict[str, str] = {}
        pending = self.store.records()
        while pending:
            refused = []
            for record in pending:
                try:
                    m = self._stored(record.name, record.current)
                    self._go_live(self._load(m, record.current), functools.partial(self._claim, m))
                    self._restore_canary(record)
                except NotOwner as e:
                    refused.append(record)
                    errors[record.name] = str(e)
                except (ManifestError, DeployError, NotFound) as e:
                    errors[record.name] = str(e)
                else:
                    errors.pop(record.name, None)
            pending = refused if len(refused) < len(pending) else []
        for name, why in errors.items():
            self.unserved[name] = self.store.record(name).current
            self.unserved_tried[name] = time.monotonic()
            log.error("not serving %s@%s: %s", name, self.unserved[name], why)
        self._warn_overlaps()
        return [f"{name}: {why}" for name, why in errors.items()]

    def _warn_overlaps(self) -> None:
        """Log each pair of restored functions of two owners whose routes overlap: an
        older edgefn deployed them (it did not refuse it), they are served as they
        were, and a deploy of either is refused until an operator removes one."""
        for fn in self.functions.values():
            try:
                self._check_tenant_routes(fn.manifest, fn.label)
            except RouteConflict as e:
                log.warning("%s (deployed before such overlaps were refused: one of the two "
                            "takes the other's requests; delete one of them)", e)

    def _restore_canary(self, record: FunctionRecord) -> None:
        """Serve `record`'s canary again, if it has one; one that no longer loads is
        logged and left off (the live version serves everything)."""
        c = record.canary
        if c is None:
            return
        try:
            fn = self._load(self._stored(record.name, c.version), c.version)
            fn.executor.activate()
        except (ManifestError, DeployError, NotFound) as e:
            log.error("not serving the canary %s@%s: %s", record.name, c.version, e)
            return
        self.canaries = {**self.canaries, record.name: Split(fn, c.percent)}

    async def abort_changes(self) -> None:
        """Stop the deploys, rollbacks and stages in flight, each undone (the PoP
        is stopping: before its stores close). Never raises."""
        await self.changes.abort()

    def close(self) -> None:
        for fn in self.functions.values():
            fn.executor.close()
        for split in self.canaries.values():
            split.fn.executor.close()
        for staged in self.staged.values():
            staged.fn.executor.close()
