"""The caches' settings: pop.toml's ``[http_cache]`` and ``[ai_cache]``, and a
function's ``[cache.http]`` / ``[cache.ai]`` in its edgefn.toml (None: the PoP's
setting; see `runtime.security.settings.merge`)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

Bytes = Annotated[int, Meta(ge=0, le=1 << 40)]
Seconds = Annotated[int, Meta(ge=1, le=365 * 86400)]
Similarity = Annotated[float, Meta(gt=0.0, le=1.0)]
TtlSeconds = Annotated[float, Meta(gt=0.0, le=365 * 86400.0)]


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
    """pop.toml ``[ai_cache]`` (see `runtime.cache.ai`)."""

    enabled: bool = True
    semantic: bool = True  # also serve similar prompts (chat and completions)
    # cache only calls whose output is reproducible: temperature 0 or a fixed seed
    deterministic_only: bool = True
    # cosine similarity a semantic hit needs; None: the guards' `DEFAULT_THRESHOLD`
    threshold: Similarity | None = None
    ttl_seconds: TtlSeconds = 3600.0  # how long an entry is served (x-edgefn-cache-ttl per request)
    # how long past its TTL an entry is kept to answer a call whose model origin failed
    # (502, 503, 504), marked `x-edgefn-cache: stale`; 0: never
    stale_if_error_s: Annotated[float, Meta(ge=0, le=30 * 86400)] = 0.0
    max_entries_per_scope: Annotated[int, Meta(ge=1, le=1_000_000)] = 1000  # LRU beyond
    max_scopes: Annotated[int, Meta(ge=1, le=1_000_000)] = 10_000  # least recently used go
    embedding_model: Annotated[str, Meta(min_length=1, max_length=200)] = "all-minilm-l6-v2"


class AICacheOverride(Struct, forbid_unknown_fields=True, frozen=True):
    """A function's ``[cache.ai]`` (its ``ai`` binding's calls)."""

    enabled: bool | None = None
    semantic: bool | None = None
    deterministic_only: bool | None = None
    threshold: Similarity | None = None
    ttl_seconds: TtlSeconds | None = None


class CacheOverride(Struct, forbid_unknown_fields=True, frozen=True):
    """A function's ``[cache]``."""

    http: HttpCacheOverride | None = None
    ai: AICacheOverride | None = None


NO_CACHE_OVERRIDE = CacheOverride()
