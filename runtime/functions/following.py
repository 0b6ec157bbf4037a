"""A worker's registry following the records another process saved (``workers = N``).

With several PoP processes on one data dir, only the admin worker deploys: it
saves each function's record (the commit point) and then tells every other
worker to `follow`, which makes its own routing match the records: the current
version of each function, its canary, and no function whose record is gone. A
worker that starts reads the same records (`Registry.restore`), so one that was
restarted mid-deploy serves what was committed.

`Following` is a mixin of `runtime.functions.registry.Registry`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from edgefn_core.errors import DeployError, ManifestError, NotFound
from runtime.functions.canary import Split
from runtime.functions.deploys import FunctionRecord
from runtime.functions.registry_core import RegistryCore

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from runtime.functions.registry import Deployment

log = logging.getLogger("edgefn.pop")
RETRY_UNSERVED_S = 5.0  # a recorded version that did not load here is tried again this often


class Following(RegistryCore):
    """`follow`: serve what the saved records say."""

    if TYPE_CHECKING:  # the registry's step only this mixin uses
        def _go_live(self, fn: Deployment, persist: Callable[[], None] | None = None,
                     owners: bool = False, remove: Iterable[str] | None = None) -> None: ...

    async def follow(self) -> list[str]:
        """Route as the saved records say, saving nothing: load the current version
        (and canary) of each function whose record changed, stop serving those whose
        record is gone. Returns what could not be served (a version that no longer
        loads keeps the one this worker had, and is logged). A recorded version that
        did not load here before (`unserved`: refused at start, as the admin worker
        refused it too, or in an earlier follow) is tried again at most every
        `RETRY_UNSERVED_S` (a failure that passes, such as a flaky import, must not
        leave this worker without the function for good), and never reported:
        another function's deploy must not cost this worker its life."""
        async with self.changes:
            records = {r.name: r for r in await asyncio.to_thread(self.store.records)}
            self.stores.owners.reload()  # the grants the admin worker's deploys saved
            # those whose record is gone stop serving in the first switch (a function
            # that replaced one, `Registry.deploy`, takes its routes over in it)
            gone = [n for n in self.functions if n not in records]
            self.unserved = {n: v for n, v in self.unserved.items() if n in records}
            errors = []
            for record in records.values():
                retry = record.name not in self.functions and \
                    self.unserved.get(record.name) == record.current
                if retry and time.monotonic() - self.unserved_tried.get(record.name, 0.0) \
                        < RETRY_UNSERVED_S:
                    continue
                try:
                    await self._follow_live(record, gone)
                    await self._follow_canary(record)
                except (ManifestError, DeployError, NotFound) as e:
                    log.error("worker cannot serve %s as recorded: %s", record.name, e)
                    if not retry:
                        errors.append(f"{record.name}: {e}")
                    if record.name not in self.functions:
                        self.unserved[record.name] = record.current
                        self.unserved_tried[record.name] = time.monotonic()
                else:
                    self.unserved.pop(record.name, None)
                    self.unserved_tried.pop(record.name, None)
            if gone:
                self._switch(*self._table(None, remove=gone))
            return errors

    async def _follow_live(self, record: FunctionRecord, gone: list[str]) -> None:
        """Serve `record`'s live version; the first switch also ends the functions
        in `gone` (then emptied)."""
        live = self.functions.get(record.name)
        if live is not None and live.version == record.current:
            return
        fn = await asyncio.to_thread(self._loaded, record.name, record.current)
        await self._warm(fn)  # as the admin worker did before its switch
        self._go_live(fn, remove=gone)
        gone.clear()
        await self._after_switch(fn)

    async def _follow_canary(self, record: FunctionRecord) -> None:
        """Start, change or end `record`'s canary as it says."""
        want, have = record.canary, self.canaries.get(record.name)
        if want is None:
            if have is not None:
                self.canaries = {n: s for n, s in self.canaries.items() if n != record.name}
                have.fn.executor.retire()
            return
        if have is not None and have.fn.version == want.version:
            if have.percent != want.percent:
                self.canaries = {**self.canaries, record.name: Split(have.fn, want.percent)}
            return
        fn = await asyncio.to_thread(self._loaded, record.name, want.version)
        await self._warm(fn)  # activates it
        self.canaries = {**self.canaries, record.name: Split(fn, want.percent)}
        if have is not None:
            have.fn.executor.retire()
        await self._after_switch(fn)

    def _loaded(self, name: str, version: str) -> Deployment:
        """A stored version, verified, loaded and warm. Blocking. Raises
        `ManifestError`, `DeployError`, `NotFound`."""
        return self._load(self._stored(name, version), version)
