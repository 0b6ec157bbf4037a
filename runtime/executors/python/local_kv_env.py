"""Python functions' KV reads in the isolate host (``EDGEFN_PYTHON_KV=local``, off by
default): what the PoP hands a host (`plan`) and how the host opens the KV store
read-only before its sandbox closes (`open_env`); the reads are `local_kv`'s.

Off by default because the host then maps the whole LMDB file (every owner's
namespaces) and its lock file into a process that runs the function's code, and
that code can use ctypes: turn it on only where every Python function deployed
on the PoP may be trusted with every namespace (one tenant). README: "KV and
vector bindings".
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.bindings import Bindings

SWITCH = "EDGEFN_PYTHON_KV"  # "local": reads in the host; anything else: over the socket
_KEEP: list[Any] = []  # the host's environment and mapping live as long as the process


def enabled() -> bool:
    """Read at each deploy. ``EDGEFN_NATIVE_KV=0`` (no native KV reads) wins."""
    return (os.environ.get(SWITCH) == "local"
            and os.environ.get("EDGEFN_NATIVE_KV", "1") != "0")


def plan(bindings: Bindings | None) -> dict[str, Any]:
    """`HostConfig` fields that make a host read `bindings`' KV namespaces in place,
    or {} (the socket path): switched off, no KV binding, or a store whose clock is
    not the wall clock (expiry is decided on the wall clock in the host)."""
    if bindings is None or not bindings.kv.namespaces or not enabled():
        return {}
    stores = bindings.kv.stores
    kv = stores.kv
    if kv.clock is not time.time:
        return {}
    return {"kv_dir": kv.env.path(), "kv_map_size": kv.env.info()["map_size"],
            "kv_namespaces": tuple(sorted(bindings.kv.namespaces)),
            "kv_generation_fd": stores.owners.generation_fd}


def open_env(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """In the host, before its sandbox: the KV store opened read-only and what
    `local_kv.LocalKV` needs (plain values), or None (logged): reads go to the PoP."""
    if not cfg.get("kv_dir"):
        return None
    import lmdb

    from kv import lmdb_handles
    try:
        generation = _map_counter(cfg["kv_generation_fd"])
        # max_dbs: room for every declared namespace, opened by the isolates (`local_kv`)
        env = lmdb.open(cfg["kv_dir"], readonly=True, lock=True, subdir=True, create=False,
                        map_size=cfg["kv_map_size"], max_dbs=len(cfg["kv_namespaces"]) + 1)
        _KEEP.append(env)
        api, raw = lmdb_handles.env_handles(env)
        with env.begin():
            pass  # the first read takes this process's lock on lock.mdb, before seccomp
        return {"api": api, "env": raw, "generation": generation, "lock": _mutex()}
    except (OSError, lmdb.Error, lmdb_handles.NativeUnavailable) as e:
        print(f"edgefn isolate host: KV reads go to the PoP ({type(e).__name__}: {e})",
              file=sys.stderr, flush=True)
        return None


def _mutex() -> int:
    """The address of a process-wide pthread mutex (isolates' interpreters share no
    Python lock): LMDB allows one ``mdb_dbi_open`` at a time in a process."""
    libc = ctypes.CDLL(None)
    mutex = ctypes.create_string_buffer(64)  # pthread_mutex_t is 40 bytes on x86-64
    if libc.pthread_mutex_init(mutex, None):
        raise OSError("cannot create a mutex")
    _KEEP.append(mutex)
    return ctypes.addressof(mutex)


def _map_counter(fd: int) -> int:
    """The address of the PoP's claims generation, mapped read-only for the life of
    the process from `fd` (a read-only descriptor, so the mapping cannot be made
    writable), which is closed. Raises OSError."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    try:
        address = libc.mmap(None, 8, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    finally:
        os.close(fd)
    if address in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "cannot map the owners' generation")
    return int(address)
