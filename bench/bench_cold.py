"""Where a first request's time goes inside the PoP: per pipeline stage, request 1
vs 2 vs 6, after a redeploy (same keep-alive connection) or after boot (a fresh
connection each; each round restarts a PoP on a data dir holding both functions,
so it restores them as a restarted PoP does, and the measured function gets the
PoP's first request).

    python bench/bench_cold.py [--mode redeploy|boot|pause] [--rounds 5] [--fresh] [--gap 0.25]
    EDGEFN_TREE=/other/checkout python bench/bench_cold.py   # that checkout's PoP

Runs a PoP in this process (real HTTP over loopback), wraps every stage to read
perf_counter_ns on the way in and out, and prints the median exclusive time per
stage in microseconds: ``parse`` is from the bytes' arrival to the first stage,
``<stage`` is the time after a stage's call returned (responses travelling back
up; for Python: the isolate round trip shows under the first stage's ``<``),
``write`` the response's encoding and send. ``pause`` is the control: no
deploy, only as long a pause (0.2 s) before request 1. ``--fresh`` (boot mode):
each restart in a new Python process, as a PoP of ``edgefn topology`` starts
(else the rounds share this process, whose code earlier rounds already ran).
``--gap S`` (boot mode): a pause of S seconds before each of the six requests, as
bench_topology's cold-start rounds have, so that request 1 and request 6 differ
only in what is done for the first time (without it, requests 2-6 come back to
back and find the CPU's caches warm: the pause shows up as a first-time cost).
A garbage collection during a request shows as its own column, ``gc<generation>``.
The PoP's native lane is off: it serves both functions in C, past the stages timed
here (with it on, every column read 0).
"""

from __future__ import annotations

import argparse
import gc
import http.client
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# EDGEFN_TREE=DIR: measure another checkout (before/after)
ROOT = Path(os.environ.get("EDGEFN_TREE") or Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(ROOT))

from runtime.net import protocol  # noqa: E402
from runtime.pipeline.chain import Chain  # noqa: E402
from tests.support import EXAMPLES, Running, pop_thread  # noqa: E402

STAGES: dict[str, Any] = {"http.native_lane": "off"}  # the stages timed here run

PATHS = {"hello-wat": "/hello", "python-hello": "/py/hello"}
SHOWN = (0, 1, 5)  # the requests printed: 1st, 2nd, 6th
gap = 0.0  # --gap: seconds before each request in boot mode
marks: list[tuple[str, int]] = []
clock = time.perf_counter_ns


class Timed:
    """A stage that marks when it was entered and when its call returned."""

    def __init__(self, stage: Any) -> None:
        self.stage, self.name = stage, stage.name

    def __call__(self, request: Any, ctx: Any, call_next: Any) -> Any:
        marks.append((self.name, clock()))
        result = self.stage(request, ctx, call_next)
        marks.append(("<" + self.name, clock()))
        return result


def instrument(pop: Running) -> None:
    """Mark arrival and response writing on the HTTP front (once per process), and
    every stage of `pop`."""
    chain = pop.pop.pipeline
    chain._first = Chain([Timed(s) for s in chain.stages])._first
    if getattr(protocol.HttpProtocol, "timed", False):
        return
    gc.callbacks.append(on_gc)
    received, write = protocol.HttpProtocol.data_received, protocol.HttpProtocol._write

    def on_data(self: Any, data: bytes) -> None:
        marks.clear()
        marks.append(("parse", clock()))
        received(self, data)

    def on_write(self: Any, request: Any, response: Any) -> None:
        marks.append(("write", clock()))
        write(self, request, response)
        marks.append(("end", clock()))

    protocol.HttpProtocol.data_received = on_data  # type: ignore[method-assign]
    protocol.HttpProtocol._write = on_write  # type: ignore[method-assign]
    protocol.HttpProtocol.timed = True  # type: ignore[attr-defined]


def on_gc(phase: str, info: dict[str, int]) -> None:
    """A collection's time under ``gc<generation>``, not under the stage it
    interrupted (which the next mark resumes)."""
    if not marks:
        return
    if phase == "start":
        marks.append((f"gc{info['generation']}", clock()))
    elif len(marks) > 1:
        marks.append((marks[-2][0], clock()))


def exclusive() -> dict[str, int]:
    out: dict[str, int] = {}
    for (name, t), (_, t2) in itertools.pairwise(marks):
        out[name] = out.get(name, 0) + (t2 - t) // 1000
    return out


