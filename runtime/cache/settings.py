"""The caches' settings: pop.toml's ``[http_cache]`` and ``[ai_cache]``, and a
function's ``[cache.http]`` / ``[cache.ai]`` in its edgefn.toml (None: the PoP's
setting; see `runtime.security.settings.merge`)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

Bytes = Annotated[int, Meta(ge=0, le=1 << 40)]
Seconds = Annotated[int, Meta(ge=1, le=365 * 86400)]


class HttpCacheSettings(Struct, forbid_unknown_fields=True, frozen=True):
    """pop.toml ``[http_cache]``: the RFC 9111 cache of function responses
    (`runtime.cache.http`)."""

    enabled: bool = True
    memory_bytes: Bytes = 64 << 20  # the memory tier's budget (LRU)
    disk_bytes: Bytes = 256 << 20  # the LMDB tier under DATA/cache/http; 0: no disk tier
    max_entry_bytes: Annotated[int, Meta(ge=1, le=1 << 30)] = 8 << 20  # larger: not stored
    # freshness for a response that says nothing of it (no Cache-Control/Expires);
    # None: RFC behaviour, such a response is not stored
    default_ttl: Seconds | None = None


class HttpCacheOverride(Struct, forbid_unknown_fields=True, frozen=True):
    """A function's ``[cache.http]``: `enabled` and `default_ttl` of `HttpCacheSettings`."""

    enabled: bool | None = None
    default_ttl: Seconds | None = None


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
