"""Python executor: a function's handler runs in pre-warmed subinterpreters hosted
by supervised processes (`runtime.executors.python`)."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from pathlib import Path

from edgefn_core.abi import encode_pairs, encode_params, encode_request
from runtime.bindings import Bindings
from runtime.bindings.fetch import Lineage
from runtime.executors.base import NO_PRINCIPAL, principal_blob
from runtime.executors.python import local_kv_env, policy
from runtime.executors.python.config import PIPELINE_AUTO, HostConfig
from runtime.executors.python.pool import Pool
from runtime.functions.manifest import Manifest
from runtime.net.message import Request, Response, cdn_loop


class PythonFunction:
    abi = "python"

    def __init__(self, manifest: Manifest, directory: Path, version: str,
                 bindings: Bindings | None = None, insecure: bool = False) -> None:
        """Nothing starts until `prewarm()`. `insecure`: run even where a layer of
        the sandbox is missing on this machine (``--insecure-python``)."""
        limits, pool = manifest.limits, manifest.pool
        self.cfg = HostConfig(
            name=manifest.name, version=version, function_dir=str(directory.resolve()),
            module=Path(manifest.entry).stem, handler=manifest.handler, cpu_ms=limits.cpu_ms,
            wall_ms=limits.wall_ms, memory_mb=limits.memory_mb,
            recycle_after=pool.recycle_after, min_isolates=pool.min, max_isolates=pool.max,
            pipeline=PIPELINE_AUTO if pool.pipeline == "auto" else pool.pipeline,
            max_response_mb=limits.max_response_mb, env=tuple(manifest.env.items()),
            insecure=insecure, owner=manifest.tenant, **local_kv_env.plan(bindings))
        self.standby = pool.standby
        self.env_blob = encode_pairs([(k.encode(), v.encode()) for k, v in manifest.env.items()])
        self.pool: Pool | None = None
        self.bindings = bindings

    def prewarm(self) -> None:
        """Start the host processes and import the module in every initial isolate.
        Blocks. Raises `DeployError` naming an import that cannot load, or
        `SandboxMissing` where this machine lacks a sandbox layer (unless insecure)."""
        if self.pool is None:
            policy.require(self.cfg.insecure, self.cfg.label)
            sample = encode_request(b"GET", b"/", b"", [(b"host", b"prewarm")], self.env_blob, b"")
            # set before it starts: `close` from another thread (a PoP shutting down
            # during this deploy) reaches the hosts starting and stops them
            self.pool = Pool(self.cfg, self.standby, sample,
                             self.bindings.call if self.bindings else None)
            self.pool.start()

    def activate(self) -> None:
        assert self.pool is not None, "prewarm() first"
        self.pool.activate()

    def handle(self, request: Request, route: str, params: Mapping[str, str],
               principal: Mapping[str, str] = NO_PRINCIPAL) -> Awaitable[Response]:
        """The response to come, which raises `FunctionError` (see `Pool.submit`).
        `params` reach the handler as ``request.params``, `principal` as
        ``request.principal``. The job is submitted now, not when the caller first
        awaits: a switch to another version in between retired this pool with
        nothing in flight and stopped its hosts, and the job then waited on a
        stopped isolate to its wall limit (a 504 mid-deploy)."""
        assert self.pool is not None
        payload = encode_request(request.method, request.path, request.query, request.headers,
                                 self.env_blob, request.body, encode_params(params),
                                 principal_blob(principal))
        return self.pool.submit(payload, principal.get("tenant"),
                                Lineage(cdn_loop(request.headers)))

    def retire(self) -> None:
        if self.pool is not None:
            self.pool.retire()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
