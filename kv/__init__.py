"""Embedded stores that functions bind to: a KV store on LMDB and a vector index on
usearch. A leaf package: it imports nothing from `runtime` or `gpu_worker`.

A process that also loads onnxruntime must call
`edgefn_core.process.load_system_libstdcxx()` before importing `kv.vectors`.
"""

from edgefn_core.errors import KeyNotFound, LimitExceeded, StoreError, UnknownNamespace

from .store import Entry, KVStore, Page

__all__ = ["Entry", "KVStore", "KeyNotFound", "LimitExceeded", "Page", "StoreError",
           "UnknownNamespace"]
