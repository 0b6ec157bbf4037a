"""Where a loaded PoP's CPU goes, per request: `perf record` with DWARF call stacks
of the PoP (or of its isolate hosts) while wrk loads one function, folded into
microseconds a request by library, by symbol and by the innermost Python frame.

    python bench/profile_http.py [--function functions/examples/hello-wat] [--path /hello]
                                 [--target pop|hosts] [--seconds 5] [--frequency 999]
                                 [--under REGEX]... [--top 15] [--tree OTHER_CHECKOUT]

An `edgefn serve --no-ai` of the checkout with ``PYTHONPERFSUPPORT=1`` (Python 3.12+
names each Python frame ``py::function:file`` in perf's stacks), the function deployed
and warmed, then `wrk -t1 -c32` for `--seconds` while perf samples the target at
`--frequency` Hz. A sample's share of all samples, times the target's CPU a request
over the same window (its /proc clocks, all threads, divided by the requests wrk
made), is what that sample's code costs a request. Printed:

- by library (the sampled instruction's: libpython, the kernel, wasmtime, ...);
- the top symbols (self time);
- the innermost Python frame on each stack (inclusive: the C it called, the syscalls);
- for each `--under REGEX`: its inclusive share, and the frames it calls, one level
  down (e.g. ``--under edgefn_reactor_call`` splits wasmtime's part of a WASM request).

`--tree DIR`: the same for a second checkout (a worktree of the commit before), each
table with its column next to this one's: the before and after of a change, by frame.
On this 2-core VM the absolute figures move by ~10% between runs; a profile says where
the time goes, a bench/ ratio what a change is worth. The isolate hosts' Python frames
are not named (their subinterpreters run without perf's trampoline): by library and
symbol only. perf's DWARF stacks cost the target a third more CPU a request than
it takes unsampled. Needs perf (``apt-get install -y linux-perf``) and wrk, as root or with
``perf_event_paranoid`` <= 0.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import _cpu  # noqa: E402
import _python  # noqa: E402
import _wrk  # noqa: E402
import bench_runtime  # noqa: E402

NO_PYTHON = "(no Python frame)"


@dataclass
class Profile:
    """One checkout's samples, folded."""

    label: str
    samples: list[list[tuple[str, str]]] = field(default_factory=list)  # (symbol, library)
    us_per_request: float = 0.0  # the target's CPU a request over the sampled window
    rps: float = 0.0

    def us(self, count: int) -> float:
        return count / max(len(self.samples), 1) * self.us_per_request


def parse_script(text: str, tree: Path) -> list[list[tuple[str, str]]]:
    """`perf script -F comm,tid,ip,sym,dso` output as samples, each its frames from the
    sampled one out: (symbol, library's file name); Python frames' files relative to
    `tree`."""
    samples: list[list[tuple[str, str]]] = []
    frames: list[tuple[str, str]] = []
    prefix = f"{tree}/"
    for line in text.splitlines():
        if not line.strip():
            if frames:
                samples.append(frames)
            frames = []
            continue
        if not line[0].isspace():  # a sample's head: comm and tid
            frames = []
            continue
        parts = line.strip().split(None, 1)
        rest = parts[1] if len(parts) > 1 else "[unknown]"
        at = rest.rfind(" (")
        symbol, library = (rest[:at], rest[at + 2:-1]) if at >= 0 else (rest, "?")
        symbol = re.sub(r"\+0x[0-9a-f]+$", "", symbol)
        if symbol.startswith("py::"):
            symbol = symbol.replace(prefix, "")
        frames.append((symbol, os.path.basename(library)))
    if frames:
        samples.append(frames)
    return samples


