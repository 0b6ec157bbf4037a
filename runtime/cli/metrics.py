"""`edgefn metrics`: a running PoP's Prometheus exposition, through its admin API."""

from __future__ import annotations

import argparse


def metrics_command(args: argparse.Namespace) -> None:
    """Raises `AdminError` (404 when the PoP runs with ``[metrics] enabled = false``),
    `Failure` when no PoP runs on ``--data``."""
    from runtime.admin.client import AdminClient

    text = AdminClient(args.data, timeout=30).metrics()
    prefix = args.match
    for line in text.splitlines():
        name = line.split(" ", 3)[2] if line.startswith("# ") else line
        if prefix is None or name.startswith(prefix):
            print(line)
