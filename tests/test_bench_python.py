"""bench/_python.py names the interpreter a benchmark ran on: optimized only when
its configure line asked for both profile-guided and link-time optimization; run as a
script it gives `.ci/python-pgo` the same answer."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from tests.support import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import _python


def test_only_both_flags_make_an_optimized_build() -> None:
    both = "'--enable-optimizations' '--with-lto' '--prefix=/opt/py'"
    assert _python.optimized(both)
    assert not _python.optimized("'--enable-optimizations' '--prefix=/opt/py'")
    assert not _python.optimized("'--with-lto' '--prefix=/opt/py'")
    assert not _python.optimized("'--enable-shared' '--prefix=/root/.pyenv/versions/3.13.0'")
    assert _python.optimized("'--enable-optimizations' '--with-lto=full'")
    assert not _python.optimized("'--enable-optimizations' '--with-lto=no'")
    assert not _python.optimized("")


def test_the_header_names_version_and_kind() -> None:
    line = _python.build()
    assert line.startswith(f"CPython {sys.version.split()[0]} (")
    assert ("PGO + LTO" in line) != ("without PGO" in line)


def test_as_a_script_it_says_whether_this_interpreter_is_that_version_built_so() -> None:
    """What `.ci/python-pgo` asks of an interpreter before it keeps it."""
    script = str(ROOT / "bench" / "_python.py")
    mine = subprocess.run([sys.executable, script, platform.python_version()], timeout=30)
    built_so = _python.running_optimized()
    assert mine.returncode == (0 if built_so else 1)
    other = subprocess.run([sys.executable, script, "3.0.0"], timeout=30)
    assert other.returncode == 1


def test_paired_ratios_are_taken_within_each_round() -> None:
    """`_variants.paired`: each later variant's figure over the first's of the same
    round (a slow round takes both down: its ratio stays), median and range; the
    ratio of medians would say otherwise here."""
    import _variants

    results = {"base": [{"rps": 100.0}, {"rps": 50.0}, {"rps": 100.0}],
               "new": [{"rps": 110.0}, {"rps": 55.0}, {"rps": 90.0}]}
    assert _variants.paired(results, ("rps",)) == [("new", {"rps": (1.1, 0.9, 1.1)})]
    medians = _variants.medians(results, ("rps",))
    assert medians[1][2]["rps"] == 0.9  # 90 / 100: the slow round moved the medians
    assert _variants.paired({"base": results["base"]}, ("rps",)) == []
    with pytest.raises(ValueError, match="has 2 rounds, the first 3"):
        _variants.paired({"base": results["base"], "short": results["new"][:2]}, ("rps",))


def test_paired_lines_name_each_later_variant_and_figure(capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    import _variants

    results = {"base": [{"rps": 100.0, "p": 2.0}, {"rps": 50.0, "p": 4.0}],
               "new": [{"rps": 110.0, "p": 1.0}, {"rps": 45.0, "p": 4.0}]}
    _variants.print_paired(results, {"req/s": "rps", "p50": "p"}, lambda v: f"[{v}]")
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  [new]: req/s 1.00 (0.90-1.10), p50 0.75 (0.50-1.00)"]
    _variants.print_paired({"base": results["base"]}, {"req/s": "rps"}, str)
    assert capsys.readouterr().out == ""


def test_a_figure_the_first_variant_lacks_has_no_ratio() -> None:
    """A WASM function has no isolate hosts (`bench_python_http.py --function
    hello-wat`): its host figure is 0, and a ratio to it is NaN, not a crash."""
    import math

    import _variants

    results = {"base": [{"rps": 100.0, "host": 0.0}], "new": [{"rps": 90.0, "host": 0.0}]}
    assert _variants.medians(results, ("rps",))[1][2] == {"rps": 0.9}
    assert math.isnan(_variants.medians(results, ("host",))[1][2]["host"])
    (_, spans), = _variants.paired(results, ("rps", "host"))
    assert spans["rps"] == (0.9, 0.9, 0.9) and all(math.isnan(x) for x in spans["host"])


def test_bench_python_http_tells_a_python_example_by_its_manifest() -> None:
    import bench_python_http

    examples = ROOT / "functions" / "examples"
    assert bench_python_http.is_python(examples / "python-hello")
    assert not bench_python_http.is_python(examples / "hello-wat")
