"""Failures of the `edgefn` command in a real subprocess: one line on stderr and a
non-zero exit, never a traceback; a JSON object on stderr with --json; quiet when
the reader of stdout goes away."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from edgefn_core.errors import Failure
from runtime.cli import dev, parser
from tests.cli import EDGEFN, ROOT, edgefn, one_line_error
from tests.support import EXAMPLES, Running, function_dir, reactor


def test_a_busy_port_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        # the model worker is on by default: the port is checked before it starts
        r = edgefn("serve", "--port", port, "--data", str(tmp_path))
        line = one_line_error(r)
        assert r.returncode == 1 and "address already in use" in line and port in line
        assert "choose another --port," in line
        r = edgefn("serve", "--port", "0", "--admin-port", port, "--no-ai", "--data",
                   str(tmp_path))  # the hint named --port for a busy admin port
        assert "choose another --admin-port," in one_line_error(r)
    r = edgefn("serve", "--host", "192.0.2.1", "--port", "8", "--no-ai", "--data", str(tmp_path))
    assert one_line_error(r).endswith("cannot assign requested address (no interface of this "
                                      "machine has that address: check --host)")


def test_a_port_taken_after_the_check_is_reported_the_same_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev, "check_listen", lambda host, port, flag: None)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        args = parser.build().parse_args(["serve", "--no-ai", "--port", port,
                                          "--data", str(tmp_path)])
        with pytest.raises(Failure) as e:
            dev.serve_command(args)
    assert e.value.code == "cannot_listen" and f"{port}): address already in use" in str(e.value)


def test_a_config_error_found_while_the_pop_starts_names_the_config_file(
        tmp_path: Path) -> None:
    """The stages that find it call the PoP config "pop.toml" whatever its name."""
    config = tmp_path / "edge-eu.toml"
    config.write_text('data = "d"\n[metrics]\ntoken_file = "missing.token"\n')
    r = edgefn("serve", "--config", str(config), "--no-ai", "--port", "0")
    line = one_line_error(r)
    assert r.returncode == 1 and line.startswith(f"edgefn: {config}: field "
                                                 "`metrics.token_file`: cannot read "), line


@pytest.mark.parametrize(("entry", "field", "message"), [
    ('threads = "two"', "models[0].threads", "expected `int`, got `str`"),
    ('path = "/nonexistent.gguf"', "models[0].path", "model file /nonexistent.gguf does not "
                                                     "exist"),
])
def test_a_bad_worker_config_stops_serve_before_the_worker_starts(
        tmp_path: Path, entry: str, field: str, message: str) -> None:
    """It printed the worker's pid and served while the worker, exiting on the same
    error, was restarted forever."""
    worker = tmp_path / "bad.toml"
    worker.write_text(f'[[models]]\nname = "m"\nengine = "llamacpp"\n{entry}\n')
    r = edgefn("serve", "--ai-config", str(worker), "--port", "0", "--data",
               str(tmp_path / "data"), timeout=30)
    assert r.returncode == 1 and r.stdout == ""
    assert one_line_error(r) == f"edgefn: {worker}: field `{field}`: {message}"


def test_an_unusable_data_dir_is_one_line(tmp_path: Path) -> None:
    """A --data that is a file, or under /proc, was a traceback; an empty one made the
    current directory the data dir."""
    (tmp_path / "file").write_text("")
    for args in (["keys", "ls", "--data", str(tmp_path / "file")],
                 ["kv", "put", "a", "b", "c", "--data", "/proc/edgefn"]):
        r = edgefn(*args)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        one_line_error(r)
    r = edgefn("kv", "put", "a", "b", "c", "--data", "")
    assert r.returncode == 2 and "--data: expected a folder" in r.stderr
    # serve on a data dir it cannot write (read-only, or under a file) was a traceback
    r = edgefn("serve", "--data", str(tmp_path / "file" / "sub"), "--no-ai", "--port", "0")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert one_line_error(r).endswith(f"data dir {tmp_path / 'file' / 'sub'} cannot be used: "
                                      "Not a directory")
    # a --data that is a file: that said, alike from every command (it was "File exists",
    # named as a field of a pop.toml nobody gave, "no such data dir", "kv: Not a directory")
    for args in (["serve", "--no-ai", "--port", "0"], ["dev", str(tmp_path), "--no-ai"],
                 ["kv", "get", "a", "b"], ["kv", "put", "a", "b", "c"]):
        r = edgefn(*args, "--data", str(tmp_path / "file"))
        assert one_line_error(r) == f"edgefn: --data: {tmp_path / 'file'} is not a directory", \
            args


def test_a_purge_of_a_topology_that_is_not_there_fails(tmp_path: Path) -> None:
    r = edgefn("cache", "purge", "--tag", "x", "--topology", str(tmp_path / "nonexist"))
    assert r.returncode == 1 and "no topology run here" in one_line_error(r)


def test_dev_on_a_missing_directory_is_one_line(tmp_path: Path) -> None:
    r = edgefn("dev", str(tmp_path / "nowhere"), "--no-ai", "--data", str(tmp_path))
    assert r.returncode == 1
    assert one_line_error(r) == (f"edgefn: {tmp_path / 'nowhere'}: no such directory "
                                 "(`edgefn dev DIR` deploys the function folders under DIR)")


@pytest.mark.parametrize(("args", "option"), [
    (["vectors", "upsert", "emb", "a", "--vector", "[1,"], "--vector"),
    (["vectors", "upsert", "emb", "a", "--vector", '["x"]'], "--vector"),
    (["vectors", "upsert", "emb", "a", "--vector", "[1]", "--metadata", "{"], "--metadata"),
    (["vectors", "query", "emb", "--vector", "[1]", "--filter", "lang=en"], "--filter"),
    (["kv", "put", "docs", "k", "v", "--metadata", "[1, 2]"], "--metadata"),
])
def test_bad_json_in_an_option_is_one_line(tmp_path: Path, args: list[str], option: str) -> None:
    r = edgefn(*args, "--data", str(tmp_path))
    line = one_line_error(r)
    assert r.returncode == 2 and f"argument {option}: expected a JSON" in line
    assert not any(tmp_path.iterdir())  # rejected before any store is opened


def test_a_usage_error_is_one_line() -> None:
    r = edgefn("rollback")
    assert r.returncode == 2
    assert one_line_error(r) == ("edgefn rollback: the following arguments are required: "
                                 "name (see `edgefn rollback --help`)")
    # an option the command does not take: its own --help (it pointed to `edgefn --help`)
    r = edgefn("kv", "get", "a", "b", "--bogus")
    assert r.returncode == 2 and one_line_error(r) == (
        "edgefn kv get: unrecognized arguments: --bogus (see `edgefn kv get --help`)")
    # a flag's bad value is named as the flag, not as a config field of "<defaults>"
    r = edgefn("serve", "--port", "99999", "--no-ai")
    assert r.returncode == 2 and one_line_error(r) == (
        "edgefn serve: argument --port: expected `int` <= 65535 (see `edgefn serve --help`)")


@pytest.mark.parametrize("command", ["versions", "rollback", "promote", "delete"])
def test_a_name_no_function_can_have_is_a_usage_error(tmp_path: Path, command: str) -> None:
    """`versions 'a/../b'` was sent, and answered with the HTTP front's message about
    a path's `..` segments."""
    r = edgefn(command, "a/../b", "--data", str(tmp_path))
    assert r.returncode == 2 and one_line_error(r) == (
        f"edgefn {command}: argument name: expected a function name (lower-case letters, "
        f"digits, _ and -, at most 63), got 'a/../b' (see `edgefn {command} --help`)")


