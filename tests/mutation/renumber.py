"""Find the new names of equivalent mutants after their functions changed.

    python tests/mutation/renumber.py REV [MODULE ...]

mutmut numbers a function's mutants in order, so an edit to a function renumbers them,
and an entry of tests/mutation/equivalent.toml may then name another mutant under the
old reason. For each entry of each MODULE (default: every module with entries), this
generates the mutants of the module at REV (git) and in the working tree, both with
mutmut's own generator (seconds; nothing is run), and matches each entry's mutant by
its change to the function's body. It prints the entries whose number moved (``old ->
[new]``), those whose change no longer exists (``-> []``: recheck, or drop the entry)
and those whose function is gone; nothing when all still hold. It edits nothing.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
from pathlib import Path

import mutmut.__main__ as mutmut_main

ROOT = Path(__file__).resolve().parents[2]
EQUIVALENT = ROOT / "tests" / "mutation" / "equivalent.toml"
_DEF = re.compile(r"\n    (?:async )?def (xǁ\w+ǁ\w+__mutmut_\w+)[([]|\n(?:async )?def (x_\w+__mutmut_\w+)[([]")
_NEXT = re.compile(r"\n    (?:async )?def |\n(?:async )?def |\n    @|\n@|\nclass ")
_HEAD_END = re.compile(r"\)(?: -> [^\n]*)?:\n")


def bodies(path: str, code: str) -> dict[str, str]:
    """Each mutant's (and ``..._orig``'s) body, its signature left out (a new parameter
    changes every one)."""
    mutated = mutmut_main.mutate_file_contents(path, code).code
    out = {}
    for found in _DEF.finditer(mutated):
        name = found.group(1) or found.group(2)
        rest = mutated[found.start() + 5:]
        end = _NEXT.search(rest)
        body = rest[:end.start()] if end else rest
        head = _HEAD_END.search(body)
        out[name] = body[head.end():] if head else body
    return out


def change(functions: dict[str, str], function: str, number: str) -> tuple[str, ...]:
    """The lines mutant `number` of `function` changes, as a diff."""
    original = functions[f"{function}__mutmut_orig"].splitlines()
    mutant = functions[f"{function}__mutmut_{number}"].splitlines()
    return tuple(line for line in difflib.unified_diff(original, mutant, lineterm="", n=0)
                 if line[:1] in "+-" and line[:3] not in ("+++", "---"))


def check(rev: str, module: str, names: list[str]) -> list[str]:
    path = module.replace(".", "/") + ".py"
    old_code = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout
    old, new = bodies(path, old_code), bodies(path, (ROOT / path).read_text())
    report = []
    for name in names:
        function, number = name[len(module) + 1:].rsplit("__mutmut_", 1)
        if f"{function}__mutmut_orig" not in new:
            report.append(f"{name}: its function is gone")
            continue
        if f"{function}__mutmut_{number}" not in old:
            report.append(f"{name}: no such mutant at {rev}")
            continue
        wanted = change(old, function, number)
        found = [n for n in range(1, 10_000) if f"{function}__mutmut_{n}" in new
                 and change(new, function, str(n)) == wanted]
        if int(number) not in found:
            report.append(f"{name} -> {found}")
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="the git revision the entries were numbered against")
    ap.add_argument("modules", nargs="*", help="dotted module names (default: all)")
    a = ap.parse_args()
    entries = re.findall(r'^"([\w.]+\.x[^"]+)"', EQUIVALENT.read_text(), re.M)
    by_module: dict[str, list[str]] = {}
    for name in entries:
        module = name[:name.index(".x")]
        by_module.setdefault(module, []).append(name)
    report = []
    for module in a.modules or sorted(by_module):
        report += check(a.rev, module, by_module.get(module, []))
    print("\n".join(report) if report else "every entry still names the mutant it describes")
    return 1 if report else 0


if __name__ == "__main__":
    sys.exit(main())
