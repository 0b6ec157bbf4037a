"""Where a spawned worker process starts: the system libstdc++ first, before
anything imports usearch (`edgefn_core.process.load_system_libstdcxx`; the parent
did the same in `runtime.cli.start`, but a spawned child starts afresh), then the
worker itself (`primary.worker_main`). This module and what unpickling the
worker's arguments imports (`runtime.config`, `runtime.workers.role`) load no
native library: importing `primary` here at the top would load usearch first, and
the WAF's libmodsecurity then refuses to parse rules (a worker with ``[waf] mode =
"block"`` exited at start)."""

from __future__ import annotations

from typing import Any

from edgefn_core.process import load_system_libstdcxx


def main(*args: Any) -> None:
    """`primary.worker_main(*args)`, after the system libstdc++."""
    load_system_libstdcxx()
    from runtime.workers.primary import worker_main

    worker_main(*args)
