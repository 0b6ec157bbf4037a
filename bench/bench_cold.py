"""Where a first request's time goes inside the PoP: per pipeline stage, request 1
vs 2 vs 6, after a redeploy (same keep-alive connection) or after boot (a fresh
connection each; each round restarts a PoP on a data dir holding both functions,
so it restores them as a restarted PoP does, and the measured function gets the
PoP's first request).

    python bench/bench_cold.py [--mode redeploy|boot|pause] [--rounds 5]
    EDGEFN_TREE=/other/checkout python bench/bench_cold.py   # that checkout's PoP

Runs a PoP in this process (real HTTP over loopback), wraps every stage to read
perf_counter_ns on the way in and out, and prints the median exclusive time per
stage in microseconds: ``parse`` is from the bytes' arrival to the first stage,
``<stage`` is the time after a stage's call returned (responses travelling back
up; for Python: the isolate round trip shows under the first stage's ``<``),
``write`` the response's encoding and send. ``pause`` is the control: no
deploy, only as long a pause (0.2 s) before request 1.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import os
import shutil
import statistics
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

PATHS = {"hello-wat": "/hello", "python-hello": "/py/hello"}
SHOWN = (0, 1, 5)  # the requests printed: 1st, 2nd, 6th
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
    before: Callable[[int], None] = {
        "redeploy": lambda n: pop.deploy(new_version(work, example, n)) and None,
        "pause": lambda n: time.sleep(0.2),
        "boot": lambda n: None}[mode]
    rows = []
    for n in range(1 if mode == "boot" else rounds):
        before(n)
        for i in range(SHOWN[-1] + 1):
            if mode == "boot":
                conn = http.client.HTTPConnection(pop.host, pop.port)
            get(conn, path)
            pop.delivered()
            if i in SHOWN:
                rows.append((i, exclusive()))
    return rows


def report(path: str, mode: str, rows: list[tuple[int, dict[str, int]]]) -> None:
    keys = list(rows[0][1])
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
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.mode == "boot":
            boots(Path(tmp), args.rounds)
            return 0
        with pop_thread(Path(tmp) / "data") as pop:
            instrument(pop)
            for example in PATHS:
                pop.deploy(EXAMPLES / example)
            for example, path in PATHS.items():
                report(path, args.mode, measure(pop, Path(tmp), example, args.mode, args.rounds))
    return 0


def boots(tmp: Path, rounds: int) -> None:
    """Per function, `rounds` restarts of a PoP that has both functions deployed;
    the function gets the restarted PoP's first request."""
    data = tmp / "data"
    with pop_thread(data) as pop:
        for example in PATHS:
            pop.deploy(EXAMPLES / example)
    for example, path in PATHS.items():
        rows = []
        for _ in range(rounds):
            with pop_thread(data) as pop:
                instrument(pop)
                rows += measure(pop, tmp, example, "boot", 1)
        report(path, "boot", rows)


if __name__ == "__main__":
    sys.exit(main())
