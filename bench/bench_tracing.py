"""What tracing costs: WASM hello req/s of the default pipeline with
(a) no ``[tracing]`` table, (b) ``[tracing] enabled = false`` — "no cost when
off": the same chain, so ~1.0x — and (c) tracing on, every request sampled
(``sample = 1.0``), its spans (server + one per stage) exported over OTLP/HTTP to
a local sink (an HTTP server in this process that reads and drops each export);
(d) the same with ``stage_spans = false`` (the request's span only); (e) on with
``sample = 0.0`` (what a request not sampled pays: ids, traceparent, timed chain).
Measured in the same run, alternated round by round (wrk -t1 -c32), best round
of each kept; ratios are to (a), of the best rounds and (median) within each
round. Also the PoP process's CPU time per request. (c)-(e) include what the native
lane saves (a) and (b): a timed chain has no lane, so enabling tracing takes every
request to the Python path, and that is part of its cost.

    python bench/bench_tracing.py [--seconds 5] [--rounds 3]

Needs wrk (apt-get install -y wrk).
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import statistics
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import _wrk  # noqa: E402
from bench_runtime import start_edgefn  # noqa: E402

HELLO = ROOT / "functions" / "examples" / "hello-wat"


class Sink:
    """An OTLP/HTTP endpoint that reads every export and drops it."""

    def __init__(self) -> None:
        self.posts = self.bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                sink.posts += 1
                sink.bytes += len(body)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="edgefn-bench-tracing-"))
    atexit.register(shutil.rmtree, work, True)  # its PoPs' data dirs, at exit
    sink = Sink()
    tables = {"no [tracing] table": "",
              "tracing off": "[tracing]\nenabled = false\n",
              "tracing on, sample 1.0": f'[tracing]\nenabled = true\nsample = 1.0\n'
                                        f'endpoint = "{sink.url}"\nbatch_delay_ms = 200\n',
              "on, no stage spans": f'[tracing]\nenabled = true\nsample = 1.0\n'
                                    f'endpoint = "{sink.url}"\nbatch_delay_ms = 200\n'
                                    'stage_spans = false\n',
              "on, sample 0.0": f'[tracing]\nenabled = true\nsample = 0.0\n'
                                f'endpoint = "{sink.url}"\n'}
    servers = {}
    for i, (name, table) in enumerate(tables.items()):
        toml = work / f"{i}.toml"
        toml.write_text(table)
        servers[name] = start_edgefn(work / str(i), ["--no-ai", "--config", str(toml)], ROOT,
                                     HELLO)
    base_name = "no [tracing] table"
    try:
        runs = _wrk.rounds({name: (proc.pid, f"http://127.0.0.1:{port}/hello")
                            for name, (proc, port) in servers.items()}, args.seconds, args.rounds)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(20)
    best = _wrk.best(runs)
    ratios = {name: [r[name]["rps"] / r[base_name]["rps"] for r in runs] for name in servers}
    cpu = {name: [r[name]["cpu_us"] for r in runs] for name in servers}
    base = best[base_name]["rps"]
    print(f"\n== WASM hello, wrk -t1 -c32 -d{args.seconds}s, best of {args.rounds} rounds ==")
    print(f"{'server':<26}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'x no table':>12}"
          f"{'median x/round':>16}")
    for name, r in best.items():
        print(f"{name:<26}{r['rps']:>10.0f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}"
              f"{r['rps'] / base:>12.2f}{statistics.median(ratios[name]):>16.2f}")
    base_cpu = statistics.median(cpu[base_name])
    print("\nCPU time of the PoP process per request (median of rounds):")
    for name, spent in cpu.items():
        us = statistics.median(spent)
        print(f"  {name:<26}{us:>8.1f} us{base_cpu / us:>8.2f}x the req/s it allows")
    print(f"\nOTLP sink: {sink.posts} exports, {sink.bytes / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
