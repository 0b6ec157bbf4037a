"""Opening an LMDB database handle while other threads of the process write.

py-lmdb's ``env.open_db(name)`` without a transaction begins a write transaction of
its own holding the GIL. Where another thread of the process holds the writer lock
and needs the GIL to commit (a binding thread's write), the two wait for each other
for good: a PoP worker whose first read of a namespace another process created came
during one of its own writes froze, and every process's writes with it, since the
lock is the environment's. `open_db` here opens it inside a write transaction begun
first, which waits for the lock without the GIL.
"""

from __future__ import annotations

from typing import Any


def open_db(env: Any, name: bytes, create: bool = False) -> Any:
    """The handle of database `name` of `env` (an `lmdb.Environment`), made if
    `create`. Raises `lmdb.NotFoundError` for one that does not exist (not
    `create`), `lmdb.Error` for another failure."""
    with env.begin(write=True) as txn:
        return env.open_db(name, txn=txn, create=create)
