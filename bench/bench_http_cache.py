"""HTTP cache benchmark, through a real PoP (`edgefn serve --no-ai`) with a
Python function deployed twice: `cached` (answers ``Cache-Control: public,
max-age=3600``) and `direct` (the same code, ``[cache.http] enabled = false``).

    python bench/bench_http_cache.py [--n 2000] [--seconds 5]

1. Latency over one keep-alive connection: p50/p99 of a HIT (the same URL again)
   vs a MISS of the same function (a new query string each time, so each is
   stored), the baseline measured in the same run; and the function uncached.
2. req/s with wrk (-t1 -c32) on a HIT vs the uncached function (the baseline).
3. In process: the http_cache stage answering a HIT vs calling the next stage
   directly (the baseline: what a request costs past this point without a cache).
Target: HIT p50 <= 1 ms.
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import _wrk  # noqa: E402
from bench_runtime import start_edgefn  # noqa: E402

from runtime.admin.client import AdminClient  # noqa: E402

SOURCE = '''
from edgefn import Response


def handle(request, env):
    return Response("x" * 512, headers={"cache-control": "public, max-age=3600"})
'''


def function(root: Path, name: str, extra: str = "") -> Path:
    d = root / name
    d.mkdir()
    (d / "main.py").write_text(SOURCE)
    (d / "edgefn.toml").write_text(
        f'name = "{name}"\nruntime = "python"\nentry = "main.py"\nroutes = ["/{name}"]\n'
        f"[pool]\nmin = 1\nmax = 2\n{extra}\n")
    return d


def timed(port: int, paths: list[str], expect: str | None) -> list[float]:
    """Milliseconds per GET over one keep-alive connection; checks x-edgefn-cache."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    out = []
    try:
        for path in paths:
            start = time.perf_counter()
            conn.request("GET", path)
            r = conn.getresponse()
            r.read()
            out.append((time.perf_counter() - start) * 1000)
            if r.status != 200 or r.getheader("x-edgefn-cache") != expect:
                raise RuntimeError(f"{path}: {r.status} {r.getheader('x-edgefn-cache')}")
    finally:
        conn.close()
    return out


def line(name: str, ms: list[float], base: float | None) -> float:
    p50 = statistics.median(ms)
    p99 = statistics.quantiles(ms, n=100)[98]
    ratio = f"  {p50 / base:.3f}x the miss" if base else ""
    print(f"  {name:<28} p50 {p50:7.3f} ms  p99 {p99:7.3f} ms{ratio}")
    return p50


def stage_cost() -> None:
    """Microseconds per call of the stage on a HIT vs the next stage called directly."""
    import asyncio
    import timeit

    from runtime.pipeline.stage import Context
    from tests.cache.http.helpers import Harness, request

    h = Harness()
    h.call(request())
    req, origin = request(), h.origin

    def hit() -> object:
        return h.stage(req, Context("192.0.2.7:1"), origin)

    def direct() -> object:
        return origin(req, Context("192.0.2.7:1"))

    async def measure() -> dict[str, float]:
        return {f.__name__: min(timeit.repeat(f, number=20000, repeat=5)) / 20000 * 1e6
                for f in (direct, hit)}

    us = asyncio.run(measure())
    h.close()
    print("in process, per call:")
    print(f"  {'next stage directly (baseline)':<28} {us['direct']:6.2f} us")
    print(f"  {'http_cache HIT':<28} {us['hit']:6.2f} us  {us['hit'] / us['direct']:.1f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--seconds", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        proc, port = start_edgefn(root / "data", ["--no-ai"])
        try:
            admin = AdminClient(root / "data")
            admin.deploy(function(root, "cached"))
            admin.deploy(function(root, "direct", "[cache.http]\nenabled = false"))
            n = args.n
            timed(port, [f"/cached/warm?{i}" for i in range(200)], "MISS")  # warm-up
            timed(port, [f"/direct/warm?{i}" for i in range(200)], None)
            timed(port, ["/cached/hit"], "MISS")
            print(f"latency, {n} sequential GETs over one keep-alive connection:")
            miss = timed(port, [f"/cached/m?{i}" for i in range(n)], "MISS")
            hit = timed(port, ["/cached/hit"] * n, "HIT")
            direct = timed(port, [f"/direct/d?{i}" for i in range(n)], None)
            base = line("MISS (baseline)", miss, None)
            hit_p50 = line("HIT", hit, base)
            line("uncached function", direct, base)
            print(f"  HIT p50 target <= 1 ms: {'met' if hit_p50 <= 1.0 else 'NOT met'}")
            print(f"throughput, wrk -t1 -c32 {args.seconds}s:")
            url = f"http://127.0.0.1:{port}"
            _wrk.run(f"{url}/cached/hit", seconds=1)
            _wrk.run(f"{url}/direct/x", seconds=1)
            uncached = _wrk.run(f"{url}/direct/x", seconds=args.seconds)
            cached = _wrk.run(f"{url}/cached/hit", seconds=args.seconds)
            for name, r in (("uncached function (baseline)", uncached), ("HIT", cached)):
                if r["errors"]:
                    raise RuntimeError(f"{name}: {r['errors']} errors under load")
                print(f"  {name:<28} {r['rps']:9.0f} req/s  p50 {r['p50_ms']:.3f} ms  "
                      f"p99 {r['p99_ms']:.3f} ms  {r['rps'] / uncached['rps']:.2f}x")
        finally:
            proc.terminate()
            proc.wait(20)
    stage_cost()


if __name__ == "__main__":
    main()
