"""`edgefn cache purge ...` and `edgefn cache stats`: through a running PoP's
admin API (with ``EDGEFN_API_KEY`` when set, as the other commands)."""

from __future__ import annotations

import argparse
import json
from typing import Any

COLUMNS = (("CACHE", "cache", 6), ("FUNCTION", "function", 16), ("MODEL", "model", 16),
           ("TENANT", "tenant", 12), ("REQUESTS", "requests", 10), ("HITS", "hits", 8),
           ("HIT RATE", "hit_rate", 10), ("BYTES SERVED", "bytes_served", 14),
           ("SAVED MS", "saved_ms", 10))


def cache_command(args: argparse.Namespace) -> None:
    """Raises `AdminError` for what the PoP refuses (a bad purge value), `Failure`
    when no PoP runs on ``--data``."""
    from runtime.admin.client import AdminClient

    match args.op:
        case "purge":
            # the parser let exactly one through
            given = {k: v for k in ("key", "prefix", "tag", "function")
                     if (v := getattr(args, k)) is not None}
            if getattr(args, "topology", None):
                _purge_everywhere(args.topology, given, args.json)
                return
            result = _purge(AdminClient(args.data, timeout=30), given)
            print(json.dumps(result) if args.json else f"purged {result['purged']} entries")
        case "stats":
            rows = AdminClient(args.data, timeout=30).request("GET", "/v1/cache/stats")["stats"]
            if args.json:
                print(json.dumps(rows))
            else:
                _table(rows)


def _purge(client: Any, given: dict[str, str]) -> dict[str, Any]:
    result: dict[str, Any] = client.request("POST", "/v1/cache/purge", json.dumps(given).encode(),
                                            {"content-type": "application/json"})
    return result


def _purge_everywhere(run: str, given: dict[str, str], as_json: bool) -> None:
    """The same purge on every PoP of a topology, edges to central. Raises
    `AdminError` for what a PoP refuses, `Failure` when one cannot be reached."""
    from runtime.admin.client import AdminClient
    from runtime.topology.rundir import pop_dir, pop_names

    purged = {name: _purge(AdminClient(pop_dir(run, name), timeout=30), given)["purged"]
              for name in pop_names(run)}
    if as_json:
        print(json.dumps({"purged": purged}))
    else:
        print(f"purged {sum(purged.values())} entries on {len(purged)} PoPs")


def _table(rows: list[dict[str, Any]]) -> None:
    print("".join(f"{title:<{width}}" for title, _, width in COLUMNS).rstrip())
    for row in rows:
        cells = []
        for _, field, width in COLUMNS:
            value = row[field]
            if field == "hit_rate":
                value = f"{value:.1%}"
            cells.append(f"{(value if value != '' else '-')!s:<{width}}")
        print("".join(cells).rstrip())
