"""The deploy-time check for imports that would fail only at request time."""

from __future__ import annotations

from pathlib import Path

from runtime.executors.python.importcheck import later_imports, unloadable


def test_finds_imports_a_deploy_does_not_run(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text(
        "import json, msgspec\nfrom . import sibling\nimport helper\n\n"
        "def handle(request, env):\n    import numpy.linalg\n    from lmdb import Environment\n"
        "    import zlib, helper, pkg.sub\n    f = lambda: __import__('x')\n"
        "    class Inner:\n        def m(self):\n            import uvloop\n")
    (tmp_path / "helper.py").write_text("import httptools\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "sub.py").write_text("def f():\n    from usearch.index import Index\n")
    (tmp_path / ".hidden.py").write_text("import hidden_dep\n")
    assert later_imports(tmp_path, "main") == {
        "httptools": "helper.py:1",  # a module's top level runs only when it is imported
        "numpy": "main.py:6", "lmdb": "main.py:7", "uvloop": "main.py:12",
        "usearch": "pkg/sub.py:2"}  # not json/zlib (stdlib), helper/pkg (its own), msgspec


def test_a_function_without_later_imports_costs_no_probe(tmp_path: Path) -> None:
    (tmp_path / "main.py").write_text("import json\ndef handle(r, env):\n    import re\n")
    assert later_imports(tmp_path, "main") == {}


def test_probes_in_an_isolated_interpreter_and_ignores_missing_modules() -> None:
    bad = unloadable(["msgspec", "no_such_module_xyz", "email"], [])
    assert list(bad) == ["msgspec"]
    assert "does not support loading in subinterpreters" in bad["msgspec"]
