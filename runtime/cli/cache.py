"""`edgefn cache purge ...` and `edgefn cache stats`: through a running PoP's
admin API (with ``EDGEFN_API_KEY`` when set, as the other commands).

On a topology a purge goes to the central PoP first, then the regionals, then the
edges: an edge miss between two of the purges can then not be refilled from a
tier above that still holds the purged answer."""

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
            path, given = _purge_request(args)
            if getattr(args, "topology", None):
                _purge_everywhere(args.topology, path, given, args.json)
                return
            result = _purge(AdminClient(args.data, timeout=30), path, given)
            print(json.dumps(result) if args.json else f"purged {result['purged']} entries")
        case "stats":
            rows = AdminClient(args.data, timeout=30).request("GET", "/v1/cache/stats")["stats"]
            if args.json:
                print(json.dumps(rows))
            else:
                _table(rows)


def _purge_request(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The admin path and body of a purge. Raises `Failure` (usage) for --model or
    --tenant without --ai."""
    from edgefn_core.errors import Failure

    if args.ai:
        given = {k: v for k in ("model", "tenant") if (v := getattr(args, k)) is not None}
        return "/v1/cache/ai/purge", given or {"all": True}
    if args.model is not None or args.tenant is not None:
        raise Failure("usage", 400, "--model and --tenant select AI cache entries: add --ai")
    # the parser let exactly one through
    return "/v1/cache/purge", {k: v for k in ("key", "prefix", "tag", "function")
                               if (v := getattr(args, k)) is not None}


def _purge(client: Any, path: str, given: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = client.request("POST", path, json.dumps(given).encode(),
                                            {"content-type": "application/json"})
    return result


TIER_ORDER = {"central": 0, "regional": 1, "edge": 2}


def _purge_everywhere(run: str, path: str, given: dict[str, Any], as_json: bool) -> None:
    """The same purge on every PoP of a topology, from central to the edges. A PoP
    that refuses or cannot be reached does not stop the others: the result names it.
    Raises `Failure` (``partial_purge``) after printing, when any PoP was not purged."""
    from edgefn_core.errors import EdgefnError, Failure
    from runtime.admin.client import AdminClient
    from runtime.topology.rundir import pop_dir

    purged: dict[str, int] = {}
    failed: dict[str, str] = {}
    for name in _top_down(run):
        try:
            purged[name] = _purge(AdminClient(pop_dir(run, name), timeout=30), path,
                                  given)["purged"]
        except EdgefnError as e:
            failed[name] = str(e)
    if as_json:
        print(json.dumps({"purged": purged, **({"failed": failed} if failed else {})}))
    else:
        print(f"purged {sum(purged.values())} entries on {len(purged)} PoPs")
    if failed:
        raise Failure("partial_purge", 502, "not purged on " + "; ".join(
            f"{name} ({why})" for name, why in failed.items())
            + ": purge again once they run (their entries stay until then)")


def _top_down(run: str) -> list[str]:
    """The PoPs of `run` (as its state file lists them; without one, every data dir):
    central, then regionals, then edges, by name within a tier."""
    from runtime.topology.rundir import pop_names, read_state

    state = read_state(run)
    if state is None:
        names = pop_names(run)
        if not names:  # a typo'd folder: "purged 0 entries on 0 PoPs", exit 0
            from edgefn_core.errors import NotFound

            raise NotFound(f"{run}: no topology run here (no topology.json and no PoP "
                           "data dirs; `edgefn topology up` makes one)")
        return names
    return [p.name for p in sorted(state.pops, key=lambda p: (TIER_ORDER.get(p.tier, 3),
                                                              p.name))]


def _table(rows: list[dict[str, Any]]) -> None:
    """Each column as wide as its longest cell and two spaces (at least its set width)."""
    cells = [[_cell(row[field], field) for _, field, _ in COLUMNS] for row in rows]
    widths = [max([width, len(title) + 2, *(len(c[i]) + 2 for c in cells)])
              for i, (title, _, width) in enumerate(COLUMNS)]
    print("".join(f"{title:<{w}}" for (title, _, _), w in zip(COLUMNS, widths, strict=True))
          .rstrip())
    for line in cells:
        print("".join(f"{c:<{w}}" for c, w in zip(line, widths, strict=True)).rstrip())


def _cell(value: Any, field: str) -> str:
    if field == "hit_rate":
        return f"{value:.1%}"
    return "-" if value == "" else str(value)