def record(tree: Path, args: argparse.Namespace, work: Path) -> Profile:
    """Serve `args.function` from `tree`, load it, and sample the target meanwhile."""
    data = work / f"data-{len(list(work.iterdir()))}"
    os.environ["PYTHONPERFSUPPORT"] = "1"  # (start_edgefn passes this environment on)
    proc, port = bench_runtime.start_edgefn(data, ["--no-ai"], tree=tree,
                                            deploy=tree / args.function)
    url = f"http://127.0.0.1:{port}{args.path}"
    out = work / "perf.data"
    perf: subprocess.Popen[bytes] | None = None
    try:
        _wrk.run(url, seconds=1)  # warm-up (a Python pool grows to its size here)
        pids = [proc.pid] if args.target == "pop" else _cpu.isolate_hosts(proc.pid)
        if not pids:
            raise RuntimeError(f"{args.function} runs in no isolate host: --target pop")
        perf = subprocess.Popen(
            ["perf", "record", "-q", "-F", str(args.frequency), "-g", "--call-graph",
             "dwarf,16384", "-o", str(out), "-p", ",".join(map(str, pids))],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(0.5)  # perf attached
        meter = _cpu.Meter(pids)
        started = time.monotonic()
        r = _wrk.run(url, seconds=args.seconds)
        used = meter.stop()
        requests = r["rps"] * (time.monotonic() - started)
        perf.send_signal(signal.SIGINT)
        _, err = perf.communicate(timeout=120)
        if perf.returncode not in (0, -2) or not out.exists():
            raise RuntimeError(f"perf record failed ({perf.returncode}): {err.decode()}")
    finally:
        if perf is not None and perf.poll() is None:  # (wrk failed meanwhile)
            perf.kill()
            perf.wait(20)
        proc.terminate()
        proc.wait(20)
    text = subprocess.run(["perf", "script", "-i", str(out), "-F", "comm,tid,ip,sym,dso"],
                          capture_output=True, text=True, errors="replace", check=True).stdout
    out.unlink()
    return Profile(str(tree), parse_script(text, tree),
                   (used.user + used.system) / requests * 1e6, r["rps"])


def by_library(p: Profile) -> Counter[str]:
    """Each sample's library: its first frame's that perf did not mark inlined (an
    inlined function's frame carries its caller's address)."""
    return Counter(next((lib for _, lib in frames if lib != "inlined"), "inlined")
                   for frames in p.samples if frames)


def by_symbol(p: Profile) -> Counter[str]:
    return Counter(frames[0][0] for frames in p.samples if frames)


def by_python_frame(p: Profile) -> Counter[str]:
    return Counter(next((s for s, _ in frames if s.startswith("py::")), NO_PYTHON)
                   for frames in p.samples)


def under(p: Profile, pattern: re.Pattern[str]) -> tuple[int, Counter[str]]:
    """The samples with a frame matching `pattern` (its innermost match), and what it
    called: the frame one level down (itself where it was the sampled one)."""
    n, below = 0, Counter[str]()
    for frames in p.samples:
        at = next((i for i, (s, _) in enumerate(frames) if pattern.search(s)), None)
        if at is None:
            continue
        n += 1
        below[frames[at - 1][0] if at else f"{frames[0][0]} (self)"] += 1
    return n, below


def table(title: str, profiles: list[Profile], counts: list[Counter[str]], top: int) -> None:
    """The `top` keys of the first profile's counts (then the others' not among them),
    each profile's us a request and share."""
    keys = [k for k, _ in counts[0].most_common(top)]
    for c in counts[1:]:
        keys += [k for k, _ in c.most_common(top // 2) if k not in keys]
    cols = "".join(f"{'us/req':>9}{'share':>7}" for _ in profiles)
    print(f"\n{title}\n{'':<72}{cols}")
    for k in keys:
        row = "".join(f"{p.us(c[k]):>9.2f}{100 * c[k] / max(len(p.samples), 1):>6.1f}%"
                      for p, c in zip(profiles, counts, strict=True))
        print(f"{k[:71]:<72}{row}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--function", default="functions/examples/hello-wat",
                   help="a function folder, relative to each checkout")
    p.add_argument("--path", default="/hello")
    p.add_argument("--target", choices=("pop", "hosts"), default="pop",
                   help="the PoP process, or its isolate hosts (a Python function's)")
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--frequency", type=int, default=999, help="perf's samples a second")
    p.add_argument("--under", action="append", default=[], metavar="REGEX",
                   help="a frame whose callees to split (e.g. edgefn_reactor_call)")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--tree", type=Path, help="a second checkout, profiled the same way")
    args = p.parse_args()
    for tool in ("perf", "wrk"):
        if shutil.which(tool) is None:
            print(f"profile_http: {tool} is missing (apt-get install -y "
                  f"{'linux-perf' if tool == 'perf' else 'wrk'})", file=sys.stderr)
            return 1
    trees = [ROOT] + ([args.tree.resolve()] if args.tree else [])
    with tempfile.TemporaryDirectory(prefix="edgefn-profile-") as tmp:
        profiles = [record(tree, args, Path(tmp)) for tree in trees]
    whose = "the PoP's" if args.target == "pop" else "the isolate hosts'"
    print(f"== {args.function} {args.path}, wrk -t1 -c32 -d{args.seconds}s, perf at "
          f"{args.frequency} Hz on {whose} threads ==")
    print(f"python: {_python.build()}")
    for prof in profiles:
        print(f"{prof.label}: {prof.rps:.0f} req/s under perf, {prof.us_per_request:.1f} us "
              f"of {whose} CPU a request, {len(prof.samples)} samples")
    table("by library (the sampled instruction's)", profiles,
          [by_library(x) for x in profiles], args.top)
    table("by symbol (self)", profiles, [by_symbol(x) for x in profiles], args.top)
    python = [by_python_frame(x) for x in profiles]
    if any(set(c) != {NO_PYTHON} for c in python):
        table("by innermost Python frame (with what it called)", profiles, python, args.top)
    for regex in args.under:
        pattern = re.compile(regex)
        found = [under(x, pattern) for x in profiles]
        shares = ", ".join(f"{x.us(n):.2f} us/req ({100 * n / max(len(x.samples), 1):.1f}%)"
                           for x, (n, _) in zip(profiles, found, strict=True))
        table(f"under {regex}: {shares}; what it called", profiles,
              [below for _, below in found], args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
