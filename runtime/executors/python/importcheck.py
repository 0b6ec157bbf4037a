"""A deploy-time warning for modules a Python function imports that cannot load
in an isolate but would only fail at request time.

An import at the top of the entry module runs at deploy, and one that cannot
load in an isolated subinterpreter rejects the deploy (`guest.prepare`). One
inside a function (``def handle(request, env): import numpy``), or at the top of
a module the function imports only later, runs when a request gets there. So
`warnings` reads the function's files for such imports and tries each
third-party module they name in a throwaway isolated interpreter.

Runs in the isolate-host process, before its isolates start; stdlib only.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from runtime.executors.python import interp

MAX_FILES = 200
UNSUPPORTED = re.compile(r"module \S+ does not support loading in subinterpreters")

# Run in the throwaway interpreter: raise ImportError(<the root cause>) only for a
# C extension that refuses subinterpreters (a plain missing module may be optional).
PROBE = """
import re, sys
sys.path[:0] = {paths!r}
try:
    import {name}
except BaseException as e:
    c, n = e, 0
    while c is not None and n < 10:
        m = re.search({pattern!r}, str(c))
        if m:
            raise ImportError(m.group(0)) from None
        c, n = c.__cause__ or c.__context__, n + 1
"""


def warnings(function_dir: str, entry: str, paths: list[str]) -> list[str]:
    """One line per module imported in `function_dir`'s files (other than at the
    top of `entry`.py) that cannot load in an isolated interpreter."""
    found = later_imports(Path(function_dir), entry)
    if not found:
        return []
    return [f"{found[name]} imports `{name}`, which cannot load in an isolate ({why}); "
            "requests that reach that import will fail"
            for name, why in unloadable(sorted(found), paths).items()]


def later_imports(root: Path, entry: str) -> dict[str, str]:
    """Top-level names of third-party modules imported where a deploy does not run
    the import (inside functions, or in modules other than `entry`), each with
    where it is first imported (``main.py:7``). Unreadable files are skipped."""
    own = {p.stem for p in root.glob("*.py")} | {p.name for p in root.iterdir() if p.is_dir()}
    skip = own | set(sys.stdlib_module_names) | {"edgefn", "runtime"}
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py"))[:MAX_FILES]:
        rel = path.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            continue
        try:
            tree = ast.parse(path.read_bytes(), str(rel))
        except (SyntaxError, ValueError, OSError):
            continue
        for node, nested in _imports(tree, False):
            if nested or str(rel) != f"{entry}.py":
                for name in _names(node):
                    if name not in skip:
                        found.setdefault(name, f"{rel}:{node.lineno}")
    return found


def _imports(node: ast.AST, nested: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement under `node`, and whether it is inside a function."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, nested
        else:
            inner = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            yield from _imports(child, nested or inner)


def _names(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name.split(".")[0] for alias in node.names]
    return [node.module.split(".")[0]] if node.module and not node.level else []


def unloadable(names: list[str], paths: list[str]) -> dict[str, str]:
    """Which of `names` a fresh isolated interpreter cannot import, and why."""
    out = {}
    i = interp.create()
    try:
        for name in names:
            err = interp.run_error(i, PROBE.format(paths=paths, name=name,
                                                   pattern=UNSUPPORTED.pattern))
            if err is not None and UNSUPPORTED.search(err[1]):
                out[name] = err[1]
    finally:
        interp.destroy(i)
    return out
