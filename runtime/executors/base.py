"""The interface every executor has, and `load()`, which picks one.

Every executor has the same small interface (`Executor`); `load()` picks one
from the manifest's ``runtime``. Executors raise `FunctionError` for anything
the user's code did wrong; the pipeline turns that into a response
(`runtime.pipeline.contain`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Protocol

from edgefn_core.abi import encode_principal
from runtime.bindings import Bindings
from runtime.executors.wasm.engine import WasmEngine
from runtime.functions.manifest import Manifest
from runtime.net.message import Request, Response

NO_PRINCIPAL: Mapping[str, str] = {}  # an anonymous caller (shared: never mutated)


class Caller(dict[str, str]):
    """The ABI's principal section (tenant, key_id, bot, ...) with its encoding,
    made once: the pipeline keeps one per distinct caller."""

    def __init__(self, fields: dict[str, str]) -> None:
        super().__init__(fields)
        self.blob = encode_principal(fields) if fields else b""


def principal_blob(principal: Mapping[str, str]) -> bytes:
    """The encoded principal section of `principal` (empty for an anonymous one)."""
    if isinstance(principal, Caller):
        return principal.blob
    return encode_principal(principal) if principal else b""


class Executor(Protocol):
    abi: str

    def handle(self, request: Request, route: str, params: Mapping[str, str],
               principal: Mapping[str, str] = NO_PRINCIPAL) -> Response | Awaitable[Response]:
        """Run the function for `request` matched on `route`, which captured `params`
        (``{"id": "42"}`` for ``/users/:id``; see `runtime.functions.router`), for
        the caller `principal` describes (the ABI's principal section: tenant,
        key_id, ...; empty for an anonymous caller). Raises `FunctionError`."""
        ...

    def prewarm(self) -> None:
        """Do everything a first request would do before user code runs; may block
        (it runs off the event loop). Raises `DeployError`."""
        ...

    def activate(self) -> None:
        """Last warm-up on the event loop's thread, right before routing switches."""
        ...

    def retire(self) -> None:
        """This version no longer receives requests: release it once in-flight ones end."""
        ...

    def close(self) -> None:
        """Release everything now (PoP shutdown)."""
        ...


def load(manifest: Manifest, directory: Path, version: str, wasm: WasmEngine,
         bindings: Bindings | None = None, insecure_python: bool = False) -> Executor:
    """Compile and validate a function. Raises `DeployError` with the reason.
    `insecure_python`: run Python functions even without their full sandbox."""
    if manifest.runtime == "python":
        from runtime.executors.python.function import PythonFunction

        return PythonFunction(manifest, directory, version, bindings, insecure_python)
    from runtime.executors.wasm.function import WasmFunction

    return WasmFunction(wasm, manifest, directory, bindings, version)


__all__ = ["Executor", "WasmEngine", "load"]
