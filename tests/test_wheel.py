"""The wheel is the product: built from the repo, installed into a fresh venv, it
runs `edgefn dev` on the examples from outside the checkout, compiling the native
reactor from its packaged source and importing the packaged guest SDK."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import wait_until_serving

ROOT = Path(__file__).resolve().parent.parent
RUNTIME_FILES = [
    "runtime/executors/wasm/native_src/reactor.c",  # the native fast path, built on first use
    "runtime/executors/wasm/native_src/kv_get.c",  # the native kv_get, built on first use
    "runtime/executors/wasm/native_src/wasi.c",  # WASI commands run natively
    "runtime/net/native_src/lane.c",  # the native lane, built on first use: without it
    "runtime/net/native_src/lane_drain.c.h",  # every request took the Python front (and
    "runtime/net/native_src/lane_routes.c.h",  # its parts, which it includes)
    "runtime/net/native_src/lane_cgi.c.h",
    "runtime/security/ratelimit/native_src/counters.c",  # rate limits counted in C
    "edgefn_core/codec.c",  # the C codec of the function ABI, built on first use
    "kv/lmdb_handles.py",
    "edgefn/__init__.py",  # the Python guest SDK, imported inside isolates
    "edgefn_sdk/c/edgefn.h",
    "edgefn_sdk/assemblyscript/edgefn.ts",
    "edgefn_core/errors.py",
    "runtime/pipeline/stages/dispatch.py",
    "gpu_worker/engines/llamacpp.py",
    "kv/store.py",
    "runtime/observe/dashboard/static/index.html",  # the dashboard's page (package data)
    "runtime/observe/dashboard/static/app.js",
    "runtime/observe/dashboard/static/style.css",
    "runtime/security/bots/agents.toml",
    "runtime/net/openai_sse.py",
]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w",
                    str(out), str(ROOT)], check=True, capture_output=True, timeout=300)
    (built,) = out.glob("edgefn-*.whl")
    return built


@pytest.fixture(scope="session")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed (not editable). Its dependencies come
    from this test run's environment through a .pth line, so nothing is
    downloaded or compiled again; edgefn itself only from the wheel."""
    env = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(env), "platbase": str(env)}))
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    # --ignore-installed: pip sees the checkout's editable edgefn through deps.pth
    subprocess.run([sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"),
                    "install", "--quiet", "--no-deps", "--ignore-installed", str(wheel)],
                   check=True, capture_output=True, timeout=300, env=without_pythonpath())
    return env


def without_pythonpath() -> dict[str, str]:
    """This environment less PYTHONPATH (a test run from a checkout may set it), so
    that the venv imports only what is installed in it."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def test_the_wheel_holds_what_the_runtime_needs(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f for f in RUNTIME_FILES if f not in names]
    assert not missing, f"not in {wheel.name}: {missing}"
    assert not any(n.startswith(("tests/", "bench/")) for n in names)


def test_the_installed_package_imports_from_the_venv_not_the_checkout(venv: Path,
                                                                      tmp_path: Path) -> None:
    code = "import edgefn, edgefn_core, runtime, kv, gpu_worker; print(runtime.__file__, " \
           "edgefn.__file__)"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=tmp_path, check=True,
                         capture_output=True, text=True, env=without_pythonpath()).stdout
    assert str(ROOT) not in out and str(venv) in out, out


@pytest.fixture
def dev_from_wheel(venv: Path, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    examples = tmp_path / "examples"
    for name in ("hello-wat", "python-hello"):
        shutil.copytree(ROOT / "functions" / "examples" / name, examples / name)
    env = {**without_pythonpath(), "EDGEFN_NATIVE_CACHE": str(tmp_path / "native")}
    proc = subprocess.Popen(
        [str(venv / "bin" / "edgefn"), "dev", str(examples), "--no-ai", "--port", "0",
         "--data", str(tmp_path / "data")], cwd=tmp_path, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = wait_until_serving(proc, 120)
        yield url, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(30)
        assert proc.stdout is not None
        proc.stdout.close()


def test_edgefn_dev_from_the_wheel_serves_wasm_and_python(
        dev_from_wheel: tuple[str, subprocess.Popen[str]], tmp_path: Path) -> None:
    url, _ = dev_from_wheel
    with urllib.request.urlopen(url + "/hello", timeout=30) as r:
        assert r.status == 200 and b"hello" in r.read().lower()
    with urllib.request.urlopen(url + "/py/hello?name=wheel", timeout=30) as r:
        assert r.status == 200 and b"wheel" in r.read()
    # the native fast path was compiled here, from the reactor.c inside the wheel, and
    # the native lane from its lane.c (a wheel without it served every request in Python)
    assert list((tmp_path / "native").glob("*.so")), "native reactor not built"
    assert list((tmp_path / "native").glob("lane-*.so")), "native lane not built"
