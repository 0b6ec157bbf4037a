"""The README's shell blocks marked ``<!-- readme-test: NAME -->`` run, as written,
against a real `edgefn dev functions/examples` (model worker included), so the
README cannot drift from what edgefn does.

Each block runs in bash with ``set -euo pipefail``; ``curl`` fails on any non-2xx
answer; ``localhost:8080`` is the PoP under test. Lines that activate a venv
(``. .venv/bin/activate``) are left out: the test puts this venv's bin first on PATH.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import wait_until_serving

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCK = re.compile(r"<!-- readme-test: (?P<name>[\w-]+) -->\n```sh\n(?P<body>.*?)\n```", re.S)
PRELUDE = """set -euo pipefail
curl() { command curl --fail-with-body -sS --max-time 120 "$@"; echo; }
"""


def blocks() -> dict[str, str]:
    found = {m["name"]: m["body"] for m in BLOCK.finditer(README.read_text())}
    assert {"tour", "quickstart", "stores"} <= set(found), f"marked blocks: {sorted(found)}"
    return found


@pytest.fixture(scope="module")
def pop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, dict[str, str]]]:
    work = tmp_path_factory.mktemp("readme")
    (work / "functions").symlink_to(ROOT / "functions")
    env = {**os.environ, "EDGEFN_DATA": str(work / "data"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "dev", "functions/examples",
                             "--port", "0"], cwd=work, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        yield wait_until_serving(proc).removeprefix("http://"), work, env
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(30)
        assert proc.stdout is not None
        proc.stdout.close()


def run_block(name: str, pop: tuple[str, Path, dict[str, str]]) -> str:
    address, work, env = pop
    body = "\n".join(line for line in blocks()[name].splitlines()
                     if not line.startswith(". "))
    script = PRELUDE + body.replace("localhost:8080", address)
    done = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, (f"README block {name!r} failed ({done.returncode}):\n"
                                  f"{done.stdout}\n{done.stderr}")
    return done.stdout


def test_the_tour_block(pop: tuple[str, Path, dict[str, str]]) -> None:
    out = run_block("tour", pop)
    assert "Hello from edgefn (WASM)!" in out and "Hello, Ada, from a Python isolate!" in out
    assert '"object":"chat.completion"' in out.replace(" ", "")


def test_the_quickstart_block(pop: tuple[str, Path, dict[str, str]]) -> None:
    out = run_block("quickstart", pop)
    answers = [line for line in out.splitlines() if "from edgefn (WASM)!" in line]
    assert [a.split()[0] for a in answers] == ["Hello", "Howdy", "Hello"], out


def test_the_stores_block(pop: tuple[str, Path, dict[str, str]]) -> None:
    out = run_block("stores", pop)
    assert "hello" in out and '"id": "a"' in out.replace('"id":"a"', '"id": "a"')
