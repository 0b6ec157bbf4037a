"""The Python isolate hosts' sandbox, attacked from inside by a hostile function
(`hostile/attacks.py`): every attack fails with a clear error, and a benign
function keeps answering 200 while it runs. Real PoP, real host processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.executors.python import policy, sandbox
from tests.support import Running, host_pids, pop_thread, python_function, running

HOSTILE = (Path(__file__).parent / "hostile" / "attacks.py").read_text()
SECRET = "EDGEFN_TEST_POP_SECRET"
BENIGN = "from edgefn import Response\n\ndef handle(request, env):\n    return Response('ok')\n"
ROOT = os.geteuid() == 0
LIMITS = "cpu_ms = 1000\nwall_ms = 5000"



def machine_lacks() -> str:
    """Why this kernel cannot sandbox at all ("" when it can); judged from the
    machine, not from the probe, so that a broken layer fails these tests."""
    if sandbox.landlock_abi() < sandbox.LANDLOCK_ABI:
        return f"Landlock ABI {sandbox.landlock_abi()} < {sandbox.LANDLOCK_ABI}"
    try:
        import pyseccomp  # noqa: F401
    except (ImportError, OSError) as e:
        return f"no libseccomp: {e}"
    return ""


pytestmark = pytest.mark.skipif(machine_lacks() != "", reason=machine_lacks())


@pytest.fixture(scope="module")
def pop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """A PoP whose own environment holds a secret, serving `hostile`, a second copy
    of it (`victim`), `benign`, and `scratchy` (recycled after every request)."""
    root = tmp_path_factory.mktemp("sandbox")
    os.environ[SECRET] = "hunter2"
    try:
        with pop_thread(root / "data") as p:
            for name in ("hostile", "victim"):
                p.deploy(python_function(root, name, HOSTILE, limits=LIMITS,
                                         env='GRANTED = "yes"'))
            p.deploy(python_function(root, "benign", BENIGN))
            p.deploy(python_function(root, "scratchy", HOSTILE, limits=LIMITS,
                                     pool="min = 1\nmax = 1\nstandby = false\nrecycle_after = 1"))
            yield p
    finally:
        del os.environ[SECRET]


def attack(pop: Running, name: str, arg: object = "", fn: str = "hostile") -> dict[str, Any]:
    """Run attack `name` in function `fn` while `benign` is polled; asserts that
    every benign request (at least 5) answered 200 during it."""
    statuses: list[int] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set() or len(statuses) < 5:
            statuses.append(pop.get("/benign")[0])

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        status, _, body = pop.get(f"/{fn}?attack={name}&arg={arg}")
    finally:
        done.set()
        poller.join(30)
    assert status == 200, body
    assert statuses and set(statuses) == {200}, statuses
    result: dict[str, Any] = json.loads(body)
    return result


def refused(result: dict[str, Any], *errors: str) -> None:
    assert result["ok"] is False, f"the attack went through: {result}"
    assert result["error"] in errors, result


def data_file(pop: Running, pattern: str) -> Path:
    found = sorted(pop.data.rglob(pattern))
    assert found, f"no {pattern} under {pop.data}"
    return found[0]


# -- files ------------------------------------------------------------------------------------
def test_cannot_read_admin_token(pop: Running) -> None:
    token = pop.data / "admin.token"
    assert token.exists()
    refused(attack(pop, "read", token), "FileNotFoundError")


def test_cannot_read_etc_shadow_or_passwd(pop: Running) -> None:
    refused(attack(pop, "read", "/etc/shadow"), "FileNotFoundError")
    refused(attack(pop, "read", "/etc/passwd"), "FileNotFoundError")


def test_cannot_read_or_overwrite_another_functions_code(pop: Running) -> None:
    code = data_file(pop, "versions/victim/*/main.py")
    before = code.read_bytes()
    refused(attack(pop, "read", code), "FileNotFoundError")
    refused(attack(pop, "write", code), "FileNotFoundError")
    refused(attack(pop, "write", code.parent / "extra.py"), "FileNotFoundError")
    assert code.read_bytes() == before and not (code.parent / "extra.py").exists()


def test_cannot_truncate_the_lmdb_file(pop: Running) -> None:
    pop.pop.stores.kv.create_namespace("precious")  # opens (creates) the LMDB files
    mdb = data_file(pop, "kv/*.mdb")
    size = mdb.stat().st_size
    refused(attack(pop, "truncate", mdb), "FileNotFoundError")
    assert mdb.stat().st_size == size > 0


def test_cannot_write_its_own_code(pop: Running) -> None:
    code = data_file(pop, "versions/hostile/*/main.py")
    before = code.read_bytes()
    result = attack(pop, "write_own_code")
    refused(result, "OSError", "PermissionError")
    assert result["errno"] in (30, 13), result  # EROFS (read-only mount), EACCES (Landlock)
    assert code.read_bytes() == before


def test_tmp_is_private_to_each_function(pop: Running) -> None:
    name = f"edgefn-leak-{os.getpid()}"
    wrote = attack(pop, "write_tmp", name)
    assert wrote["ok"] and name in wrote["result"], wrote  # its own private /tmp
    refused(attack(pop, "read", f"/tmp/{name}", fn="victim"), "FileNotFoundError")
    assert not Path(f"/tmp/{name}").exists()


def test_scratch_dir_is_writable_and_wiped_when_the_isolate_recycles(pop: Running) -> None:
    first = attack(pop, "scratch", "a", fn="scratchy")
    assert first["ok"], first
    second = attack(pop, "scratch", "b", fn="scratchy")  # a fresh interpreter (recycle_after = 1)
    assert second["ok"], second
    assert first["result"]["before"] == second["result"]["before"] == []
    assert second["result"]["dir"] == first["result"]["dir"]


# -- environment and identity -----------------------------------------------------------------
def test_environment_holds_only_what_the_manifest_grants(pop: Running) -> None:
    result = attack(pop, "environ")
    assert result["ok"], result
    env = result["result"]
    assert SECRET not in env and "hunter2" not in json.dumps(env)
    assert env["GRANTED"] == "yes"
    assert set(env) <= {"GRANTED", *sandbox.KEEP_ENV, "PYTHONPATH", "MALLOC_ARENA_MAX",
                        "PYTHONDONTWRITEBYTECODE", "PYTHONNOUSERSITE", "TMPDIR", "PATH"}, env
    refused(attack(pop, "proc_environ", os.getpid()), "FileNotFoundError", "PermissionError")


@pytest.mark.skipif(not ROOT, reason="the uid layer applies when the PoP runs as root")
def test_runs_as_an_unprivileged_uid_of_its_own(pop: Running) -> None:
    hostile, victim = attack(pop, "identity"), attack(pop, "identity", fn="victim")
    for r in (hostile, victim):
        assert sandbox.UID_BASE <= r["result"]["uid"] < sandbox.UID_BASE + sandbox.UID_RANGE
        assert r["result"]["gid"] == r["result"]["uid"] and r["result"]["groups"] == []
    assert hostile["result"]["uid"] != victim["result"]["uid"]


# -- processes and signals --------------------------------------------------------------------
@pytest.mark.parametrize("how, error", [
    ("run_subprocess", "PermissionError"), ("posix_spawn", "PermissionError"),
    ("libc_fork", "PermissionError"), ("libc_system", "ChildProcessError")])
def test_cannot_start_a_process(pop: Running, how: str, error: str) -> None:
    result = attack(pop, how)
    refused(result, error)
    if error == "PermissionError":
        assert result["errno"] == 1, result  # EPERM, from seccomp


def test_cannot_kill_the_pop_or_another_host(pop: Running) -> None:
    (other,) = host_pids("benign")
    for pid in (os.getpid(), other):
        result = attack(pop, "kill", pid)
        refused(result, "PermissionError")
    assert running(other) and pop.get("/benign")[0] == 200


# -- network ----------------------------------------------------------------------------------
def test_cannot_connect_to_a_loopback_tcp_listener(pop: Running) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.2)
        refused(attack(pop, "tcp_connect", server.getsockname()[1]), "PermissionError")
        with pytest.raises(TimeoutError):
            server.accept()


def test_cannot_send_udp(pop: Running) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        udp.settimeout(0.2)
        refused(attack(pop, "udp_send", udp.getsockname()[1]), "PermissionError")
        with pytest.raises(TimeoutError):
            udp.recv(16)


# -- a machine that lacks a layer -------------------------------------------------------------
@pytest.fixture
def lacking_seccomp(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The probe reports seccomp missing (`sandbox.SKIP_ENV`), as on a machine without it."""
    monkeypatch.setenv(sandbox.SKIP_ENV, "seccomp")
    policy.probe.cache_clear()
    yield
    monkeypatch.delenv(sandbox.SKIP_ENV)
    policy.probe.cache_clear()


