"""The C handles behind py-lmdb's objects, for native code that reads the same
environment: its ``MDB_env *``, the LMDB engine vtable it uses, and a database's
``MDB_dbi``.

LMDB must not be opened twice in one process (its fcntl locks on lock.mdb belong
to the process: a second open shares them, closing it drops them), so native
readers in the PoP use py-lmdb's own environment and its own LMDB code. py-lmdb
3.0 exports its engines' vtables (``lmdb_api_v09``, ``lmdb_api_v10``: an
``MdbApi``, see ``lmdb/mdb_api.h``); the pointers are read from its private
object layouts (``lmdb/cpython.c``: ``EnvObject``, ``DbObject``), so the version
is pinned in pyproject.toml and every read is checked against something known
before it is trusted: the vtable pointer must be one of the exported ones, the
vtable's own version call must agree with its header, the environment's path
as LMDB reports it must be py-lmdb's, and a database must point back at its
environment. Any mismatch raises `NativeUnavailable` and callers keep the
Python path.
"""

from __future__ import annotations

import ctypes
import functools
import os
from ctypes import POINTER, c_char_p, c_int, c_uint, c_void_p
from typing import Any

import lmdb

HEAD = object.__basicsize__  # PyObject_HEAD
PTR = ctypes.sizeof(c_void_p)
# LmdbObject_HEAD: PyObject_HEAD, two list_heads (two pointers each), int valid (padded)
LMDB_HEAD = HEAD + 4 * PTR + PTR
ENV_ENV = LMDB_HEAD + PTR      # EnvObject: weaklist, then MDB_env *env
ENV_LIBV = ENV_ENV + PTR       # then const MdbApi *libv
DB_ENV = LMDB_HEAD             # DbObject: EnvObject *env, then MDB_dbi dbi
DB_DBI = DB_ENV + PTR
API_FNS = 16                   # MdbApi: 4 ints, then function pointers
API_ENV_GET_PATH = 14
API_VERSION_FN = 41            # the last entry
ENGINES = ("lmdb_api_v09", "lmdb_api_v10")


class NativeUnavailable(RuntimeError):
    """py-lmdb's C objects are not what this module expects (another version or
    implementation): use the Python path."""


@functools.cache
def _vtables() -> frozenset[int]:
    """Addresses of the engine vtables py-lmdb's extension exports."""
    module = getattr(lmdb, "cpython", None)
    if module is None or not getattr(module, "__file__", None):
        raise NativeUnavailable("py-lmdb runs without its C extension (lmdb.cpython)")
    lib = ctypes.CDLL(module.__file__)  # already loaded: the same handle
    found = set()
    for name in ENGINES:
        try:
            found.add(ctypes.addressof(c_void_p.in_dll(lib, name)))
        except ValueError:
            continue
    if not found:
        raise NativeUnavailable(f"py-lmdb {lmdb.__version__} exports no LMDB vtable")
    return frozenset(found)


def _ptr(address: int) -> int:
    return c_void_p.from_address(address).value or 0


def env_handles(env: lmdb.Environment) -> tuple[int, int]:
    """``(MdbApi *, MDB_env *)`` of an open py-lmdb environment.

    Raises `NativeUnavailable` if they cannot be found and checked.
    """
    if type(env) is not getattr(getattr(lmdb, "cpython", None), "Environment", None):
        raise NativeUnavailable(f"unexpected py-lmdb environment type {type(env)!r}")
    api, raw = _ptr(id(env) + ENV_LIBV), _ptr(id(env) + ENV_ENV)
    if api not in _vtables() or not raw:
        raise NativeUnavailable("py-lmdb's Environment layout is not the expected one")
    _check_version(api)
    path = c_char_p()
    get_path = ctypes.CFUNCTYPE(c_int, c_void_p, POINTER(c_char_p))(
        _ptr(api + _fn(API_ENV_GET_PATH)))
    if get_path(raw, ctypes.byref(path)) != 0 or path.value is None or \
            os.fsdecode(path.value) != env.path():
        raise NativeUnavailable("the LMDB environment's path is not py-lmdb's")
    return api, raw


def _fn(index: int) -> int:
    return API_FNS + index * PTR


def _check_version(api: int) -> None:
    """The vtable's header (major, minor, patch) must match what its last entry,
    ``version_fn``, reports: a table of another shape would not."""
    head = (c_int * 3).from_address(api)
    major, minor, patch = c_int(), c_int(), c_int()
    version = ctypes.CFUNCTYPE(c_char_p, POINTER(c_int), POINTER(c_int), POINTER(c_int))(
        _ptr(api + _fn(API_VERSION_FN)))
    text = version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
    if not text or tuple(head) != (major.value, minor.value, patch.value):
        raise NativeUnavailable("py-lmdb's LMDB vtable is not the expected one")


def dbi(env: lmdb.Environment, db: Any) -> int:
    """The ``MDB_dbi`` of py-lmdb database `db` of `env`. Raises `NativeUnavailable`."""
    if _ptr(id(db) + DB_ENV) != id(env):
        raise NativeUnavailable("py-lmdb's database layout is not the expected one")
    return c_uint.from_address(id(db) + DB_DBI).value
