"""What events cost: WASM hello req/s with the ``events`` stage (ring only; ring
and the JSONL file) next to the same pipeline without it, measured in the same run.

    python bench/bench_events.py [--seconds 5] [--rounds 3] [--lane auto|off]

Servers, all serving functions/examples/hello-wat with ``--no-ai``, the native lane
as ``--lane`` says (``auto``, the default: the lane's C serves all four, and the
events are made from its records; ``off``: the Python path, the stages' own code),
alternated round by round (wrk -t1 -c32), best round of each kept:
  (a) the default pipeline without the events and access_log stages (so no metrics
      are counted either: they are an observer of the events);
  (b) the default pipeline, events into the ring (10000 events), [metrics] off;
  (c) the default pipeline: events into the ring and the Prometheus metrics;
  (d) the same, and every event appended to DATA/events.jsonl.
Ratios are to (a), of the best rounds and (median) within each round, which is
steadier on a shared machine; the target is >= 0.9. Also the PoP process's CPU
time per request (from /proc), which other load on the machine barely moves:
its inverse ratio is the req/s ratio a CPU-bound PoP would see. Also prints the ring's memory after
the run (its events' encoded size, the bound being ring_size x max_event_bytes).
Needs wrk (apt-get install -y wrk).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import _wrk  # noqa: E402
from bench_runtime import start_edgefn  # noqa: E402

from runtime import config  # noqa: E402
from runtime.admin.client import AdminClient  # noqa: E402

HELLO = ROOT / "functions" / "examples" / "hello-wat"


def pop_toml(events: bool, file: bool, metrics: bool = True, lane: str = "auto") -> str:
    # without events, no access_log either: it would run as a stage of its own, writing
    # its lines itself (and keep the lane off)
    names = [n for n in config.load(None).stage_names()
             if events or n not in ("events", "access_log")]
    text = f'[http]\nnative_lane = "{lane}"\n'
    text += "".join(f'[[pipeline]]\nstage = "{n}"\n' for n in names)
    text += '[events]\nfile = "events.jsonl"\n' if file else ""
    return text + ("" if metrics else "[metrics]\nenabled = false\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lane", choices=("auto", "off"), default="auto",
                    help="[http] native_lane of all four PoPs")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgefn-bench-events-") as tmp:  # removed at the end
        work = Path(tmp)
        servers: dict[str, tuple[subprocess.Popen[bytes], int, Path]] = {}
        for name, events, file, metrics in (
                ("no events stage", False, False, True), ("events, ring, no metrics", True, False,
                                                          False),
                ("events, ring", True, False, True), ("events, ring + JSONL", True, True, True)):
            toml = work / f"{len(servers)}.toml"
            toml.write_text(pop_toml(events, file, metrics, args.lane))
            data = work / str(len(servers))
            servers[name] = (*start_edgefn(data, ["--no-ai", "--config", str(toml)], ROOT, HELLO),
                             data)
        try:
            runs = _wrk.rounds({name: (proc.pid, f"http://127.0.0.1:{port}/hello")
                                for name, (proc, port, _) in servers.items()},
                               args.seconds, args.rounds)
            data = servers["events, ring"][2]
            ring = AdminClient(data).request("GET", "/v1/events?limit=10000")["events"]
            # the file and its rotated backups (it rotates at [events] max_bytes)
            lines = sum(1 for f in servers["events, ring + JSONL"][2].glob("events.jsonl*")
                        for _ in f.open("rb"))
        finally:
            for proc, _, _ in servers.values():
                proc.terminate()
                proc.wait(20)
        best = _wrk.best(runs)
        # within one round: the same load around each
        ratios = {name: [r[name]["rps"] / r["no events stage"]["rps"] for r in runs]
                  for name in servers}
        cpu = {name: [r[name]["cpu_us"] for r in runs] for name in servers}  # µs a request
        base = best["no events stage"]["rps"]
        print(f"\n== WASM hello, native lane {args.lane}, wrk -t1 -c32 -d{args.seconds}s, best of "
              f"{args.rounds} rounds ==")
        print(f"{'server':<26}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'x without':>11}"
              f"{'median x/round':>16}")
        for name, r in best.items():
            print(f"{name:<26}{r['rps']:>10.0f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}"
                  f"{r['rps'] / base:>11.2f}{statistics.median(ratios[name]):>16.2f}")
        base_cpu = statistics.median(cpu["no events stage"])
        print("\nCPU time of the PoP process per request (median of rounds; what other load on "
              "the machine barely changes):")
        for name, spent in cpu.items():
            us = statistics.median(spent)
            print(f"  {name:<26}{us:>8.1f} us{base_cpu / us:>8.2f}x the req/s it allows")
        size = sum(len(str(e)) for e in ring)
        print(f"\nring: {len(ring)} events kept (ring_size 10000), about {size / 1e6:.1f} MB as "
              f"JSON ({size / max(len(ring), 1):.0f} B/event); JSONL files: {lines} lines")


if __name__ == "__main__":
    main()
