"""What tracing costs: WASM hello req/s of the default pipeline with
(a) no ``[tracing]`` table, (b) ``[tracing] enabled = false`` — "no cost when
off": the same chain, so ~1.0x — and (c) tracing on, every request sampled
(``sample = 1.0``), its spans (server + one per stage) exported over OTLP/HTTP to
a local sink (an HTTP server in this process that reads each export, counts its
spans and drops it: the spans a request each sink received are printed, since
spans past ``[tracing] max_queue`` are dropped, which would flatter a slow exporter);
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
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import _wrk  # noqa: E402
from bench_runtime import start_edgefn  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)

from runtime.admin.client import AdminClient  # noqa: E402
from runtime.topology.load import metric_sum  # noqa: E402

HELLO = ROOT / "functions" / "examples" / "hello-wat"


class Sink:
    """An OTLP/HTTP endpoint that reads every export, counts its spans (parsed with
    opentelemetry-proto's classes) and drops it."""

    def __init__(self) -> None:
        self.posts = self.bytes = self.spans = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                export = ExportTraceServiceRequest()
                export.ParseFromString(body)
                sink.posts += 1
                sink.bytes += len(body)
                sink.spans += sum(len(ss.spans) for rs in export.resource_spans
                                  for ss in rs.scope_spans)
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
    sinks = {name: Sink() for name in ("tracing on, sample 1.0", "on, no stage spans",
                                       "on, sample 0.0")}
    tables = {"no [tracing] table": "",
              "tracing off": "[tracing]\nenabled = false\n",
              "tracing on, sample 1.0": f'[tracing]\nenabled = true\nsample = 1.0\n'
                                        f'endpoint = "{sinks["tracing on, sample 1.0"].url}"\n'
                                        'batch_delay_ms = 200\n',
              "on, no stage spans": f'[tracing]\nenabled = true\nsample = 1.0\n'
                                    f'endpoint = "{sinks["on, no stage spans"].url}"\n'
                                    'batch_delay_ms = 200\nstage_spans = false\n',
              "on, sample 0.0": f'[tracing]\nenabled = true\nsample = 0.0\n'
                                f'endpoint = "{sinks["on, sample 0.0"].url}"\n'}
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
        time.sleep(1.0)  # the last batches (batch_delay_ms 200, or 1000 at sample 0.0)
        served = {name: requests_total(work / str(list(tables).index(name))) for name in sinks}
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
    print("\nSpans the OTLP sinks received (a queue past [tracing] max_queue drops them):")
    for name, sink in sinks.items():
        print(f"  {name:<26}{sink.spans:>9} spans in {sink.posts:>5} exports "
              f"({sink.bytes / 1e6:.1f} MB), {sink.spans / max(served[name], 1):.2f} a request "
              f"of {served[name]}")


def requests_total(data: Path) -> int:
    """The requests a PoP counted (its metrics' ``edgefn_requests_total``)."""
    return int(metric_sum(AdminClient(data).metrics(), "edgefn_requests_total"))

if __name__ == "__main__":
    main()
