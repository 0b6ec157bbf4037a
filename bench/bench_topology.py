"""The seeds' latency table, measured: one replayable workload run twice on the same
emulated network (`edgefn topology`, the default functions/examples/topology.toml).

    python bench/bench_topology.py [--quick] [--per-geo 60] [--tokens 12] [--seed 14]
                                   [--log requests.jsonl] [--regional-models] [--boots 3]
                                   [--one-off 0.4]

(a) centralized: every geography's clients talk to the central PoP over the
    long-haul link (central_rtt_ms), which runs the functions and the model; no cache.
(b) distributed: clients enter at their geography's edge (client_edge_rtt_ms): the
    full pipeline, the functions, the exact + semantic AI cache; a miss goes to the
    edge's regional (its own AI cache), then to central (no cache there, in both runs).
    --regional-models: every regional runs the chat model itself (regional inference,
    ``models = ["smollm2-135m"]``), so a regional miss is generated there.
Each geography is one client thread sending its requests in sequence on a keep-alive
connection; all geographies at once, after one warm-up chat per geography and mode
(not counted). --quick: two edges (eu-west, us-east), one regional, fewer requests.

The workload (random.Random(--seed), the same in both runs): per geography, FN_SHARE
of requests need no model (GET /hello, a WASM function, and /py/hello, a Python one,
alternating); the rest are chat requests (streamed, temperature 0, --tokens tokens).
A chat request is a one-off question (a share --one-off of them, ONE_OFF by default: the
`a` side of the "trap" pairs of bench/data/semantic_eval.jsonl, each used once; more of
them, a lower hit rate) or one of POOL support/search
intents (that file's paraphrase groups), picked by Zipf-like frequency (1/rank^1.1),
asked in any of its wordings: exact repeats and paraphrases, across geographies.

Printed: global and per-geography p50/p95/p99, TTFT (first streamed bytes) of chat
requests, origin load (requests reaching the central PoP, and model calls it made,
from its metrics), exact and semantic hit rates (edge: x-edgefn-cache; regional: its
metrics), and the cold-start penalty: the first request to each function on each PoP
(a fresh connection, straight to the PoP: no link, after a pause) against the median of
the next five requests after the same pause, and against five back-to-back ones, with a
noise control beside it (round 2 alone against rounds 3-6); then, over --boots boots of
the topology (the extra ones run only those rounds), the median of the first requests
against the median of the warm ones (bench/_topology_cold.py).
Seeds' claims beside them: p50 cut >= 75 %, origin load cut >= 60 % at a 20-40 % hit
rate, first request <= 1.2x warm. Then why chat requests reached the origin
(`_topology_origin`): the floor (each intent's first request in a region must) and
every origin call beyond it, with what the edge's and the regional's caches decided;
--log writes that per request (geo, intent, wording, edge and regional decisions).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _topology_cold as cold
import _topology_origin as origin

from runtime.admin.client import AdminClient
from runtime.topology import runner, spec
from runtime.topology.load import Client, Sample, metric_sum, percentile
from runtime.topology.rundir import pop_dir

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "functions" / "examples"
FUNCTIONS = [str(EXAMPLES / "hello-wat"), str(EXAMPLES / "python-hello")]
PATHS = ["/hello", "/py/hello"]
CHAT = "smollm2-135m"
FN_SHARE = 0.4
ONE_OFF = 0.4
POOL = 24
BOOTS = 3  # cold-start boots by default: the whole bench takes about 3 min, quiet


def topology(quick: bool, regional_models: bool = False) -> spec.Topology:
    """The default topology, every PoP with the two functions, no AI cache at central;
    --quick keeps two edges and what they need; `regional_models`: every regional
    runs the chat model itself."""
    topo = spec.load(EXAMPLES / "topology.toml")
    pops = topo.pop
    if quick:
        keep = {"eu-west", "us-east", "emea-apac", "central"}
        pops = [msgspec.structs.replace(p, parents=[q for q in p.parents if q in keep])
                for p in pops if p.name in keep]
    central = {"ai_cache": {"enabled": False}, "http_cache": {"enabled": False}}
    pops = [msgspec.structs.replace(p, functions=FUNCTIONS, settings=central if
                                    p.tier == "central" else p.settings) for p in pops]
    if regional_models:
        pops = [msgspec.structs.replace(p, models=[CHAT]) if p.tier == "regional" else p
                for p in pops]
    return msgspec.structs.replace(topo, pop=pops, region=[])


def workload(seed: int, geos: list[str], per_geo: int, one_off: float = ONE_OFF
             ) -> dict[str, list[tuple[str, str]]]:
    """Per geography: (kind, what) with kind fn (a path) or chat (a question);
    `one_off`: the share of chat requests that are one-off questions."""
    rows = [json.loads(line) for line in (ROOT / "bench/data/semantic_eval.jsonl").open()]
    groups: dict[str, list[str]] = {}
    for r in rows:
        if r["kind"] == "paraphrase":
            phrasings = groups.setdefault(r["group"], [r["a"]])
            phrasings.append(r["b"])
    rng = random.Random(seed)
    pool = rng.sample(sorted(groups.values()), POOL)
    oneoffs = [r["a"] for r in rows if r["label"] == "trap"]
    rng.shuffle(oneoffs)
    weights = [1 / (rank + 1) ** 1.1 for rank in range(len(pool))]
    out: dict[str, list[tuple[str, str]]] = {}
    for geo in geos:
        seq = []
        for i in range(per_geo):
            if rng.random() < FN_SHARE:
                seq.append(("fn", PATHS[i % 2]))
            elif rng.random() < one_off and oneoffs:
                seq.append(("chat", oneoffs.pop()))
            else:
                seq.append(("chat", rng.choice(rng.choices(pool, weights)[0])))
        out[geo] = seq
    return out


def chat_body(question: str, tokens: int) -> bytes:
    return json.dumps({"model": CHAT, "messages": [{"role": "user", "content": question}],
                       "max_tokens": tokens, "temperature": 0, "stream": True}).encode()


def replay(ports: dict[str, int], load: dict[str, list[tuple[str, str]]], tokens: int,
           sent: dict[str, tuple[str, str, Sample]] | None = None, mode: str = "w"
           ) -> list[Sample]:
    """Every geography's sequence at once, one thread each. Each chat request has
    the id MODE-GEO-I; `sent` gets id -> (geo, question, sample)."""
    samples: list[Sample] = []

    def one(geo: str) -> None:
        client = Client(geo, ports[geo])
        for i, (kind, what) in enumerate(load[geo]):
            if kind == "fn":
                samples.append(client.send("fn", "GET", what))
                continue
            rid = f"{mode}-{geo}-{i}"
            samples.append(client.send("chat", "POST", "/v1/chat/completions",
                                       chat_body(what, tokens),
                                       {"content-type": "application/json", "x-request-id": rid}))
            if sent is not None:
                sent[rid] = (geo, what, samples[-1])
        client.close()

    threads = [threading.Thread(target=one, args=(g,)) for g in load]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return samples


def counters(run: Path, names: list[str]) -> dict[str, dict[str, float]]:
    """Per PoP: requests, model calls, AI cache hits by kind (from its /metrics)."""
    out = {}
    for name in names:
        text = AdminClient(pop_dir(run, name), timeout=30).metrics()
        out[name] = {
            "requests": metric_sum(text, "edgefn_requests_total"),
            "model": metric_sum(text, "edgefn_ai_request_success_total"),
            # generated by this PoP's own worker (a forwarded call is not)
            "generated": metric_sum(text, "edgefn_ai_worker_requests_total"),
            "hit-exact": metric_sum(text, "edgefn_cache_requests_total", cache="ai",
                                    outcome="hit-exact"),
            "hit-semantic": metric_sum(text, "edgefn_cache_requests_total", cache="ai",
                                       outcome="hit-semantic")}
    return out


def delta(after: dict[str, dict[str, float]], before: dict[str, dict[str, float]]
          ) -> dict[str, dict[str, float]]:
    return {p: {k: after[p][k] - before[p][k] for k in after[p]} for p in after}


def ms(s: float) -> str:
    return f"{s * 1000:8.1f}"


def summary(label: str, samples: list[Sample]) -> dict[str, float]:
    ok = [s for s in samples if s.status == 200]
    lat = [s.seconds for s in ok]
    ttft = [s.ttfb for s in ok if s.kind == "chat"]
    return {"n": len(samples), "failed": len(samples) - len(ok),
            "p50": percentile(lat, 0.5), "p95": percentile(lat, 0.95),
            "p99": percentile(lat, 0.99), "ttft50": percentile(ttft, 0.5),
            "ttft95": percentile(ttft, 0.95)}


def cut(a: float, b: float) -> str:
    return f"{(1 - b / a) * 100:6.1f} %" if a else "     -"


def report(a: list[Sample], b: list[Sample], ca: dict[str, dict[str, float]],
           cb: dict[str, dict[str, float]], colds: list[list[cold.Cold]],
           regionals: list[str]) -> dict[str, Any]:
    sa, sb = summary("a", a), summary("b", b)
    print(f"\n{'':28}{'(a) central':>14}{'(b) distributed':>17}{'cut':>10}   seeds' claim")
    for key, claim in (("p50", "p50 cut >= 75 %"), ("p95", ""), ("p99", ""),
                       ("ttft50", "(TTFT p50, chat)"), ("ttft95", "(TTFT p95, chat)")):
        print(f"global {key:<21}{ms(sa[key]):>11} ms{ms(sb[key]):>14} ms{cut(sa[key], sb[key]):>10}"
              f"   {claim}")
    for geo in sorted({s.geo for s in a}):
        ga = summary(geo, [s for s in a if s.geo == geo])
        gb = summary(geo, [s for s in b if s.geo == geo])
        print(f"{geo:<13} p50/p95/p99 {ms(ga['p50'])}/{ms(ga['p95']).strip()}/"
              f"{ms(ga['p99']).strip()} ms  ->{ms(gb['p50'])}/{ms(gb['p95']).strip()}/"
              f"{ms(gb['p99']).strip()} ms")
    origin_a, origin_b = ca["central"]["requests"], cb["central"]["requests"]
    model_a, model_b = ca["central"]["model"], cb["central"]["model"]
    print(f"{'origin requests (central)':<28}{origin_a:>11.0f}{origin_b:>17.0f}"
          f"{cut(origin_a, origin_b):>10}   origin load cut >= 60 %")
    print(f"{'model calls (central)':<28}{model_a:>11.0f}{model_b:>17.0f}"
          f"{cut(model_a, model_b):>10}")
    gen_a, gen_b = (sum(c[r]["generated"] for r in regionals) for c in (ca, cb))
    print(f"{'generated at regionals':<28}{gen_a:>11.0f}{gen_b:>17.0f}"
          "             (regional inference: --regional-models)")
    chats = [s for s in b if s.kind == "chat"]
    edge_exact = sum(s.cache == "hit-exact" for s in chats)
    edge_sem = sum(s.cache == "hit-semantic" for s in chats)
    reg_exact = sum(cb[r]["hit-exact"] for r in regionals)
    reg_sem = sum(cb[r]["hit-semantic"] for r in regionals)
    n = max(1, len(chats))
    hit = (edge_exact + edge_sem + reg_exact + reg_sem) / n
    print(f"hit rates of {len(chats)} chat requests: edge exact {edge_exact / n:.1%}, edge "
          f"semantic {edge_sem / n:.1%}, regional exact {reg_exact / n:.1%}, regional "
          f"semantic {reg_sem / n:.1%}: total {hit:.1%}   (seeds: 20-40 %)")
    print(f"failed requests: (a) {sa['failed']} of {sa['n']}, (b) {sb['failed']} of {sb['n']}")
    for mode, samples in (("a", a), ("b", b)):
        for s in [s for s in samples if s.status != 200][:5]:  # what went wrong, said
            print(f"  ({mode}) {s.geo} {s.kind}: status {s.status} {s.error[:160]}")
    worst = cold.report(colds)
    return {"p50_cut": 1 - sb["p50"] / sa["p50"] if sa["p50"] else 0.0,
            "origin_cut": 1 - origin_b / origin_a if origin_a else 0.0, "hit_rate": hit,
            "worst_cold": worst, "failed": sa["failed"] + sb["failed"]}


def explain_origin(run: Path, topo: spec.Topology, sent: dict[str, tuple[str, str, Sample]],
                   total: int, log: Path | None) -> None:
    """Which chat requests of the distributed run reached central, and why."""
    edges = topo.edges()
    region_of = {p.geo: p.parents[0] for p in edges}
    seen = origin.decisions(run, [p.name for p in topo.pop if p.tier != "central"] + ["central"])
    table = origin.rows(sent, {p.geo: p.name for p in edges}, region_of, seen)
    origin.report(table, region_of, total, log)


def extra_boot(topo: spec.Topology, k: int) -> list[cold.Cold]:
    """Boot `k` (of --boots): the topology up in a new directory, the cold-start
    rounds, down."""
    with tempfile.TemporaryDirectory(prefix="bench-topology-boot-") as tmp:
        t = time.monotonic()
        runner.up(topo, Path(tmp), "bench_topology", timeout=300)
        print(f"boot {k}: topology up in {time.monotonic() - t:.1f} s, cold-start rounds only")
        try:
            return cold.measure(Path(tmp), topo, PATHS, back=False)
        finally:
            runner.down(Path(tmp))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="two edges, 10 requests per geo")
    ap.add_argument("--per-geo", type=int, default=60, help="requests per geography")
    ap.add_argument("--tokens", type=int, default=12, help="max_tokens of chat requests")
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--log", type=Path, help="write one JSON line per chat request of the "
                    "distributed run: geo, intent, wording, edge and regional decisions")
    ap.add_argument("--regional-models", action="store_true", help="every regional runs "
                    "the chat model itself (regional inference)")
    ap.add_argument("--boots", type=int, default=BOOTS, help="bring the topology up this "
                    "many times for the cold-start rounds (only they run on the extra boots); "
                    "the pooled table compares the median of the first requests")
    ap.add_argument("--one-off", type=float, default=ONE_OFF, help="share of chat requests "
                    "that are one-off questions (more: a lower hit rate)")
    args = ap.parse_args(argv)
    if args.boots < 1:
        ap.error(f"--boots must be at least 1, got {args.boots}")
    if not 0 <= args.one_off <= 1:
        ap.error(f"--one-off must be between 0 and 1, got {args.one_off}")
    per_geo = 10 if args.quick else args.per_geo
    topo = topology(args.quick, args.regional_models)
    geos = [p.geo for p in topo.edges()]
    load = workload(args.seed, geos, per_geo, args.one_off)
    colds = [extra_boot(topo, k) for k in range(1, args.boots)]
    with tempfile.TemporaryDirectory(prefix="bench-topology-") as tmp:
        run = Path(tmp)
        t = time.monotonic()
        runner.up(topo, run, "bench_topology", timeout=300)
        print(f"topology up: {len(topo.pop)} PoPs in {time.monotonic() - t:.1f} s; "
              f"workload: {per_geo} requests x {len(geos)} geographies, seed {args.seed}, "
              f"one-off share {args.one_off}")
        try:
            colds.append(cold.measure(run, topo, PATHS, back=True))
            net = runner.read_network(run)
            names = [p.name for p in topo.pop]
            regionals = [p.name for p in topo.pop if p.tier == "regional"]
            for ports in (net.direct, net.entries):  # each PoP's first model call, uncounted
                replay(ports, {g: [("chat", f"Warm-up {i} from {g}.")] for i, g in
                               enumerate(geos)}, args.tokens)
            before = counters(run, names)
            a = replay(net.direct, load, args.tokens, mode="a")
            mid = counters(run, names)
            sent: dict[str, tuple[str, str, Sample]] = {}
            b = replay(net.entries, load, args.tokens, sent, "b")
            after = counters(run, names)
            result = report(a, b, delta(mid, before), delta(after, mid), colds, regionals)
            explain_origin(run, topo, sent, len(b), args.log)
            return result
        finally:
            runner.down(run)


if __name__ == "__main__":
    main()
