"""Print the mutation score of each module `make mutate` mutates, from mutmut's results.

    python tests/mutation/scores.py [--survivors] [--min 85]

One line per file in ``[tool.mutmut] only_mutate`` (pyproject.toml) that has results
under mutants/. The score is detected / (detected + undetected): killed, timed out,
crashed (killed by any signal) or caught by the type checker count as detected;
survived, no test reached it or suspicious count as undetected. Mutants listed in
tests/mutation/equivalent.toml (name = reason) are left out: no test can tell them from
the original. Mutant names carry a number per function, so an entry there goes stale
when its function changes; the script says which entries no longer name a mutant.
With ``--survivors`` it also prints the diff of each undetected mutant; with ``--min N``
it exits 1 if a module scores below N %.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DETECTED = {"killed", "timeout", "segfault", "crashed", "caught by type check"}
UNDETECTED = {"survived", "no tests", "suspicious"}


def modules() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    return [p for p in config["only_mutate"] if (ROOT / p).is_file()]


def equivalent() -> dict[str, str]:
    return tomllib.loads((Path(__file__).parent / "equivalent.toml").read_text())


def results(module: str) -> dict[str, int | None]:
    meta = ROOT / "mutants" / f"{module}.meta"
    if not meta.exists():
        return {}
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    return codes


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--survivors", action="store_true", help="print each survivor's diff")
    parser.add_argument("--min", type=float, default=0.0, help="fail below this score (%%)")
    parser.add_argument("patterns", nargs="*", help="only mutants matching these globs")
    args = parser.parse_args()
    from mutmut.stats import status_by_exit_code  # a dev dependency, like pytest

    skip = equivalent()
    seen: set[str] = set()
    low = False
    print(f"{'module':44} {'score':>7} {'killed':>7} {'survived':>8} {'equiv':>6} {'unrun':>6}")
    for module in modules():
        codes = {k: v for k, v in results(module).items()
                 if not args.patterns or any(fnmatch(k, p) for p in args.patterns)}
        if not codes:
            continue
        seen |= codes.keys() & skip.keys()
        status = {k: _status(v, status_by_exit_code) for k, v in codes.items() if k not in skip}
        detected = sum(s in DETECTED for s in status.values())
        missed = sorted(k for k, s in status.items() if s in UNDETECTED)
        unrun = len(status) - detected - len(missed)
        judged = detected + len(missed)
        if not judged:
            print(f"{module:44} {'-':>7} {0:7} {0:8} {len(codes) - len(status):6} {unrun:6}")
            continue
        score = 100 * detected / judged
        low |= score < args.min
        print(f"{module:44} {score:6.1f}% {detected:7} {len(missed):8} "
              f"{len(codes) - len(status):6} {unrun:6}")
        if args.survivors:
            _print_diffs(missed, module)
    stale = sorted(skip.keys() - seen) if not args.patterns else []
    for name in stale:
        print(f"equivalent.toml: {name} names no mutant any more", file=sys.stderr)
    return 1 if low else 0


def _status(code: int | None, by_exit_code: dict[int | None, str]) -> str:
    """mutmut's status, except that a test run killed by a signal mutmut does not name
    (SIGABRT from a panic in native code) crashed: the mutant failed the tests."""
    status = by_exit_code[code]
    return "crashed" if status == "suspicious" and code is not None and code < 0 else status


def _print_diffs(names: list[str], module: str) -> None:
    import os

    from mutmut.mutation.diff_apply import get_diff_for_mutant

    here = os.getcwd()
    os.chdir(ROOT)  # mutmut reads mutants/ relative to the project root
    try:
        for name in names:
            print(f"\n# {name}")
            print(get_diff_for_mutant(name, path=module))
    finally:
        os.chdir(here)


if __name__ == "__main__":
    sys.exit(main())