def get(conn: http.client.HTTPConnection, path: str) -> None:
    conn.request("GET", path)
    resp = conn.getresponse()
    resp.read()
    if resp.status != 200:
        raise RuntimeError(f"GET {path}: {resp.status}")


def new_version(work: Path, example: str, n: int) -> Path:
    d = work / f"{example}-{n}"
    shutil.copytree(EXAMPLES / example, d)
    with open(d / "edgefn.toml", "a") as f:
        f.write(f'\n[env]\nROUND = "{n}"\n')
    return d


def measure(pop: Running, work: Path, example: str, mode: str, rounds: int
            ) -> list[tuple[int, dict[str, int]]]:
    path = PATHS[example]
    conn = http.client.HTTPConnection(pop.host, pop.port)
    if mode != "boot":
        for _ in range(50):
            get(conn, path)
    actions: dict[str, Callable[[int], object]] = {
        "redeploy": lambda n: pop.deploy(new_version(work, example, n)),
        "pause": lambda n: time.sleep(0.2),
        "boot": lambda n: None}
    before = actions[mode]
    rows = []
    for n in range(1 if mode == "boot" else rounds):
        before(n)
        for i in range(SHOWN[-1] + 1):
            if mode == "boot":
                time.sleep(gap)
                conn = http.client.HTTPConnection(pop.host, pop.port)
            get(conn, path)
            pop.delivered()
            if i in SHOWN:
                rows.append((i, exclusive()))
    return rows


def report(path: str, mode: str, rows: list[tuple[int, dict[str, int]]]) -> None:
    keys = list(dict.fromkeys(k for _, r in rows for k in r if not k.startswith("gc")))
    keys += sorted({k for _, r in rows for k in r if k.startswith("gc")})
    print(f"\n{path}, {mode}: exclusive us per stage, median over rounds")
    print(f"{'':8}" + "".join(f"{k[:11]:>12}" for k in keys) + f"{'total':>9}")
    for i in SHOWN:
        med = {k: statistics.median(r.get(k, 0) for j, r in rows if j == i) for k in keys}
        print(f"req {i + 1:<4}" + "".join(f"{med[k]:>12.0f}" for k in keys)
              + f"{sum(med.values()):>9.0f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mode", choices=["redeploy", "boot", "pause"], default="redeploy")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--fresh", action="store_true", help="boot: each restart in a new process")
    p.add_argument("--gap", type=float, default=0.0, help="boot: seconds before each request")
    p.add_argument("--one", nargs=2, metavar=("DATA", "EXAMPLE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    global gap
    gap = args.gap
    if args.one:  # one restart for --fresh: its rows on stdout, after the access log
        rows = one_boot(Path(args.one[0]), args.one[1])
        print("ROWS " + json.dumps(rows))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        if args.mode == "boot":
            boots(Path(tmp), args.rounds, args.fresh)
            return 0
        with pop_thread(Path(tmp) / "data", **STAGES) as pop:
            instrument(pop)
            for example in PATHS:
                pop.deploy(EXAMPLES / example)
            for example, path in PATHS.items():
                report(path, args.mode, measure(pop, Path(tmp), example, args.mode, args.rounds))
    return 0


def boots(tmp: Path, rounds: int, fresh: bool) -> None:
    """Per function, `rounds` restarts of a PoP that has both functions deployed;
    the function gets the restarted PoP's first request. `fresh`: each restart in
    a new process."""
    data = tmp / "data"
    with pop_thread(data, **STAGES) as pop:
        for example in PATHS:
            pop.deploy(EXAMPLES / example)
    for example, path in PATHS.items():
        rows = []
        for _ in range(rounds):
            rows += fresh_boot(data, example) if fresh else one_boot(data, example)
        report(path, "boot, fresh process" if fresh else "boot", rows)


def one_boot(data: Path, example: str) -> list[tuple[int, dict[str, int]]]:
    with pop_thread(data, **STAGES) as pop:
        instrument(pop)
        return measure(pop, data.parent, example, "boot", 1)


def fresh_boot(data: Path, example: str) -> list[tuple[int, dict[str, int]]]:
    """`one_boot` in a new Python process. Raises CalledProcessError if it fails."""
    out = subprocess.run([sys.executable, __file__, "--one", str(data), example,
                          "--gap", str(gap)],
                         capture_output=True, text=True, check=True).stdout
    rows = json.loads(next(line for line in out.splitlines() if line.startswith("ROWS "))[5:])
    return [(i, stages) for i, stages in rows]


if __name__ == "__main__":
    sys.exit(main())
