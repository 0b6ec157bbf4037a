"""Executors run a deployed function's code for one request.

Every executor has the same small interface (`Executor`); `load()` picks one
from the manifest's ``runtime``. Executors raise `FunctionError` for anything
the user's code did wrong; `runtime.pop` turns that into a response.
"""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path
from typing import Protocol

from ..bindings import Bindings
from ..http.message import Request, Response
from ..manifest import Manifest
from .wasm_engine import WasmEngine


class Executor(Protocol):
    abi: str

    def handle(self, request: Request, route: str) -> Response | Awaitable[Response]:
        """Run the function for `request` matched on `route`. Raises `FunctionError`."""
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
         bindings: Bindings | None = None) -> Executor:
    """Compile and validate a function. Raises `DeployError` with the reason."""
    if manifest.runtime == "python":
        from .python import PythonFunction

        return PythonFunction(manifest, directory, version, bindings)
    from .wasm import WasmFunction

    return WasmFunction(wasm, manifest, directory, bindings)


__all__ = ["Executor", "WasmEngine", "load"]
