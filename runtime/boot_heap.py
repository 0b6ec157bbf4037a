"""`frozen()`: the objects a PoP holds after boot kept out of the cyclic GC's walks.

A full collection walks every object the GC tracks. A booted PoP holds ~70,000 of
them for its whole life (modules, classes, functions, its stages and stores), and
walking them took 55-70 ms of the loop on a loaded 2-core machine (150,000 and ~200 ms
in bench_kv.py's process, which holds the client too): a stall of every tenant's
requests each time the allocations of any thread tripped a full collection (once a
quiet phase of ``bench_kv.py --only large``). `gc.freeze()` moves them to the
permanent generation, which collections skip; what is made after boot is collected
as before.

Only for a process that runs one PoP for its life (``edgefn serve``/``dev``, each of
``workers = N``: `runtime.app.running_pop`'s ``freeze_heap``): frozen garbage is
never collected, so the heap is collected first, and a process that runs PoPs one
after another (the tests) does not freeze at all: there the cycles of every PoP
already stopped (their wasmtime engines, each reserving its instance pool's address
space) were frozen with the next one, until wasmtime could not reserve another
pool and aborted the test run.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_running = 0  # PoPs of this process inside `frozen()`


@contextlib.contextmanager
def frozen() -> Iterator[None]:
    """Collect, then freeze the heap; on exit of the last such PoP, unfreeze it."""
    global _running
    with _lock:
        _running += 1
        gc.collect()  # boot's own garbage is not kept for the PoP's life
        gc.freeze()
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            if not _running:
                gc.unfreeze()