def test_a_since_the_pop_would_refuse_is_a_usage_error_before_any_pop_is_asked(
        tmp_path: Path) -> None:
    """Exit 2 as for any bad option (it was 1, or "no PoP is running" without one;
    tests/rollout/test_cli.py checks --canary alike)."""
    r = edgefn("events", "--since", "bogus", "--data", str(tmp_path))
    assert r.returncode == 2 and one_line_error(r) == (
        "edgefn events: argument --since: expected seconds or a duration like 10m, 2h, 1d; "
        "got 'bogus' (see `edgefn events --help`)")


def json_error(r: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """The {"code", "message"} of a failed --json command (stdout left empty)."""
    assert r.returncode != 0 and r.stdout == "", r.stdout
    err: dict[str, str] = json.loads(r.stderr)["error"]
    assert set(err) == {"code", "message"}
    return err


def test_json_errors_are_json_on_stderr(tmp_path: Path) -> None:
    r = edgefn("ls", "--json", "--data", str(tmp_path / "none"))
    assert json_error(r)["code"] == "pop_not_running" and r.returncode == 1
    r = edgefn("kv", "get", "nowhere", "k", "--json", "--data", str(tmp_path))
    assert json_error(r) == {"code": "unknown_namespace",
                             "message": "unknown namespace 'nowhere'"}
    r = edgefn("vectors", "query", "emb", "--vector", "[1,", "--json")
    assert json_error(r)["code"] == "usage" and r.returncode == 2


def closed_early(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run `edgefn ARGS` with its stdout closed before it writes, as `| head -0` would."""
    proc = subprocess.Popen([*EDGEFN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    return subprocess.CompletedProcess(args, proc.wait(60), b"", err)


def test_a_closed_stdout_stops_quietly(tmp_path: Path) -> None:
    assert edgefn("kv", "put", "docs", "big", "-", "--data", str(tmp_path),
                  stdin=b"x" * 1_000_000).returncode == 0
    r = closed_early("kv", "get", "docs", "big", "--data", str(tmp_path))
    assert (r.returncode, r.stderr) == (141, b"")


def test_ls_json_into_a_closed_pipe_stops_quietly(pop: Running, tmp_path: Path) -> None:
    pop.deploy(EXAMPLES / "hello-wat")
    for i in range(5):
        pop.deploy(function_dir(tmp_path, f"fn{i}", reactor("")))
    r = closed_early("ls", "--json", "--data", str(pop.data))
    assert (r.returncode, r.stderr) == (141, b"")
    piped = subprocess.run(f"{' '.join(EDGEFN)} ls --json --data {pop.data} | head -1",
                           shell=True, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert (piped.stdout, piped.stderr) == ("[\n", "")


def _fake_pop(data: Path, port: int) -> int:
    """A data dir that says a PoP's admin API is at 127.0.0.1:`port`, held as a live
    PoP holds it (its pop.lock flocked); the lock's fd (the caller closes it)."""
    import fcntl

    data.mkdir(parents=True)
    (data / "pop.json").write_text(json.dumps({"pid": os.getpid(), "public": "127.0.0.1:1",
                                               "admin": f"127.0.0.1:{port}"}))
    (data / "admin.token").write_text("t")
    fd = os.open(data / "pop.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_a_connection_lost_mid_request_is_not_said_unreachable(tmp_path: Path) -> None:
    """A worker killed while it handled a deploy: the CLI said "cannot reach the
    PoP's admin API", of a deploy the PoP had made; now it says the connection was
    lost and that the change may have been made. A PoP that is not listening is
    still "cannot reach"."""
    import threading

    from runtime.admin.client import AdminClient

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def hang_up() -> None:  # reads the request, then closes without an answer
        conn, _ = server.accept()
        conn.recv(65536)
        conn.close()

    fd = _fake_pop(tmp_path / "data", port)
    try:
        threading.Thread(target=hang_up, daemon=True).start()
        with pytest.raises(Failure) as lost:
            AdminClient(tmp_path / "data", timeout=10).request("POST", "/v1/deploy", b"x")
        assert str(lost.value).startswith(f"the connection to the PoP's admin API at "
                                          f"127.0.0.1:{port} was lost during POST /v1/deploy (")
        assert str(lost.value).endswith("the PoP may have restarted; what was asked may have "
                                        "been done: check (`edgefn ls`, `edgefn versions`)")
        server.close()
        with pytest.raises(Failure, match=f"^cannot reach the PoP's admin API at 127.0.0.1:"
                                          f"{port}: "):
            AdminClient(tmp_path / "data", timeout=10).request("GET", "/v1/functions")
    finally:
        os.close(fd)
        server.close()
