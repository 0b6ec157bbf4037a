"""A WASI command guest gets no files, no network and no environment beyond the
CGI request variables and its manifest's `env`, whatever the PoP's own environment.

The guest (tests/wasi_sandbox/sandbox.c) reports its arguments, environment, file
descriptors, preopened directories, listening sockets and which paths it can open.
It is rebuilt from source when the toolchain is installed (always under CI)."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from tests.support import Running, build_from_source

GUEST = Path(__file__).resolve().parent / "wasi_sandbox"
SECRET = "EDGEFN_SANDBOX_SECRET"

CGI = {"REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "SERVER_PROTOCOL", "CONTENT_LENGTH",
       "CONTENT_TYPE", "X_MATCHED_ROUTE", "REMOTE_ADDR"}


@pytest.fixture(scope="module")
def sandbox_wasm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sandbox.wasm rebuilt from sandbox.c (which must match the committed build)."""
    out = tmp_path_factory.mktemp("sandbox") / "sandbox.wasm"
    build_from_source(GUEST / "build.sh", out)
    assert out.read_bytes() == (GUEST / "sandbox.wasm").read_bytes(), (
        "tests/wasi_sandbox/sandbox.wasm is not what sandbox.c builds to: run its build.sh")
    return out


def deploy_sandbox(pop: Running, root: Path, wasm: Path) -> Path:
    """Deploy the guest with a manifest env naming a host folder that holds a secret
    file (PROBE_DIR); returns that folder."""
    probe_dir = root / "probe"
    probe_dir.mkdir()
    (probe_dir / "secret.txt").write_text("host secret\n")
    d = root / "sandbox"
    d.mkdir()
    shutil.copy(wasm, d / "sandbox.wasm")
    (d / "edgefn.toml").write_text(
        'name = "sandbox"\nruntime = "wasm"\nentry = "sandbox.wasm"\nabi = "wasi"\n'
        f'routes = ["/sandbox"]\n[env]\nALLOWED = "from the manifest"\nPROBE_DIR = "{probe_dir}"\n')
    pop.deploy(d)
    return probe_dir


def report(pop: Running) -> list[str]:
    """The guest's report for one request with exactly these headers."""
    with socket.create_connection((pop.host, pop.port), timeout=10) as s:
        s.sendall(b"POST /sandbox/x?q=1 HTTP/1.1\r\nHost: sandbox.test\r\nX-Probe: yes\r\n"
                  b"Content-Type: text/plain\r\nContent-Length: 4\r\nConnection: close\r\n"
                  b"\r\nbody")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), data
    lines = body.decode().splitlines()
    assert lines[-1] == "end", body  # the guest ran to the end
    return lines


def probe(pop: Running, tmp_path: Path, wasm: Path, monkeypatch: pytest.MonkeyPatch,
          ) -> tuple[list[str], Path]:
    monkeypatch.setenv(SECRET, "must-not-leak")  # in the PoP's own environment
    monkeypatch.chdir(tmp_path)  # where a relative path the guest creates would land
    probe_dir = deploy_sandbox(pop, tmp_path, wasm)
    return report(pop), probe_dir


def test_wasi_guest_environment_is_the_request_and_the_manifest_env_only(
        pop: Running, tmp_path: Path, sandbox_wasm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines, probe_dir = probe(pop, tmp_path, sandbox_wasm, monkeypatch)
    env = dict(line[4:].split("=", 1) for line in lines if line.startswith("env "))
    headers = {"HTTP_HOST", "HTTP_X_PROBE", "HTTP_CONNECTION"}  # content-* are CGI's own
    # the bot manager's class of this client (no User-Agent): the principal section
    assert set(env) == CGI | headers | {"ALLOWED", "PROBE_DIR", "EDGEFN_PRINCIPAL_BOT"}, \
        sorted(env)
    assert env["EDGEFN_PRINCIPAL_BOT"] == "automation"
    assert (env["ALLOWED"], env["PROBE_DIR"]) == ("from the manifest", str(probe_dir))
    assert (env["REQUEST_METHOD"], env["PATH_INFO"], env["QUERY_STRING"]) == ("POST", "/sandbox/x",
                                                                              "q=1")
    assert "must-not-leak" not in "\n".join(lines)
    assert [line for line in lines if line.startswith("arg ")] == ["arg sandbox"]


def test_wasi_guest_has_no_files_and_no_sockets(
        pop: Running, tmp_path: Path, sandbox_wasm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines, probe_dir = probe(pop, tmp_path, sandbox_wasm, monkeypatch)
    # stdin, stdout and stderr only: no preopened directory, no socket
    assert [line.split()[1] for line in lines if line.startswith("fd ")] == ["0", "1", "2"]
    assert [line for line in lines if line.startswith(("preopen ", "socket "))] == []
    opened = [line for line in lines if line.startswith(("read ", "create "))]
    assert len(opened) == 9 and not any(line.endswith(": OPENED") for line in opened), opened
    assert f"read {probe_dir}/secret.txt: Capabilities insufficient" in lines
    assert sorted(p.name for p in probe_dir.iterdir()) == ["secret.txt"]
    assert not (tmp_path / "created-by-guest.txt").exists()
