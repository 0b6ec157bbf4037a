"""bench_topology's cold-start penalty: the first request to each function on each
PoP, against warm requests after the same pause, with a noise control beside it.

A round sends one request to each function on each PoP, each on a fresh
connection straight to the PoP's port (no link relay), each after a PAUSE. The
first round's requests are each function's first on that PoP; the next rounds'
come after the same pauses, so only first-time costs set them apart.

One first sample against the median of five warm ones also measures noise: on
two shared cores the warm medians of identical PoPs differ by 2x. So beside each
ratio the same statistic is applied to a warm sample (round 2 alone against the
median of rounds 3-ROUNDS): how often that exceeds 1.2x is what noise alone
does. With K boots (the topology brought down and up K times, only these rounds
on the extra boots) the median of the K first samples is compared with the
median of every warm sample, and the control is the median of the K round-2
samples against every later round's.
"""

from __future__ import annotations

import http.client
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from runtime.admin.client import AdminClient
from runtime.topology import runner, spec
from runtime.topology.rundir import pop_dir

PAUSE = 0.25  # seconds before each request of a cold-start round
ROUNDS = 6  # cold-start rounds: the first one's requests are each function's first
TARGET = 1.2  # the seeds' claim: first request <= 1.2x warm


@dataclass
class Cold:
    """One PoP/path on one boot: each round's request, end to end (seconds) and
    inside the PoP (events' duration_ms); the back-to-back median (seconds) on the
    boot that measured it."""
    pop: str
    path: str
    rounds: list[float]
    inside: list[float]
    back: float | None = None


def measure(run: Path, topo: spec.Topology, paths: list[str], back: bool) -> list[Cold]:
    """ROUNDS rounds on the running topology in `run`; with `back`, then five
    back-to-back requests per PoP/path (the old baseline: no pause before them)."""
    state = runner.read_network(run)
    targets = [(p.name, state.public[p.name], path) for p in topo.pop for path in paths]
    colds = {(n, path): Cold(n, path, [], []) for n, _, path in targets}
    for _ in range(ROUNDS):
        for name, port, path in targets:
            time.sleep(PAUSE)
            colds[(name, path)].rounds.append(timed_get(name, port, path))
    for name, port, path in targets:
        if back:
            colds[(name, path)].back = statistics.median(
                timed_get(name, port, path) for _ in range(5))
        colds[(name, path)].inside = _inside(run, name, path)
    return list(colds.values())


def _inside(run: Path, pop: str, path: str) -> list[float]:
    """The rounds' requests as `pop`'s events saw them: each one's time inside the
    pipeline (ms, from the first stage to the response), oldest first."""
    listed = AdminClient(pop_dir(run, pop), timeout=30).request(
        "GET", f"/v1/events?path={path}&limit=100")
    return [e["duration_ms"] for e in listed["events"] if e["path"] == path][:ROUNDS]


def timed_get(pop: str, port: int, path: str) -> float:
    """Seconds for one GET on a new connection (connect to the last byte read)."""
    t = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path)
    resp = conn.getresponse()
    resp.read()
    conn.close()
    assert resp.status == 200, (pop, path, resp.status)
    return time.perf_counter() - t


def ratios(c: Cold, inside: bool = False) -> tuple[float, float, float, float]:
    """(first, warm median of rounds 2-ROUNDS, first / warm, control: round 2 /
    median of rounds 3-ROUNDS) of one boot."""
    xs = c.inside if inside else c.rounds
    warm = statistics.median(xs[1:])
    return xs[0], warm, xs[0] / warm, xs[1] / statistics.median(xs[2:])


def pooled(boots: list[Cold], inside: bool = False) -> tuple[float, float, float, float]:
    """The same over K boots of one PoP/path: (median of the K firsts, median of
    every warm sample, their ratio, median of the K round-2 samples / median of
    every sample of rounds 3-ROUNDS)."""
    xs = [c.inside if inside else c.rounds for c in boots]
    first = statistics.median(x[0] for x in xs)
    warm = statistics.median(v for x in xs for v in x[1:])
    later = statistics.median(v for x in xs for v in x[2:])
    return first, warm, first / warm, statistics.median(x[1] for x in xs) / later


def report(boots: list[list[Cold]]) -> float:
    """Print the inside-the-PoP and end-to-end tables of the last boot (single
    samples), then, with more than one boot, the pooled ones. Returns the worst
    first / warm ratio end to end (pooled when there are several boots)."""
    last = boots[-1]
    print(f"inside the PoP (events' duration_ms): first / median of rounds 2-{ROUNDS}; "
          f"control: round 2 / median of rounds 3-{ROUNDS}")
    for c in last:
        first, warm, ratio, control = ratios(c, inside=True)
        print(f"  {c.pop:<12}{c.path:<11}{first:8.3f} ms / {warm:.3f} ms = {ratio:.2f}"
              f"   control {control:.2f}")
    _above([ratios(c, inside=True) for c in last], "inside, this boot")
    print(f"cold start (first / warm median, straight to the PoP, each after a {PAUSE} s "
          f"pause; control: round 2 / median of rounds 3-{ROUNDS}; then against "
          f"back-to-back warm requests):   seeds: <= {TARGET}x")
    for c in last:
        first, warm, ratio, control = ratios(c)
        back = c.back or float("nan")
        print(f"  {c.pop:<12}{c.path:<11}{first * 1000:8.1f} ms / {warm * 1000:.1f} ms = "
              f"{ratio:.2f}x   control {control:.2f}x   back-to-back {back * 1000:.1f} ms: "
              f"{first / back:.2f}x")
    _above([ratios(c) for c in last], "end to end, this boot")
    worst = max(ratios(c)[2] for c in last)
    if len(boots) > 1:
        worst = _pooled_tables(boots)
    return worst


def _pooled_tables(boots: list[list[Cold]]) -> float:
    """The pooled tables over every boot; the worst pooled ratio end to end."""
    k = len(boots)
    by_target = list(zip(*boots, strict=True))
    for inside, unit, scale in ((True, "ms", 1.0), (False, "ms", 1000.0)):
        where = "inside the PoP" if inside else "end to end"
        print(f"cold start over {k} boots, {where}: median of the {k} firsts / median "
              f"of the {k * (ROUNDS - 1)} warm samples; control: median of the {k} "
              f"round-2 samples / median of rounds 3-{ROUNDS}")
        rows = [pooled(list(cs), inside) for cs in by_target]
        for cs, (first, warm, ratio, control) in zip(by_target, rows, strict=True):
            print(f"  {cs[0].pop:<12}{cs[0].path:<11}{first * scale:8.3f} {unit} / "
                  f"{warm * scale:.3f} {unit} = {ratio:.2f}   control {control:.2f}")
        _above(rows, f"{where}, {k} boots")
    return max(pooled(list(cs))[2] for cs in by_target)


def _above(rows: list[tuple[float, float, float, float]], what: str) -> None:
    """How many first / warm ratios exceed TARGET, and how many controls do."""
    firsts = sum(r[2] > TARGET for r in rows)
    controls = sum(r[3] > TARGET for r in rows)
    print(f"  above {TARGET}x ({what}): first {firsts} of {len(rows)}, "
          f"control (a warm sample) {controls} of {len(rows)}")
