"""`.ci/python-pgo` (what `make python` runs) builds only from CPython's own source:
a tarball whose sha256 is not the pinned one is refused before anything is unpacked
or built, and an interpreter already in the folder is kept only when it is that
version built with PGO and LTO (the suite's own interpreter, whatever it is, is not:
here 3.13.0 built without them, so the script goes on to the tarball; on
`make python`'s own interpreter it is kept)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import _python

SCRIPT = ROOT / ".ci" / "python-pgo"


def run(target: Path, tarball: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), str(target)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "EDGEFN_PYTHON_TARBALL": str(tarball)})


def test_a_tarball_that_is_not_cpythons_source_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "python.tar.xz"
    fake.write_bytes(b"not the source")
    out = run(tmp_path / "py", fake)
    assert out.returncode == 1, out
    assert "is not CPython 3.13.5's source (sha256 differs" in out.stderr
    assert "nothing built" in out.stderr and out.stdout == ""
    assert not (tmp_path / "py").exists()


def test_an_interpreter_in_the_folder_is_kept_only_when_it_is_the_optimized_build(
        tmp_path: Path) -> None:
    (tmp_path / "py" / "bin").mkdir(parents=True)
    (tmp_path / "py" / "bin" / "python3").symlink_to(sys.executable)
    fake = tmp_path / "python.tar.xz"
    fake.write_bytes(b"not the source")
    out = run(tmp_path / "py", fake)
    if platform.python_version() == "3.13.5" and _python.running_optimized():  # make python's
        assert (out.returncode, out.stdout) == (0, f"{tmp_path}/py/bin/python3\n"), out
    else:  # not kept: the tarball is checked (and refused) next
        assert out.returncode == 1 and "sha256 differs" in out.stderr, out