def test_python_functions_are_refused_where_a_layer_is_missing(
        tmp_path: Path, lacking_seccomp: None, caplog: pytest.LogCaptureFixture) -> None:
    fn = python_function(tmp_path, "benign", BENIGN)
    with pop_thread(tmp_path / "data") as p:
        from edgefn_core.errors import AdminError

        with pytest.raises(AdminError) as e:
            p.deploy(fn)
        assert e.value.status == 503 and e.value.code == "sandbox_missing"
        assert "lacks seccomp" in str(e.value) and "--insecure-python" in str(e.value)
        assert p.get("/benign")[0] == 404
    said = [r.getMessage() for r in caplog.records if "Python sandbox" in r.getMessage()]
    assert len(said) == 1 and "seccomp" in said[0] and "refused" in said[0], said


def test_insecure_python_runs_them_anyway(tmp_path: Path, lacking_seccomp: None,
                                          caplog: pytest.LogCaptureFixture) -> None:
    fn = python_function(tmp_path, "benign", BENIGN)
    with pop_thread(tmp_path / "data", insecure_python=True) as p:
        p.deploy(fn)
        assert p.get("/benign")[0] == 200
    said = [r.getMessage() for r in caplog.records if "Python sandbox" in r.getMessage()]
    assert len(said) == 1 and "--insecure-python" in said[0] and "seccomp" in said[0], said


