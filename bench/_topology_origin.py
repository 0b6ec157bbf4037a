"""Why chat requests of bench_topology's distributed run reached the origin: one
row per chat request (geography, intent, wording, what the edge's and the
regional's AI caches decided, and whether central was asked), from the request
ids the bench sends and each PoP's events.

The floor: a chat request must reach the origin when no request of its intent
(the same paraphrase group of bench/data/semantic_eval.jsonl; a one-off is its
own intent) came earlier in its region, since regions share no cache and central
keeps none. Every other origin call is a repeat that a tier could have served:
it is named with the best candidate's similarity and the guard that vetoed it,
and marked "concurrent" when the earlier request of its intent had not finished
when this one was sent (only in-flight coalescing could have served it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runtime.admin.client import AdminClient
from runtime.topology.load import Sample
from runtime.topology.rundir import pop_dir

EVAL = Path(__file__).resolve().parent / "data" / "semantic_eval.jsonl"


def intents() -> dict[str, str]:
    """Wording -> its paraphrase group (the bench's pool draws from these)."""
    out: dict[str, str] = {}
    for line in EVAL.read_text().splitlines():
        row = json.loads(line)
        if row["kind"] == "paraphrase":
            out.setdefault(row["a"], row["group"])
            out.setdefault(row["b"], row["group"])
    return out


def decisions(run: Path, pops: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per PoP: request id -> its ``ai_cache`` decision ({} when the PoP has no AI
    cache), for the chat requests in its event ring."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for pop in pops:
        events = AdminClient(pop_dir(run, pop), timeout=30).request(
            "GET", "/v1/events?path=/v1/chat/completions&limit=10000")["events"]
        out[pop] = {e["rid"]: e.get("decisions", {}).get("ai_cache", {}) for e in events}
    return out


def rows(sent: dict[str, tuple[str, str, Sample]], edge_of: dict[str, str],
         region_of: dict[str, str], seen: dict[str, dict[str, dict[str, Any]]]
         ) -> list[dict[str, Any]]:
    """One row per chat request, in the order they were sent. `sent`: request id ->
    (geo, wording, sample); `edge_of`: geo -> its edge; `region_of`: geo -> its
    regional PoP; `seen`: `decisions` of every PoP, central's under "central"."""
    groups = intents()
    out = []
    for rid, (geo, wording, s) in sorted(sent.items(), key=lambda kv: kv[1][2].started):
        regional = seen[region_of[geo]].get(rid)
        out.append({"rid": rid, "geo": geo, "intent": groups.get(wording, "one-off:" + rid),
                    "wording": wording, "status": s.status, "started": s.started,
                    "ended": s.started + s.seconds,
                    "edge": seen[edge_of[geo]].get(rid, {}),
                    "regional": regional if regional is not None else {"outcome": "-"},
                    "origin": rid in seen["central"]})
    return out


def classify(table: list[dict[str, Any]], region_of: dict[str, str]) -> None:
    """Adds "why" to each row that reached the origin: first (its intent's first
    request in the region), repeat (one had finished before it was sent) or
    concurrent (one was still in flight)."""
    done: dict[tuple[str, str], float] = {}  # (region, intent) -> earliest end
    for row in table:
        key = (region_of[row["geo"]], row["intent"])
        if row["origin"]:
            if key not in done:
                row["why"] = "first"
            else:
                row["why"] = "repeat" if done[key] <= row["started"] else "concurrent"
        done[key] = min(done.get(key, row["ended"]), row["ended"])


def report(table: list[dict[str, Any]], region_of: dict[str, str], total: int,
           log: Path | None) -> None:
    """Prints the floor, the origin calls beyond it, and (to `log`) every row."""
    classify(table, region_of)
    origin = [r for r in table if r["origin"]]
    first = sum(r["why"] == "first" for r in origin)
    print(f"origin floor: {first} chat requests were their intent's first in their region "
          f"(origin requests at best {first}, cut {1 - first / total:.1%} of {total}); "
          f"reached central: {len(origin)}")
    for r in origin:
        if r["why"] != "first":
            e, g = r["edge"], r["regional"]
            print(f"  {r['why']:<10} {r['geo']:<9} {r['intent']:<15} {r['wording'][:48]!r:<50} "
                  f"edge {e.get('outcome', '-')} {_near(e)}; regional {g.get('outcome', '-')} "
                  f"{_near(g)}")
    if log is not None:
        log.write_text("".join(json.dumps(r) + "\n" for r in table))
        print(f"per-request log: {log}")


def _near(decision: dict[str, Any]) -> str:
    """The best candidate a miss had: its similarity and the guard that refused it."""
    sim, guard = decision.get("similarity"), decision.get("guard")
    if sim is None:
        return "(no candidate >= threshold)"
    return f"(best {sim:.3f}" + (f", vetoed: {guard})" if guard else ")")
