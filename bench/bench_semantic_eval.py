"""The semantic cache's decision rule on a labelled, held-out set of prompt pairs.

    python bench/bench_semantic_eval.py [--veto-rounds 10]

Data: bench/data/semantic_eval.jsonl (written by bench/data/semantic_eval_source.py):
paraphrase pairs that one answer serves ("hit") and traps whose answers differ,
by kind (negation, number, date, unit, entity, comparative, constraint, scope),
split train/test per kind by group with a fixed seed before any tuning.

Every prompt is `normalize`d and embedded with the real MiniLM (the worker's ONNX
engine, in process). A pair is served when its cosine similarity is at least the
threshold: (a) similarity alone, (b) similarity and no `veto` from the guards.
Printed per split, over thresholds 0.60..0.98: the share of should-hit pairs
served and the wrong-answer rate (traps served / traps); per trap kind at the
default; the baseline = (a)'s best served share at wrong <= 1 %; (b) at
`DEFAULT_THRESHOLD` and its ratio to the baseline; the threshold the train split
picks (see `pick_threshold`); and µs per `veto` call.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgefn_core.process import load_system_libstdcxx  # noqa: E402

load_system_libstdcxx()

import numpy as np  # noqa: E402

from gpu_worker.engines.onnx import Embedder, load_session, load_tokenizer, model_files  # noqa: E402
from runtime.cache.ai.features import clear_cache, features  # noqa: E402
from runtime.cache.ai.guards import DEFAULT_THRESHOLD, normalize, veto  # noqa: E402

DATA = ROOT / "bench" / "data" / "semantic_eval.jsonl"
THRESHOLDS = [round(0.60 + 0.02 * i, 2) for i in range(20)]  # 0.60 .. 0.98
MAX_WRONG = 0.01


def load() -> list[dict]:
    return [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]


def similarities(rows: list[dict]) -> np.ndarray:
    """Cosine similarity of each pair's normalized prompts under MiniLM."""
    onnx_file, tokenizer_file = model_files("minilm", "auto")
    embedder = Embedder(load_session(onnx_file, 2), load_tokenizer(tokenizer_file), onnx_file)
    texts = sorted({normalize(r[k]) for r in rows for k in ("a", "b")})
    vecs, _ = embedder.embed(texts)
    index = {t: i for i, t in enumerate(texts)}
    a = vecs[[index[normalize(r["a"])] for r in rows]]
    b = vecs[[index[normalize(r["b"])] for r in rows]]
    return np.einsum("ij,ij->i", a, b)


def rates(rows: list[dict], sims: np.ndarray, vetoes: list[str | None], t: float,
          guarded: bool) -> tuple[float, float]:
    """(share of hits served, share of traps served) at threshold `t`."""
    served = [s >= t and (not guarded or v is None) for s, v in zip(sims, vetoes, strict=True)]
    hits = [s for s, r in zip(served, rows, strict=True) if r["label"] == "hit"]
    traps = [s for s, r in zip(served, rows, strict=True) if r["label"] == "trap"]
    return sum(hits) / len(hits), sum(traps) / len(traps)


MIN_SERVED = 0.60  # twice the 30 % target: the margin for paraphrases never seen


def pick_threshold(rows: list[dict], sims: np.ndarray, vetoes: list[str | None]
                   ) -> float | None:
    """The highest grid threshold at which similarity + guards serve no trap and
    at least `MIN_SERVED` of the should-hit pairs, or None if none does (traps the
    guards miss above every threshold). The guards were written against these
    rows, so they look better here than on new traps: the threshold keeps as many
    traps away from them as the served share allows."""
    ok = [t for t in THRESHOLDS if rates(rows, sims, vetoes, t, True)[1] == 0
          and rates(rows, sims, vetoes, t, True)[0] >= MIN_SERVED]
    return max(ok, default=None)


