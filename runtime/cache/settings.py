"""The caches' settings: pop.toml's ``[http_cache]`` and ``[ai_cache]``, and a
function's ``[cache.http]`` / ``[cache.ai]`` in its edgefn.toml (None: the PoP's
setting; see `runtime.security.settings.merge`)."""

from __future__ import annotations

from msgspec import Struct


class HttpCacheSettings(Struct, forbid_unknown_fields=True, frozen=True):
    """pop.toml ``[http_cache]``."""

    enabled: bool = True


class HttpCacheOverride(Struct, forbid_unknown_fields=True, frozen=True):
    """A function's ``[cache.http]``."""

    enabled: bool | None = None


class AICacheSettings(Struct, forbid_unknown_fields=True, frozen=True):
    """pop.toml ``[ai_cache]``."""

    enabled: bool = True


class AICacheOverride(Struct, forbid_unknown_fields=True, frozen=True):
    """A function's ``[cache.ai]`` (its ``ai`` binding's calls)."""

    enabled: bool | None = None


class CacheOverride(Struct, forbid_unknown_fields=True, frozen=True):
    """A function's ``[cache]``."""

    http: HttpCacheOverride | None = None
    ai: AICacheOverride | None = None


NO_CACHE_OVERRIDE = CacheOverride()
