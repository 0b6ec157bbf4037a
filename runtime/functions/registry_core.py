"""What the registry's mixins (`Staging`, `Following`) may use of a `Registry`: its
state and the steps they share, declared once for the type checker."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from runtime.bindings import Stores
    from runtime.functions.canary import Split
    from runtime.functions.changes import Changes
    from runtime.functions.deploys import DeployStore
    from runtime.functions.manifest import Manifest
    from runtime.functions.registry import Deployment
    from runtime.functions.router import Router


class RegistryCore:
    """Declarations only: `Registry` defines each of these."""

    if TYPE_CHECKING:
        functions: dict[str, Deployment]
        canaries: dict[str, Split]
        unserved: dict[str, str]
        unserved_tried: dict[str, float]
        changes: Changes  # the lock every change takes
        store: DeployStore
        stores: Stores

        def _load(self, m: Manifest, version: str) -> Deployment: ...
        def _check_tenant_routes(self, m: Manifest, label: str) -> None: ...
        async def _warm(self, fn: Deployment) -> None: ...
        async def _after_switch(self, fn: Deployment) -> None: ...
        def _stored(self, name: str, version: str) -> Manifest: ...
        def _table(self, fn: Deployment | None, remove: str | Iterable[str] | None = None,
                   ) -> tuple[dict[str, Deployment], Router[Deployment]]: ...
        def _switch(self, functions: dict[str, Deployment],
                    router: Router[Deployment]) -> None: ...
