"""Embedded stores that functions bind to: a KV store on LMDB and a vector index on
usearch. A leaf package: it imports nothing from `runtime` or `gpu_worker`."""

from .errors import KVError, LimitExceeded, NotFound, UnknownNamespace
from .store import Entry, KVStore, Page

__all__ = ["Entry", "KVError", "KVStore", "LimitExceeded", "NotFound", "Page",
           "UnknownNamespace"]
