"""The PoP: routes requests to deployed functions, deploys, rolls back, and is the
one place where user-code failures become responses.

Routing switches atomically: a deploy compiles and pre-warms the new version,
persists the record, then replaces `self.router` in one assignment. Requests
already running keep the `Deployment` they started with.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Protocol

import msgspec

from . import deploys, manifest
from .bindings import Bindings, Stores
from .deploys import DeployStore, Files, FunctionRecord, VersionInfo
from .errors import DeployError, FunctionError, ManifestError, NotFound
from .executors import Executor, WasmEngine, load
from .http.message import Request, Response, json_response
from .manifest import Manifest
from .router import RouteConflict, Router

log = logging.getLogger("edgefn.pop")


class BuiltinApi(Protocol):
    @property
    def paths(self) -> frozenset[bytes]: ...

    def __call__(self, request: Request) -> Awaitable[Response]: ...


class Deployment:
    """One version of one function, loaded and warm."""

    def __init__(self, manifest: Manifest, version: str, executor: Executor) -> None:
        self.name = manifest.name
        self.version = version
        self.manifest = manifest
        self.executor = executor
        self.tag = (b"x-edgefn-function", f"{manifest.name}@{version}".encode())

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "version": self.version, "abi": self.executor.abi,
                "routes": [msgspec.to_builtins(r) for r in self.manifest.route_list()]}


class DeployResult(msgspec.Struct):
    name: str
    version: str
    routes: list[dict[str, str]]
    changed: bool
    abi: str
    took_ms: float


class PoP:
    def __init__(self, data_dir: str | Path) -> None:
        self.data_dir = Path(data_dir)
        self.store = DeployStore(self.data_dir)
        self.wasm = WasmEngine(self.data_dir / "cache")
        self.stores = Stores(self.data_dir)
        self.functions: dict[str, Deployment] = {}
        self.router: Router[Deployment] = Router()
        self.lock = asyncio.Lock()
        # built-in endpoints (the OpenAI-compatible API) taken before function routes
        self.api: BuiltinApi | None = None

    # -- request path -----------------------------------------------------------------------
    def __call__(self, request: Request) -> Response | Awaitable[Response]:
        api = self.api
        if api is not None and request.path in api.paths:
            return api(request)
        hit = self.router.match(request.host, request.path)
        if hit is None:
            return json_response({"error": {"kind": "no_route", "message":
                                 f"no function serves {request.path.decode('latin-1')}"}}, 404)
        fn, route = hit
        try:
            result = fn.executor.handle(request, route)
        except FunctionError as e:
            return self.failed(fn, e)
        except Exception as e:
            return self.crashed(fn, e)
        if isinstance(result, Response):
            result.headers.append(fn.tag)
            return result
        return self._finish(fn, result)

    async def _finish(self, fn: Deployment, pending: Awaitable[Response]) -> Response:
        try:
            response = await pending
        except FunctionError as e:
            return self.failed(fn, e)
        except Exception as e:
            return self.crashed(fn, e)
        response.headers.append(fn.tag)
        return response

    def failed(self, fn: Deployment, err: FunctionError) -> Response:
        """The containment point: a trap, a limit or a bad response becomes a 5xx that
        says why, in the `x-edgefn-error` header and a JSON body."""
        log.warning("%s@%s: %s: %s", fn.name, fn.version, err.kind, err)
        body = {"error": {"kind": err.kind, "function": fn.name, "version": fn.version,
                          "message": f"function {fn.name!r} {err}"}}
        return json_response(body, err.status, [(b"x-edgefn-error", err.kind.encode()), fn.tag])

    def crashed(self, fn: Deployment, exc: Exception) -> Response:
        log.error("%s@%s: executor failed", fn.name, fn.version, exc_info=exc)
        return self.failed(fn, FunctionError("crash", 502, f"failed inside edgefn: {exc!r}"))

    # -- deploys ----------------------------------------------------------------------------
    async def deploy(self, files: Files, source: str = "") -> DeployResult:
        """Validate, compile, pre-warm and switch routing to a new version.

        Raises `ManifestError` or `DeployError`; on error nothing changes and the
        previous version keeps serving.
        """
        label = f"{source or '<package>'}/{manifest.MANIFEST_NAME}"
        raw = files.get(manifest.MANIFEST_NAME)
        if raw is None:
            raise ManifestError(label, "no such file: every function folder needs an edgefn.toml")
        m = manifest.parse(raw, label)
        if m.entry not in files:
            raise ManifestError(label, f"entry file {m.entry!r} is not in the package", "entry")
        version = deploys.version_of(files)
        started = time.perf_counter()
        async with self.lock:
            current = self.functions.get(m.name)
            if current is not None and current.version == version:
                return self._result(current, False, started)
            created = self.store.write_version(m.name, version, files)
            try:
                fn = await asyncio.to_thread(self._load, m, version)
                self._go_live(fn)
            except BaseException:
                if created:
                    self.store.remove_version(m.name, version)
                raise
            self._record(m.name, version, source, "deploy")
            return self._result(fn, True, started)

    def _load(self, m: Manifest, version: str) -> Deployment:
        self.stores.prepare(m)
        executor = load(m, self.store.version_dir(m.name, version), version, self.wasm,
                        Bindings(self.stores, m))
        try:
            executor.prewarm()
        except BaseException:
            executor.close()
            raise
        return Deployment(m, version, executor)

    def _go_live(self, fn: Deployment) -> None:
        """Activate a loaded version and route to it; on failure release it."""
        try:
            fn.executor.activate()
            self._switch(fn)
        except BaseException:
            fn.executor.close()
            raise

    def _switch(self, fn: Deployment | None, remove: str | None = None) -> None:
        """Swap in a router with `fn` replacing its namesake. Raises `DeployError` on
        a route conflict."""
        functions = dict(self.functions)
        if fn is not None:
            functions[fn.name] = fn
        if remove is not None:
            functions.pop(remove, None)
        try:
            router = Router((r, f.name, f) for f in functions.values()
                            for r in f.manifest.route_list())
        except RouteConflict as e:
            raise DeployError(str(e)) from None
        old = self.functions
        self.functions, self.router = functions, router
        for name, previous in old.items():
            if functions.get(name) is not previous:
                previous.executor.retire()  # in-flight requests finish on it first

    def _record(self, name: str, version: str, source: str, action: str) -> None:
        try:
            record = self.store.record(name)
        except NotFound:
            self.store.save(deploys.new_record(name, version, source, action))
            return
        now = time.time()
        if version not in {v.version for v in record.versions}:
            record.versions.append(VersionInfo(version, now, source))
        record.current = version
        record.history.append(deploys.Event(version, now, action))
        self.store.save(record)

    def _result(self, fn: Deployment, changed: bool, started: float) -> DeployResult:
        d = fn.describe()
        return DeployResult(fn.name, fn.version, d["routes"], changed,  # type: ignore[arg-type]
                            fn.executor.abi, round((time.perf_counter() - started) * 1000, 2))

    async def rollback(self, name: str, version: str | None = None) -> DeployResult:
        """Serve an older version again (the one before the current by default).

        Raises `NotFound` for an unknown function or version, `DeployError` if
        there is no older version or it no longer loads.
        """
        started = time.perf_counter()
        async with self.lock:
            record = self.store.record(name)
            target = version or record.previous()
            if target is None:
                raise DeployError(f"{name}: no version older than {record.current} to roll back to")
            known = {v.version for v in record.versions}
            if target not in known:
                raise NotFound(f"{name} has no version {target!r}; "
                               f"known: {', '.join(sorted(known))}")
            d = self.store.version_dir(name, target)
            fn = await asyncio.to_thread(self._load, manifest.load(d), target)
            self._go_live(fn)
            self._record(name, target, "", "rollback")
            return self._result(fn, True, started)

    async def delete(self, name: str) -> None:
        """Stop serving `name` and remove its versions. Raises `NotFound`."""
        async with self.lock:
            self.store.delete(name)
            self._switch(None, remove=name)

    def versions(self, name: str) -> FunctionRecord:
        """Raises `NotFound`."""
        return self.store.record(name)

    def listing(self) -> list[dict[str, object]]:
        return [fn.describe() for fn in sorted(self.functions.values(), key=lambda f: f.name)]

    # -- lifecycle --------------------------------------------------------------------------
    def restore(self) -> list[str]:
        """Load every persisted function, warm, before the PoP listens. A function that
        no longer loads is logged and skipped; returns their errors."""
        errors = []
        for record in self.store.records():
            try:
                d = self.store.version_dir(record.name, record.current)
                self._go_live(self._load(manifest.load(d), record.current))
            except (ManifestError, DeployError) as e:
                log.error("not serving %s@%s: %s", record.name, record.current, e)
                errors.append(f"{record.name}: {e}")
        return errors

    def close(self) -> None:
        for fn in self.functions.values():
            fn.executor.close()
        self.wasm.close()
        self.stores.close()
