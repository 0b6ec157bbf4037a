"""KV and vector benchmark; every figure next to a baseline from the same run.

    python bench/bench_kv.py [--n 100000] [--dim 384] [--queries 200]
                             [--only kv|vectors|large] [--seconds 5]

KV: get and put ops/s for raw py-lmdb (baseline), the kv API, and a function
calling the binding (WASM: the native kv_get, and the Python host function as
EDGEFN_NATIVE_KV=0 gives it; Python: the host call over the isolate's socket, and
the read in the isolate host that EDGEFN_PYTHON_KV=local turns on), where the cost per binding
call is (request with N gets - request with 0 gets) / N: the guests make 10 gets
per byte of request, and the two requests differ only in their body's length.
Vectors: recall@10 and QPS of the usearch index (through kv.vectors) against
exact numpy search on N x DIM random-normal and clustered data.
Large values: the PoP loop's time per 16 MiB get and put of a Python function, and
a WASM hello's p99 while 8 isolates loop such gets, each the new way (the value raw
after a small JSON head) next to the old (base64 in JSON) in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kv import KVStore  # noqa: E402
from kv.vectors import VectorStore  # noqa: E402


def rate(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    """ops/s: best of 3 runs of n calls."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - start)
    return n / best


def kv_bench(work: Path, n: int = 20000) -> None:
    keys = [b"key:%06d" % i for i in range(n)]
    value = b"v" * 100
    env = lmdb.open(str(work / "raw"), map_size=1 << 30, sync=False)
    with env.begin(write=True) as txn:
        for k in keys:
            txn.put(k, value)

    def raw_get(m: int) -> None:
        for i in range(m):
            with env.begin() as txn:
                txn.get(keys[i % n])

    def raw_put(m: int) -> None:
        for i in range(m):
            with env.begin(write=True) as txn:
                txn.put(keys[i % n], value)

    store = KVStore(work / "kv", sync=False)
    store.create_namespace("b")
    for k in keys:
        store.put("b", k, value)

    def api_get(m: int) -> None:
        for i in range(m):
            store.get("b", keys[i % n])

    def api_put(m: int) -> None:
        for i in range(m):
            store.put("b", keys[i % n], value)

    rg, rp = rate(raw_get, n), rate(raw_put, n // 4)
    ag, ap = rate(api_get, n), rate(api_put, n // 4)
    store.close()
    env.close()
    wasm_get, wasm_py_get, py_get, py_local_get = binding_get_cost(work)
    print("\n== KV, 100-byte values, one transaction per op, sync=False ==")
    print(f"{'path':<34}{'get ops/s':>12}{'x raw':>8}{'put ops/s':>12}{'x raw':>8}")
    print(f"{'raw py-lmdb (baseline)':<34}{rg:>12.0f}{1:>8.2f}{rp:>12.0f}{1:>8.2f}")
    print(f"{'kv.KVStore API':<34}{ag:>12.0f}{ag / rg:>8.2f}{ap:>12.0f}{ap / rp:>8.2f}")
    for name, per in (("WASM function, edgefn.kv_get", wasm_get),
                      ("  same, EDGEFN_NATIVE_KV=0", wasm_py_get),
                      ("Python function, env.kv().get", py_get),
                      ("  same, EDGEFN_PYTHON_KV=local", py_local_get)):
        ops = 1e6 / per
        print(f"{name:<34}{ops:>12.0f}{ops / rg:>8.2f}{'':>12}{'':>8}"
              f"   ({per:.1f} us per binding get = {rg * per / 1e6:.1f}x a raw get)")


LOOP_WAT = """(module
  (import "edgefn" "kv_get" (func $get (param i32 i32 i32 i32 i32 i32) (result i64)))
  (memory (export "memory") 2)
  (global $heap (mut i32) (i32.const 4096))
  (data (i32.const 16) "\\c8\\00\\00\\00\\00\\00\\00\\00\\02\\00\\00\\00ok")
  (data (i32.const 64) "b")
  (data (i32.const 80) "key:000001")
  (func (export "edgefn_alloc") (param $n i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $heap))
    (global.set $heap (i32.add (global.get $heap) (local.get $n)))
    (local.get $p))
  (func (export "edgefn_handle") (param $p i32) (param $n i32) (result i64)
    (local $i i32)
    ;; 10 gets per byte of the request: two requests whose bodies differ by L bytes
    ;; differ by 10 L gets, whatever else the request carries (params, principal)
    (local.set $i (i32.mul (local.get $n) (i32.const 10)))
    (block $done (loop $again
      (br_if $done (i32.eqz (local.get $i)))
      (drop (call $get (i32.const 64) (i32.const 1) (i32.const 80) (i32.const 10)
                       (i32.const 1024) (i32.const 1024)))
      (local.set $i (i32.sub (local.get $i) (i32.const 1)))
      (br $again)))
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 14))))
"""

LOOP_PY = """from edgefn import Response

def handle(request, env):
    kv = env.kv("b")
    for _ in range(len(request.body) * 10):
        kv.get("key:000001")
    return Response("ok")
"""


def binding_get_cost(work: Path) -> list[float]:
    """Microseconds per binding get in a real PoP: WASM with the native kv_get,
    WASM with the Python host function (EDGEFN_NATIVE_KV=0), Python over the
    isolate's socket, Python with reads in its host (EDGEFN_PYTHON_KV=local)."""
    from runtime import config
    from runtime.functions import deploys
    from runtime.net.message import Request
    from runtime.pop import PoP

    for name, entry, src, runtime in (("loop-wasm", "main.wat", LOOP_WAT, "wasm"),
                                      ("loop-wasm-py", "main.wat", LOOP_WAT, "wasm"),
                                      ("loop-py", "main.py", LOOP_PY, "python"),
                                      ("loop-py-local", "main.py", LOOP_PY, "python")):
        d = work / name
        d.mkdir()
        (d / entry).write_text(src)
        (d / "edgefn.toml").write_text(
            f'name = "{name}"\nowner = "bench"\nruntime = "{runtime}"\nentry = "{entry}"\n'
            f'routes = ["/{name}"]\n'
            '[bindings]\nkv = ["b"]\n[limits]\ncpu_ms = 5000\nwall_ms = 20000\n'
            + ('[pool]\nstandby = false\n' if runtime == "python" else ""))

    async def run() -> list[float]:
        off: dict[str, Any] = {"ai.enabled": False}
        pop = PoP(config.load(None, data=str(work / "pop"), **off))
        try:
            pop.stores.kv.create_namespace("b")
            pop.stores.kv.put("b", b"key:000001", b"v" * 100)
            out = []
            # (function, body bytes: 10 more gets each, native kv_get)
            for name, count, native, py_kv in (
                    ("loop-wasm", 2000, "1", ""), ("loop-wasm-py", 500, "0", ""),
                    ("loop-py", 500, "1", ""), ("loop-py-local", 2000, "1", "local")):
                os.environ["EDGEFN_NATIVE_KV"] = native  # both read at deploy
                os.environ["EDGEFN_PYTHON_KV"] = py_kv
                await pop.registry.deploy(deploys.pack_dir(work / name), name)
                times = {}
                for n in (0, count):
                    times[n] = await best_of(pop, name, n)
                out.append((times[count] - times[0]) / (count * 10) * 1e6)
            return out
        finally:
            os.environ.pop("EDGEFN_NATIVE_KV", None)
            os.environ.pop("EDGEFN_PYTHON_KV", None)
            pop.close()

    async def best_of(pop: Any, name: str, count: int) -> float:
        """Seconds: the quickest of 7 requests to `name` with a body of `count` bytes."""
        req = Request(b"POST", f"/{name}".encode(), b"", [], b"x", "1.1", True, "c")
        req.body = b"x" * count
        best = float("inf")
        for _ in range(7):
            start = time.perf_counter()
            result = pop.pipeline(req)
            if not hasattr(result, "status"):
                result = await result
            assert result.status == 200, result.body
            best = min(best, time.perf_counter() - start)
        return best

    return asyncio.run(run())


def vectors_bench(work: Path, n: int, dim: int, queries: int) -> None:
    rng = np.random.default_rng(7)
    datasets = {
        "random-normal": rng.standard_normal((n, dim), dtype=np.float32),
        "clustered": (rng.standard_normal((100, dim), dtype=np.float32)[rng.integers(0, 100, n)]
                      + 0.3 * rng.standard_normal((n, dim), dtype=np.float32)),
    }
    print(f"\n== Vectors: {n} x {dim}, cosine, k=10, {queries} single queries ==")
    print(f"{'data':<22}{'build s':>9}{'exact QPS':>11}{'index QPS':>11}{'x exact':>9}"
          f"{'recall@10':>11}")
    for name, data in datasets.items():
        unit = data / np.linalg.norm(data, axis=1, keepdims=True)
        qs = rng.standard_normal((queries, dim), dtype=np.float32) if name == "random-normal" \
            else data[rng.integers(0, n, queries)] + 0.1 * rng.standard_normal((queries, dim),
                                                                               dtype=np.float32)
        qunit = qs / np.linalg.norm(qs, axis=1, keepdims=True)
        start = time.perf_counter()
        truth = [np.argpartition(-(unit @ q), 10)[:10] for q in qunit]
        exact_qps = queries / (time.perf_counter() - start)
        path = work / f"vec-{name}"
        vs = VectorStore(path, sync=False)
        vs.create("bench", dim)
        start = time.perf_counter()
        for lo in range(0, n, 5000):
            vs.upsert("bench", [(str(i), data[i], None) for i in range(lo, min(n, lo + 5000))])
        build = time.perf_counter() - start
        for ef in (256, 1024):  # HNSW search breadth: recall against speed
            vs._open["bench"].index.expansion_search = ef  # type: ignore[misc]  # bench-only knob
            start = time.perf_counter()
            got = [vs.query("bench", q, 10) for q in qs]
            index_qps = queries / (time.perf_counter() - start)
            recall = np.mean([len({int(m.id) for m in g} & set(t.tolist())) / 10
                              for g, t in zip(got, truth, strict=True)])
            print(f"{name + f' ef={ef}':<22}{build:>9.1f}{exact_qps:>11.0f}{index_qps:>11.0f}"
                  f"{index_qps / exact_qps:>9.1f}{recall:>11.3f}")
        vs.close()
        shutil.rmtree(path, ignore_errors=True)


# -- Large values between the PoP and a Python isolate --------------------------------------
BIG = 16 << 20  # the KV value limit

BIG_PY = """import base64
from edgefn import Response

VALUE = bytes(range(256)) * (BIG // 256)
B64 = base64.b64encode(VALUE).decode()


def handle(request, env):
    kv, op, n = env.kv("big"), request.query["op"], int(request.query["n"])
    for _ in range(n):
        if op == "get":
            assert kv.get("v") == VALUE
        elif op == "put":
            kv.put("p", VALUE)
        else:  # the call as the SDK sent it before: the value base64 in its JSON
            env._call("kv.put", {"namespace": "big", "key": "p", "value": B64, "ttl": None,
                                 "metadata": None}, True)
    return Response("ok")
""".replace("BIG // 256", str(BIG // 256))


def large_values(work: Path, seconds: float) -> None:
    """The PoP's event loop time per 16 MiB `kv.get` and `kv.put` of a Python function
    (the loop thread's CPU time over a request of N calls less one of 0, per call,
    best of 5), each next to the same call the old way in this run: a get answered
    with the value base64 in a JSON REPLY (what `wire.VALUE_REPLIES` emptied in the
    PoP's process gives), a put sent with it base64 in the CALL's JSON. Then a WASM
    hello's p99 (one keep-alive connection, as bench_no_stall) and the PoP loop's lag
    (how late a 1 ms timer fires), quiet and while 8 isolates loop 16 MiB gets
    answered either way."""
    import concurrent.futures
    import threading

    from runtime.executors.python import wire
    from tests.support import EXAMPLES, pop_thread
    from tests.test_no_stall import hello_latencies

    d = work / "big"
    d.mkdir()
    (d / "main.py").write_text(BIG_PY)
    (d / "edgefn.toml").write_text(
        'name = "big"\nowner = "bench"\nruntime = "python"\nentry = "main.py"\n'
        'routes = ["/big"]\n[bindings]\nkv = ["big"]\n'
        "[limits]\ncpu_ms = 60000\nwall_ms = 60000\nmemory_mb = 1024\n"
        "[pool]\nmin = 8\nmax = 8\nstandby = false\n")
    raw_replies: frozenset[str] = getattr(wire, "VALUE_REPLIES", frozenset())

    def answered(raw: bool) -> None:  # in the PoP's process: the isolates keep their own
        if hasattr(wire, "VALUE_REPLIES"):
            wire.VALUE_REPLIES = raw_replies if raw else frozenset()

    with pop_thread(work / "pop-big") as pop:
        loop = pop.loop
        assert loop is not None
        ident: concurrent.futures.Future[int] = concurrent.futures.Future()
        loop.call_soon_threadsafe(lambda: ident.set_result(threading.get_ident()))
        clock = time.pthread_getcpuclockid(ident.result(5))
        pop.pop.stores.kv.create_namespace("big")
        pop.pop.stores.kv.put("big", b"v", bytes(range(256)) * (BIG // 256))
        pop.deploy(d)
        pop.deploy(EXAMPLES / "hello-wat")

        def loop_ms(op: str, n: int) -> float:
            best = float("inf")
            for _ in range(5):
                before = time.clock_gettime(clock)
                status, _, body = pop.get(f"/big?op={op}&n={n}", timeout=120)
                assert (status, body) == (200, b"ok"), (status, body[:300])
                best = min(best, time.clock_gettime(clock) - before)
            return best * 1000

        n = 8
        rows = []
        for name, op, raw in (("get, base64 JSON REPLY (old)", "get", False),
                              ("get, REPLY_VALUE frame", "get", True),
                              ("put, base64 in CALL JSON (old)", "put_json", True),
                              ("put, CALL_VALUE frame", "put", True)):
            answered(raw)
            rows.append((name, (loop_ms(op, n) - loop_ms(op, 0)) / n))
        answered(True)
        print("\n== 16 MiB KV values, Python function <-> PoP: the PoP loop's CPU per call ==")
        print(f"{'call':<34}{'loop ms/call':>14}{'x old':>8}")
        for i, (name, ms) in enumerate(rows):
            print(f"{name:<34}{ms:>14.2f}{ms / rows[i - i % 2][1]:>8.3f}")

        lags: list[float] = []
        ticking = threading.Event()

        def tick(last: float) -> None:  # on the loop: how late each 1 ms timer fires
            now = time.perf_counter()
            lags.append((now - last) * 1000 - 1)
            if ticking.is_set():
                loop.call_later(0.001, tick, time.perf_counter())

        def phase(op: str | None, raw: bool = True,
                  rate: float = 0) -> tuple[float, float, float, float, float]:
            """/hello p99 and max, loop lag p99 and max (ms), gets/s; `op`: what 8
            clients have 8 isolates do meanwhile (None: quiet): 4 gets a request back
            to back, or with `rate`, one get a request, `rate` a second each."""
            stop, done = threading.Event(), [0]

            def hammer() -> None:
                due = time.monotonic()
                while not stop.is_set():
                    pop.get(f"/big?op={op}&n={1 if rate else 4}", timeout=120)
                    done[0] += 1 if rate else 4
                    if rate:
                        due += 1 / rate
                        time.sleep(max(0.0, due - time.monotonic()))

            threads = [threading.Thread(target=hammer, daemon=True)
                       for _ in range(8 if op else 0)]
            answered(raw)
            for t in threads:
                t.start()
            time.sleep(1.0)  # the hammering under way; the quiet one settles
            lags.clear()
            ticking.set()
            loop.call_soon_threadsafe(tick, time.perf_counter())
            before, started = done[0], time.monotonic()
            lat, errors = hello_latencies(pop, seconds)
            gets = (done[0] - before) / (time.monotonic() - started)
            ticking.clear()
            lag = sorted(lags)
            stop.set()
            for t in threads:
                t.join()
            answered(True)
            lat.sort()
            assert not errors, errors[:5]
            return (lat[int(len(lat) * 0.99)], lat[-1], lag[int(len(lag) * 0.99)], lag[-1],
                    gets)

        phases = [("quiet (baseline)", phase(None)),
                  ("looped, base64 JSON REPLY (old)", phase("get", raw=False)),
                  ("looped, REPLY_VALUE", phase("get")),
                  ("8 a second, base64 JSON (old)", phase("get", raw=False, rate=1)),
                  ("8 a second, REPLY_VALUE", phase("get", rate=1))]
        quiet = phases[0][1][0]
        print(f"\n== WASM /hello while 8 isolates get 16 MiB values ({seconds:.0f} s each) ==")
        print(f"{'gets':<34}{'gets/s':>7}{'p99 ms':>8}{'x quiet':>9}{'x old':>7}{'max ms':>8}"
              f"{'loop lag p99':>13}{'max':>7}")
        for i, (name, (p99, worst, lag99, lag_max, gets)) in enumerate(phases):
            vs_old = f"{p99 / phases[i - 1][1][0]:>7.2f}" if i in (2, 4) else f"{'':>7}"
            print(f"{name:<34}{gets:>7.1f}{p99:>8.2f}{p99 / quiet:>9.2f}{vs_old}{worst:>8.1f}"
                  f"{lag99:>13.1f}{lag_max:>7.1f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--only", choices=["kv", "vectors", "large"])
    p.add_argument("--seconds", type=float, default=5.0,
                   help="each phase of the large-value victim test")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "kv"):
            kv_bench(Path(tmp))
        if args.only in (None, "vectors"):
            vectors_bench(Path(tmp), args.n, args.dim, args.queries)
        if args.only in (None, "large"):
            large_values(Path(tmp), args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