def report(name: str, rows: list[dict], sims: np.ndarray, vetoes: list[str | None]) -> None:
    n_hit = sum(r["label"] == "hit" for r in rows)
    print(f"\n== {name} split: {n_hit} should-hit pairs, {len(rows) - n_hit} traps ==")
    print("threshold | (a) similarity alone: served  wrong | (b) + guards: served  wrong")
    for t in THRESHOLDS:
        ha, wa = rates(rows, sims, vetoes, t, False)
        hb, wb = rates(rows, sims, vetoes, t, True)
        mark = "  <- DEFAULT_THRESHOLD" if abs(t - DEFAULT_THRESHOLD) < 1e-9 else ""
        print(f"  {t:.2f}    |            {ha:6.1%}  {wa:6.1%}    |        "
              f"{hb:6.1%}  {wb:6.1%}{mark}")
    base_t, base_h = max(((t, rates(rows, sims, vetoes, t, False)[0]) for t in THRESHOLDS
                          if rates(rows, sims, vetoes, t, False)[1] <= MAX_WRONG),
                         key=lambda x: x[1], default=(None, 0.0))
    hb, wb = rates(rows, sims, vetoes, DEFAULT_THRESHOLD, True)
    if base_t is None:
        low_t = min(THRESHOLDS, key=lambda t: (rates(rows, sims, vetoes, t, False)[1], -t))
        low_h, low_w = rates(rows, sims, vetoes, low_t, False)
        print(f"baseline (a) never reaches wrong <= 1% here: its lowest wrong is {low_w:.1%} "
              f"(threshold {low_t}, serving {low_h:.1%}); served at wrong <= 1% = 0%")
    else:
        print(f"baseline (a) best at wrong <= 1%: threshold {base_t}, served {base_h:.1%}")
    ha, wa = rates(rows, sims, vetoes, DEFAULT_THRESHOLD, False)
    ratio = f"{hb / base_h:.2f}x" if base_h else "unbounded (baseline serves 0%)"
    print(f"shipped (b) at DEFAULT_THRESHOLD {DEFAULT_THRESHOLD}: served {hb:.1%}, "
          f"wrong {wb:.1%} (similarity alone there: served {ha:.1%}, wrong {wa:.1%}); "
          f"served ratio (b) / baseline (a) = {ratio}")
    kinds: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for r, s, v in zip(rows, sims, vetoes, strict=True):
        if r["label"] == "trap":
            k = kinds[r["kind"]]
            k[0] += 1
            k[1] += bool(s >= DEFAULT_THRESHOLD)
            k[2] += bool(s >= DEFAULT_THRESHOLD and v is None)
    lost = Counter(v for r, s, v in zip(rows, sims, vetoes, strict=True)
                   if r["label"] == "hit" and s >= DEFAULT_THRESHOLD and v is not None)
    print(f"should-hit pairs above {DEFAULT_THRESHOLD} that a guard vetoed (false vetoes): "
          + (", ".join(f"{k} {n}" for k, n in lost.most_common()) or "none"))
    print(f"traps per kind at {DEFAULT_THRESHOLD}: kind  n  served by (a)  served by (b)")
    for kind, (n, sa, sb) in sorted(kinds.items()):
        print(f"  {kind:12s} {n:3d}  {sa:3d} ({sa / n:5.1%})  {sb:3d} ({sb / n:5.1%})")


def veto_cost(rows: list[dict], rounds: int) -> tuple[float, float, float]:
    """Mean µs per `veto` call: both prompts read fresh (features cache cleared);
    the query fresh and the cached prompt's features warm (the cache's case: an
    entry is read once, then compared with each query); both warm."""
    pairs = [(r["a"], r["b"]) for r in rows]
    out = []
    for warm_a, warm_b in ((False, False), (False, True), (True, True)):
        total = 0.0
        for _ in range(rounds):
            for a, b in pairs:
                clear_cache()
                if warm_a:
                    features(a)
                if warm_b:
                    features(b)
                start = time.perf_counter()
                veto(a, b)
                total += time.perf_counter() - start
        out.append(total / (rounds * len(pairs)) * 1e6)
    return out[0], out[1], out[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--veto-rounds", type=int, default=10)
    args = parser.parse_args()
    rows = load()
    t0 = time.perf_counter()
    sims = similarities(rows)
    print(f"{len(rows)} pairs embedded with MiniLM in {time.perf_counter() - t0:.1f} s")
    vetoes = [veto(r["a"], r["b"]) for r in rows]
    split = {s: [i for i, r in enumerate(rows) if r["split"] == s] for s in ("train", "test")}
    train = [rows[i] for i in split["train"]]
    chosen = pick_threshold(train, sims[split["train"]], [vetoes[i] for i in split["train"]])
    print(f"threshold picked on the train split (highest serving no train trap and "
          f">= {MIN_SERVED:.0%} of train paraphrases): {chosen}"
          f"; DEFAULT_THRESHOLD = {DEFAULT_THRESHOLD}"
          + ("" if chosen is not None and abs(chosen - DEFAULT_THRESHOLD) < 1e-9
             else "  (DIFFERS)"))
    for name in ("train", "test"):
        idx = split[name]
        report(name + (" (tuning)" if name == "train" else " (held out)"),
               [rows[i] for i in idx], sims[idx], [vetoes[i] for i in idx])
    fresh, query, warm = veto_cost(rows, args.veto_rounds)
    print(f"\nveto, mean µs per call over {len(rows)} pairs: both prompts fresh {fresh:.1f}; "
          f"query fresh, cached prompt warm {query:.1f}; both warm {warm:.1f}")


if __name__ == "__main__":
    main()