def test_the_insecure_python_flag_reaches_the_config() -> None:
    from runtime.cli.dev import pop_config
    from runtime.cli.parser import build

    for command in (["serve"], ["dev", "functions"]):
        assert pop_config(build().parse_args([*command, "--insecure-python"])).insecure_python
        assert not pop_config(build().parse_args(command)).insecure_python


# -- edgefn doctor ----------------------------------------------------------------------------
def run_doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.cli.main", "doctor", *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_doctor_lists_every_layer_enforced() -> None:
    out = run_doctor("--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    expected = "enforced" if ROOT else None
    for layer in sandbox.LAYERS:
        state = report["python_sandbox"][layer]
        assert state == "enforced" or (expected is None and layer in sandbox.ROOT_ONLY), report
    assert report["complete"] is True
    text = run_doctor()
    assert text.returncode == 0 and "Every layer is enforced." in text.stdout
    assert all(f"ok  {layer}" in text.stdout for layer in sandbox.LAYERS if ROOT)


def test_doctor_names_a_missing_layer() -> None:
    out = run_doctor(env={sandbox.SKIP_ENV: "landlock"})
    assert out.returncode == 0, out.stderr
    assert "NO  landlock" in out.stdout and "--insecure-python" in out.stdout
    report = json.loads(run_doctor("--json", env={sandbox.SKIP_ENV: "landlock"}).stdout)
    assert report["complete"] is False and report["python_sandbox"]["landlock"].startswith("missing")


PRINTS = """\
from edgefn import Response

def handle(request, env):
    print("pr1nt", request.query_string)
    return Response("ok")
"""


def test_a_print_without_flush_reaches_the_log(pop: Running, tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """A pipe is block-buffered: print() lines waited in the guest's buffer for
    8 KiB (or for ever), so an author saw none of them."""
    pop.deploy(python_function(tmp_path, "prints", PRINTS))
    with caplog.at_level("INFO", logger="edgefn.functions"):
        assert pop.get("/prints?q=1")[0] == 200
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and "pr1nt q=1" not in caplog.text:
            time.sleep(0.02)
    assert any(r.getMessage().endswith(": host output: pr1nt q=1") for r in caplog.records), \
        caplog.text


def test_a_print_is_logged_at_info_and_stderr_at_warning(pop: Running, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    """Every print() of a function was a WARNING of the PoP's log (its stdout and
    stderr were one pipe); what a host or a function writes to stderr stays one."""
    pop.deploy(python_function(tmp_path, "levels", PRINTS.replace(
        'print("pr1nt", request.query_string)',
        'print("pr1nt", request.query_string)\n    import sys\n'
        '    print("warn1ng", file=sys.stderr)')))
    with caplog.at_level("INFO", logger="edgefn.functions"):
        assert pop.get("/levels?q=2")[0] == 200
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not (
                "pr1nt q=2" in caplog.text and "warn1ng" in caplog.text):
            time.sleep(0.02)
    levels = {r.getMessage().split(": host output: ")[-1]: r.levelname
              for r in caplog.records if ": host output: " in r.getMessage()}
    assert levels == {"pr1nt q=2": "INFO", "warn1ng": "WARNING"}, caplog.text


def test_its_stdout_and_stderr_are_a_pipe_into_the_log_not_the_pops(
        pop: Running, capfd: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    """A host had the PoP's fds 1 and 2: a function forged lines of the PoP's log and
    truncated the file it was redirected to."""
    capfd.readouterr()
    with caplog.at_level("INFO", logger="edgefn.functions"):  # stdout: INFO, stderr: WARNING
        result = attack(pop, "pop_output", "m4rk")
        assert result["ok"] and result["result"].startswith("ftruncate refused")  # a pipe
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and caplog.text.count("m4rk") < 2:
            time.sleep(0.02)
    lines = [r.getMessage() for r in caplog.records if "m4rk" in r.getMessage()]
    assert len(lines) == 2 and all(m.startswith("hostile@") and ": host output: " in m
                                   for m in lines), lines
    assert any("\\x1b[2Jansi m4rk" in m for m in lines), lines  # escapes shown, not run
    out = capfd.readouterr()
    assert not any(line.startswith(("2099-01-01", "\x1b[2J"))
                   for line in (out.out + out.err).splitlines())

