"""What keeping a vector index in step across processes costs a query.

    python bench/bench_vector_sync.py [--n 20000] [--dim 384] [--queries 500]

Since several processes may share a `kv.vectors.VectorStore` (a PoP's workers),
every query first checks whether another process wrote (`_sync`: one LMDB get
and a compare). Measured in this run, in one process with no other writer:

- baseline: the query as it was before that check (one read txn, the HNSW
  search, ids and metadata from LMDB), written out here;
- `VectorStore.query`: the same plus the check;
- the check alone (a read txn, the get, the compare);
- a query right after another process upserted one vector (it applies that
  entry first), and the same query with nothing new, alternated; next to it,
  this process's own upsert of one vector (the insert the writer pays).

Two index sizes: `--n` x `--dim` (a realistic search) and 1000 x 8 (a tiny
one, where the check is the largest share). Single queries, best of 7 rounds
with the kinds alternated in each (medians for the catch-up pair, which
alternates with the writer).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kv.vectors import VectorStore  # noqa: E402

WRITER = """
import sys
import numpy as np
from kv.vectors import VectorStore
vs = VectorStore(sys.argv[1], sync=False)
rng = np.random.default_rng(1)
for i, line in enumerate(sys.stdin):
    vs.upsert("bench", [(f"w{i}", rng.standard_normal(int(sys.argv[2])), None)])
    print("ok", flush=True)
"""


def old_query(vs: VectorStore, name: str, vector: Any, k: int) -> list[Any]:
    """`VectorStore.query` as it was before the catch-up check (unfiltered)."""
    o = vs._open[name]
    q = vs._vector(o.config, vector)
    if k < 1 or o.index.size == 0:
        return []
    found = o.index.search(q, min(k, o.index.size), exact=False)
    with vs.env.begin(buffers=True) as txn:
        return vs._matches(o, txn, found.keys, found.distances, None, k)


def best_rates(runs: dict[str, Callable[[], object]], n: int, rounds: int = 7) -> dict[str, float]:
    """Calls per second of each of `runs`: the best of `rounds` rounds of `n` calls,
    the runs alternated in each round (the machine is shared: noise is one-sided)."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            for _ in range(n):
                run()
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: n / t for name, t in best.items()}


def fill(path: Path, n: int, dim: int) -> tuple[VectorStore, np.ndarray]:
    rng = np.random.default_rng(7)
    vs = VectorStore(path, sync=False)
    vs.create("bench", dim)
    data = rng.standard_normal((n, dim), dtype=np.float32)
    for lo in range(0, n, 5000):
        vs.upsert("bench", [(str(i), data[i], None) for i in range(lo, min(n, lo + 5000))])
    return vs, rng.standard_normal((64, dim), dtype=np.float32)


def query_rates(vs: VectorStore, queries: np.ndarray, n: int) -> None:
    """Baseline, `query`, and the check alone: QPS and the ratio to the baseline."""
    o = vs._open["bench"]
    it = iter(np.resize(np.arange(len(queries)), n * 7 * 2))

    def checks() -> None:  # ten, so the loop's own cost is a small share
        for _ in range(10):
            with vs.env.begin(buffers=True) as txn:
                vs._sync(o, txn)

    rates = best_rates({
        "base": lambda: old_query(vs, "bench", queries[next(it)], 10),
        "new": lambda: vs.query("bench", queries[next(it)], 10),
        "check": checks}, n)
    base, new, alone = rates["base"], rates["new"], rates["check"] * 10
    print(f"  query without the check (baseline): {base:>9.0f} QPS  {1e6 / base:8.1f} us")
    print(f"  VectorStore.query (with the check): {new:>9.0f} QPS  {1e6 / new:8.1f} us"
          f"  ratio {new / base:.3f}x")
    print(f"  the check alone:                    {alone:>9.0f} /s   {1e6 / alone:8.2f} us"
          f"  ({100 * base / alone:.1f} % of a baseline query)")


def catch_up(vs: VectorStore, path: Path, dim: int, queries: np.ndarray, rounds: int) -> None:
    """Median query time right after another process wrote one vector, and with
    nothing new, alternated."""
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(dim)], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert writer.stdin is not None and writer.stdout is not None
    after: list[float] = []
    quiet: list[float] = []
    own: list[float] = []
    try:
        for i in range(rounds):
            writer.stdin.write("go\n")
            writer.stdin.flush()
            assert writer.stdout.readline() == "ok\n"
            q = queries[i % len(queries)]
            for times in (after, quiet):  # the first applies the entry, the second has none
                start = time.perf_counter()
                vs.query("bench", q, 10)
                times.append(time.perf_counter() - start)
            start = time.perf_counter()  # what the writer's own upsert of one vector costs
            vs.upsert("bench", [(f"own{i}", q, None)])
            own.append(time.perf_counter() - start)
    finally:
        writer.stdin.close()
        writer.wait(30)
        writer.stdout.close()
    a, b, c = (statistics.median(t) * 1e6 for t in (after, quiet, own))
    print(f"  after another process wrote 1 vector: {a:8.1f} us median; nothing new: "
          f"{b:8.1f} us; ratio {a / b:.2f}x ({rounds} rounds)")
    print(f"  an upsert of 1 vector here (the writer's own insert): {c:8.1f} us median")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--queries", type=int, default=500)
    args = p.parse_args()
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.rstrip())
    for n, dim in ((args.n, args.dim), (1000, 8)):
        with tempfile.TemporaryDirectory() as tmp:
            vs, queries = fill(Path(tmp), n, dim)
            print(f"== {n} x {dim}, cos, k=10, one thread, no other writer ==", flush=True)
            query_rates(vs, queries, args.queries)
            catch_up(vs, Path(tmp), dim, queries, max(50, args.queries // 5))
            vs.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
