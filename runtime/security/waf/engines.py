"""`Engines`: one `WafEngine` per `Profile`, compiled once and kept.

The PoP's own profile is compiled at start (`build`); a function's on its
first request, in a worker thread while that request waits (`built`). A
profile that failed to compile keeps its error: it is not retried per request.
"""

from __future__ import annotations

import asyncio

from edgefn_core.errors import InvalidConfig
from runtime.security.waf.crs import Profile
from runtime.security.waf.engine import WafEngine


class Engines:
    def __init__(self, max_engines: int = 16) -> None:
        """Keep at most `max_engines` compiled profiles (each holds a few MB of
        rules); past that the oldest unpinned one is dropped."""
        self.max_engines = max_engines
        self._built: dict[Profile, WafEngine] = {}
        self._pinned: set[Profile] = set()
        self._failed: dict[Profile, InvalidConfig] = {}
        self._building: dict[Profile, asyncio.Future[WafEngine]] = {}

    def get(self, profile: Profile) -> WafEngine | None:
        """The engine of `profile` if it is compiled. Raises the `InvalidConfig` its
        compilation raised, if it failed."""
        engine = self._built.get(profile)
        if engine is None and profile in self._failed:
            raise self._failed[profile]
        return engine

    def build(self, profile: Profile, pin: bool = False) -> WafEngine:
        """Compile `profile` now (blocking: at start). `pin`: never drop it.
        Raises `InvalidConfig` when its engine or rules are absent or broken."""
        engine = self._built.get(profile) or self._keep(profile, self._compile(profile))
        if pin:
            self._pinned.add(profile)
        return engine

    async def built(self, profile: Profile) -> WafEngine:
        """The engine of `profile`, compiled in a worker thread if it is not yet;
        concurrent callers share one compilation. Raises `InvalidConfig` as `build`."""
        engine = self.get(profile)
        if engine is not None:
            return engine
        pending = self._building.get(profile)
        if pending is None:
            pending = asyncio.get_running_loop().run_in_executor(None, self._compile, profile)
            self._building[profile] = pending
            pending.add_done_callback(lambda f: self._settle(profile, f))
        return await asyncio.shield(pending)

    def _compile(self, profile: Profile) -> WafEngine:
        try:
            return WafEngine(profile)
        except InvalidConfig as e:
            self._failed[profile] = e
            raise

    def _settle(self, profile: Profile, done: asyncio.Future[WafEngine]) -> None:
        del self._building[profile]
        if not done.cancelled() and done.exception() is None:
            self._keep(profile, done.result())

    def _keep(self, profile: Profile, engine: WafEngine) -> WafEngine:
        if len(self._built) >= self.max_engines:
            old = next((p for p in self._built if p not in self._pinned), None)
            if old is not None:
                del self._built[old]
        self._built[profile] = engine
        return engine
