"""`frozen()`: the objects a PoP holds after boot kept out of the cyclic GC's walks.

A full collection walks every object the GC tracks. A booted PoP holds ~70,000 of
them for its whole life (modules, classes, functions, its stages and stores), and
walking them took 55-70 ms of the loop on a loaded 2-core machine (150,000 and ~200 ms
in bench_kv.py's process, which holds the client too): a stall of every tenant's
requests each time the allocations of any thread tripped a full collection (once a
quiet phase of ``bench_kv.py --only large``). `gc.freeze()` moves them to the
permanent generation, which collections skip; what is made after boot is collected
as before.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_running = 0  # PoPs of this process inside `frozen()` (tests run several, on threads)


@contextlib.contextmanager
def frozen() -> Iterator[None]:
    """Freeze the heap now; on exit of the last such PoP, unfreeze it, so that a
    process running PoPs one after another (the tests) collects the cycles one left.
    No `gc.collect()` first: over the test process's heap it cost ~0.2 s a PoP, and
    the cycles boot leaves are few and returned at exit."""
    global _running
    with _lock:
        _running += 1
        gc.freeze()
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            if not _running:
                gc.unfreeze()
