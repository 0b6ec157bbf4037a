"""`edgefn --help` stays fast: building the parser and printing any command's
help imports none of the heavy modules (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.cli import ROOT, edgefn

HEAVY = ["wasmtime", "numpy", "usearch", "lmdb", "uvloop", "httptools", "msgspec",
         "gpu_worker", "kv", "runtime.app", "runtime.admin", "runtime.bindings",
         "runtime.functions", "runtime.executors", "runtime.pop", "importlib.metadata"]

PROBE = """
import argparse, contextlib, io, json, sys
from runtime.cli import parser
from runtime.cli.main import main

def walk(p, path):
    yield path
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from walk(sub, [*path, name])

paths = list(walk(parser.build(), []))
for path in paths:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main([*path, "--help"])
heavy = json.loads(sys.argv[1])
print(json.dumps({"helps": len(paths),
                  "loaded": sorted(m for m in sys.modules
                                   if any(m == h or m.startswith(h + ".") for h in heavy))}))
"""


def test_help_of_every_command_imports_no_heavy_module() -> None:
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(HEAVY)], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["helps"] >= 25  # the top, 12 commands and their operations
    assert out["loaded"] == []


def test_the_probe_sees_an_eager_import() -> None:
    probe = PROBE.replace("from runtime.cli import parser", "import numpy\nfrom runtime.cli import parser")
    r = subprocess.run([sys.executable, "-c", probe, json.dumps(HEAVY)], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert "numpy" in json.loads(r.stdout)["loaded"]


def test_help_and_version_through_the_module_entry_point() -> None:
    r = edgefn("--help")
    assert r.returncode == 0 and "rollback" in r.stdout and "--version" in r.stdout
    r = edgefn("--version")
    assert r.returncode == 0 and r.stdout.startswith("edgefn ") and r.stdout.count(".") >= 2
