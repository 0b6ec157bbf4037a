"""Embedded stores that functions bind to: a KV store on LMDB and a vector index on
usearch. A leaf package: it imports nothing from `runtime` or `gpu_worker`."""

import ctypes

# usearch's wheel carries its own libstdc++ and exports its symbols process-wide;
# a C++ library loaded after it (onnxruntime) binds to them and crashes on import.
# Loading the system libstdc++ globally first keeps every later library on it.
ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)

from .errors import KVError, LimitExceeded, NotFound, UnknownNamespace  # noqa: E402
from .store import Entry, KVStore, Page  # noqa: E402

__all__ = ["Entry", "KVError", "KVStore", "LimitExceeded", "NotFound", "Page",
           "UnknownNamespace"]
