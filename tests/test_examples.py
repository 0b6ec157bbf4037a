"""Every compiled example rebuilds from source, with its build.sh, to exactly the
committed module.

The builds are reproducible byte for byte with the pinned toolchains (Debian's clang
14 + lld + wasi-libc; AssemblyScript 0.27.37, pinned in counter-as/build.sh), so the
comparison is of the raw bytes: a change to a source, an SDK header or a build flag
that is not followed by a rebuild of the committed .wasm fails here. `make test`
installs the toolchains; without them the tests are skipped with the install hint,
except under CI, where that is a failure.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.support import EXAMPLES, build_from_source

BUILT = {  # example -> the module its build.sh writes
    "hello-c": "hello.wasm",
    "counter-c": "counter.wasm",
    "retrieval-c": "retrieval.wasm",
    "ai-c": "ai.wasm",
    "counter-as": "counter.wasm",
}


def test_every_example_with_a_build_script_is_checked() -> None:
    assert {p.parent.name for p in EXAMPLES.glob("*/build.sh")} == set(BUILT)


def toolchain_env() -> dict[str, str]:
    """ASC for counter-as/build.sh when the venv running the tests has the compiler
    `make test` installs (build.sh itself looks in the checkout's .venv)."""
    asc = Path(sys.prefix) / "tools" / "node_modules" / ".bin" / "asc"
    return {"ASC": str(asc)} if "ASC" not in os.environ and asc.exists() else {}


@pytest.mark.parametrize("example", sorted(BUILT))
def test_example_rebuilds_from_source_to_the_committed_module(example: str,
                                                              tmp_path: Path) -> None:
    folder = EXAMPLES / example
    out = tmp_path / BUILT[example]
    build_from_source(folder / "build.sh", out, toolchain_env())
    rebuilt, committed = out.read_bytes(), (folder / BUILT[example]).read_bytes()
    assert rebuilt == committed, (
        f"{example}/build.sh builds {len(rebuilt)} bytes that differ from the committed "
        f"{BUILT[example]} ({len(committed)} bytes): rebuild and commit it, or check the "
        "toolchain version against the pinned one")


@pytest.mark.parametrize("example", ["counter-c", "retrieval-c", "ai-c"])
def test_a_c_example_copied_out_of_the_checkout_builds_with_the_installed_sdk(
        example: str, tmp_path: Path) -> None:
    """They included ``../../sdk/c/edgefn.h``: a copy failed with "file not found"
    (the README's way to copy an example)."""
    import shutil

    copy = tmp_path / example
    shutil.copytree(EXAMPLES / example, copy)
    out = tmp_path / BUILT[example]
    build_from_source(copy / "build.sh", out, {"PYTHON": sys.executable})
    assert out.read_bytes() == (EXAMPLES / example / BUILT[example]).read_bytes()


def test_the_assemblyscript_example_copied_out_builds_with_the_installed_sdk(
        tmp_path: Path) -> None:
    """counter.ts imports ``../../sdk/assemblyscript/edgefn``: a copy failed with
    "TS6054: File '../../sdk/assemblyscript/edgefn.ts' not found"."""
    import shutil

    copy = tmp_path / "counter-as"
    shutil.copytree(EXAMPLES / "counter-as", copy)
    out = tmp_path / "counter.wasm"
    build_from_source(copy / "build.sh", out, {"PYTHON": sys.executable, **toolchain_env()})
    assert out.read_bytes() == (EXAMPLES / "counter-as" / "counter.wasm").read_bytes()
