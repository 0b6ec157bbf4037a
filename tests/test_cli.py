"""The `edgefn` command line against a real PoP process: serve, dev, deploy, ls,
versions, rollback, delete, and graceful shutdown on SIGTERM."""

from __future__ import annotations

import collections
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from runtime.cli.dev import GONE_SECONDS
from tests.support import (
    EXAMPLES,
    function_dir,
    host_pids,
    listening,
    python_function,
    reactor,
    wait_for,
)

EDGEFN = [sys.executable, "-m", "runtime.cli"]
ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, data: Path | None, check: bool = True,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`edgefn ARGS --data DATA` (no --data when DATA is None), with `env` added."""
    given = ["--data", str(data)] if data is not None else []
    r = subprocess.run([*EDGEFN, *args, *given], capture_output=True, text=True,
                       timeout=60, cwd=ROOT, env={**os.environ, **(env or {})})
    if check:
        assert r.returncode == 0, r.stderr
    return r


@contextmanager
def pop_process(data: Path | None, *extra: str, command: str = "serve", cwd: Path = ROOT,
                env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen[str], int, list[str]]]:
    given = ["--data", str(data)] if data is not None else []
    proc = subprocess.Popen([*EDGEFN, command, *extra, "--port", "0", *given],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                            env={**os.environ, **(env or {})})
    lines: list[str] = []
    assert proc.stdout is not None
    port = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if m := re.search(r"listening on http://127\.0\.0\.1:(\d+)", line):
            port = int(m.group(1))
        if line.startswith("serving "):
            break
    assert port, "".join(lines)
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        yield proc, port, lines
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
        reader.join(5)
        proc.stdout.close()


def get(port: int, path: str) -> tuple[int, bytes, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read(), dict(r.getheaders())
    finally:
        conn.close()


def test_deploy_ls_versions_rollback_delete(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with pop_process(data) as (_, port, _):
        out = json.loads(cli("deploy", str(EXAMPLES / "hello-wat"), "--json", data=data).stdout)
        assert out["name"] == "hello" and out["routes"] == [{"path": "/hello"}]
        assert get(port, "/hello")[0] == 200
        text = cli("deploy", str(EXAMPLES / "echo"), data=data).stdout
        assert text.startswith("deployed echo version ") and "routes: /echo" in text
        listing = json.loads(cli("ls", "--json", data=data).stdout)
        assert [f["name"] for f in listing] == ["echo", "hello"]
        assert "hello" in cli("ls", data=data).stdout

        d = function_dir(tmp_path, "hello", reactor(""), routes=["/hello"])
        v2 = json.loads(cli("deploy", str(d), "--json", data=data).stdout)["version"]
        assert get(port, "/hello")[1] == b"ok"
        versions = json.loads(cli("versions", "hello", "--json", data=data).stdout)
        assert versions["current"] == v2 and len(versions["versions"]) == 2
        assert cli("versions", "hello", data=data).stdout.startswith(f"* {v2}")
        assert "now serves version " + out["version"] in cli("rollback", "hello", data=data).stdout
        assert get(port, "/hello")[1] == b"Hello from edgefn (WASM)!\n"
        assert cli("delete", "hello", data=data).stdout == "deleted hello\n"
        assert get(port, "/hello")[0] == 404

        bad = cli("deploy", str(tmp_path / "missing"), data=data, check=False)
        assert bad.returncode == 1 and "not a directory" in bad.stderr
        bad = cli("rollback", "nope", data=data, check=False)
        assert bad.returncode == 1 and "no function named 'nope'" in bad.stderr
        both = cli("rollback", "echo", "74ee", "--to", "e39c", data=data, check=False)
        assert both.returncode == 2 and "give VERSION (74ee) or --to (e39c), not both" in \
            both.stderr  # --to was ignored


def test_versions_marks_a_recorded_version_that_does_not_serve(tmp_path: Path) -> None:
    """It was marked * (serving) while the PoP answered 404: its files were changed
    after the deploy, so the restarted PoP refused to load it."""
    data = tmp_path / "data"
    d = function_dir(tmp_path, "tampered", reactor(""))
    with pop_process(data):
        version = json.loads(cli("deploy", str(d), "--json", data=data).stdout)["version"]
        assert cli("versions", "tampered", data=data).stdout.startswith(f"* {version}")
    stored = data / "versions" / "tampered" / version / "main.wat"
    stored.write_text(stored.read_text().replace("ok", "no"))
    with pop_process(data):
        out = cli("versions", "tampered", data=data).stdout
        assert out.startswith(f"! {version}") and "not serving: see the PoP's log" in out


def test_cli_without_a_running_pop_says_so(tmp_path: Path) -> None:
    r = cli("ls", data=tmp_path / "empty", check=False)
    assert r.returncode == 1 and "no PoP is running" in r.stderr


SLEEP_WASI = """(module
  (import "wasi_snapshot_preview1" "poll_oneoff"
    (func $poll (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write"
    (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 256) "Content-Type: text/plain\\n\\nslept")
  (func (export "_start")
    ;; one clock subscription: relative timeout of 400 ms on CLOCK_MONOTONIC
    (i32.store8 (i32.const 8) (i32.const 0))
    (i32.store (i32.const 16) (i32.const 1))
    (i64.store (i32.const 24) (i64.const 400000000))
    (drop (call $poll (i32.const 0) (i32.const 64) (i32.const 1) (i32.const 128)))
    (i32.store (i32.const 192) (i32.const 256))
    (i32.store (i32.const 196) (i32.const 31))
    (drop (call $write (i32.const 1) (i32.const 192) (i32.const 1) (i32.const 200)))))
"""


def test_sigterm_finishes_in_flight_requests_then_exits(tmp_path: Path) -> None:
    data = tmp_path / "data"
    d = function_dir(tmp_path, "sleepy", SLEEP_WASI, limits="wall_ms = 5000")
    with pop_process(data) as (proc, port, _):
        cli("deploy", str(d), data=data)
        result: dict[str, object] = {}

        def slow() -> None:
            result["response"] = get(port, "/sleepy")

        t = threading.Thread(target=slow)
        t.start()
        time.sleep(0.15)
        proc.send_signal(signal.SIGTERM)
        t.join(10)
        assert proc.wait(15) == 0
        status, body, _ = result["response"]  # type: ignore[misc]
        assert (status, body) == (200, b"slept")
        assert not (data / "pop.json").exists()


def test_dev_deploys_a_tree_and_redeploys_on_change(tmp_path: Path) -> None:
    tree = tmp_path / "fns"
    shutil.copytree(EXAMPLES / "hello-wat", tree / "hello")
    bad = tree / "broken"
    bad.mkdir()
    (bad / "edgefn.toml").write_text('name = "broken"\n')
    with pop_process(tmp_path / "data", str(tree), command="dev") as (_, port, lines):
        text = "".join(lines)
        assert "deployed  hello" in text and "field `runtime`" in text  # bad one reported
        assert get(port, "/hello")[1] == b"Hello from edgefn (WASM)!\n"
        wat = tree / "hello" / "hello.wat"
        wat.write_text(wat.read_text().replace("Hello from edgefn (WASM)!", "Hello, live reload (WASM)"))  # same length
        deadline = time.monotonic() + 10
        while get(port, "/hello")[1] != b"Hello, live reload (WASM)\n" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert get(port, "/hello")[1] == b"Hello, live reload (WASM)\n"
        assert any("redeploying" in line for line in lines)

        def until(done: Callable[[], bool]) -> None:
            deadline = time.monotonic() + 10 + GONE_SECONDS
            while not done() and time.monotonic() < deadline:
                time.sleep(0.1)

        # a renamed function takes its routes over (it was refused: "already served")
        toml = tree / "hello" / "edgefn.toml"
        toml.write_text(toml.read_text().replace('name = "hello"', 'name = "hi"'))
        until(lambda: get(port, "/hello")[2].get("x-edgefn-function", "").startswith("hi@"))
        assert get(port, "/hello")[2]["x-edgefn-function"].startswith("hi@")
        assert "removed   hello" in "".join(lines)
        # a second folder declaring that name is refused, not deployed over the first
        twin = tree / "twin"
        shutil.copytree(tree / "hello", twin)
        (twin / "edgefn.toml").write_text((twin / "edgefn.toml").read_text().replace(
            '"/hello"', '"/twin"'))
        until(lambda: "declares name 'hi', which" in "".join(lines))
        assert "declares name 'hi', which" in "".join(lines)
        assert get(port, "/hello")[0] == 200 and get(port, "/twin")[0] == 404
        # the serving folder goes: the refused one serves the name now
        shutil.rmtree(tree / "hello")
        until(lambda: get(port, "/twin")[0] == 200)
        assert get(port, "/hello")[0] == 404 and get(port, "/twin")[0] == 200
        assert "removed   hi" in "".join(lines)
        # a folder that goes takes its function with it
        shutil.rmtree(twin)
        until(lambda: get(port, "/twin")[0] == 404)
        assert get(port, "/twin")[0] == 404


def wait_for_text(lines: list[str], text: str, count: int = 1) -> None:
    """Wait until `text` was printed `count` times (a dev session's log)."""
    deadline = time.monotonic() + 20 + GONE_SECONDS
    while "".join(lines).count(text) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "".join(lines).count(text) >= count, "".join(lines)


def test_dev_keeps_a_function_holding_versions_it_did_not_deploy(tmp_path: Path) -> None:
    """A watched folder with the files of a function `edgefn deploy` made ("unchanged")
    took it over, and deleted it, every version, when it went; so did one deploying a
    third version over two deployed by the CLI."""
    data, tree = tmp_path / "data", tmp_path / "fns"
    tree.mkdir()
    api = function_dir(tmp_path / "elsewhere", "api", reactor(""))
    with pop_process(data, str(tree), "--no-ai", command="dev") as (_, port, lines):
        cli("deploy", str(api), data=data)
        shutil.copytree(api, tree / "scratch")
        wait_for_text(lines, "unchanged api")
        shutil.rmtree(tree / "scratch")
        wait_for_text(lines, "kept      api")
        assert "(fns/scratch is gone; it holds versions this dev session did not deploy: " \
               "`edgefn delete api` removes it)" in "".join(lines).replace(str(tmp_path) + "/", "")
        assert get(port, "/api")[0] == 200 and (data / "versions" / "api").is_dir()

        (api / "edgefn.toml").write_text((api / "edgefn.toml").read_text() + "# v2\n")
        cli("deploy", str(api), data=data)
        shutil.copytree(api, tree / "new")
        (tree / "new" / "edgefn.toml").write_text(
            (api / "edgefn.toml").read_text() + "# v3\n")
        wait_for_text(lines, "deployed  api")
        shutil.rmtree(tree / "new")
        wait_for_text(lines, "kept      api", 2)
        versions = json.loads(cli("versions", "api", "--json", data=data).stdout)
        assert len(versions["versions"]) == 3 and get(port, "/api")[0] == 200
        assert "removed" not in "".join(lines)


def test_dev_keeps_the_history_of_a_folder_gone_for_a_moment(tmp_path: Path) -> None:
    """edgefn.toml moved away for 2 s: the function was removed with its versions,
    and its folder, back, deployed one version afresh."""
    data, tree = tmp_path / "data", tmp_path / "fns"
    own = function_dir(tree, "own", reactor(""))
    with pop_process(data, str(tree), "--no-ai", command="dev") as (_, port, lines):
        wait_for_text(lines, "deployed  own")
        toml = own / "edgefn.toml"
        toml.write_text(toml.read_text() + "# v2\n")
        wait_for_text(lines, "deployed  own", 2)
        toml.rename(tmp_path / "edgefn.toml")
        time.sleep(2)
        (tmp_path / "edgefn.toml").rename(toml)
        time.sleep(GONE_SECONDS + 1)
        assert "removed" not in "".join(lines), "".join(lines)
        versions = json.loads(cli("versions", "own", "--json", data=data).stdout)
        assert len(versions["versions"]) == 2 and get(port, "/own")[0] == 200
        # gone for good: a function this session deployed every version of goes with it
        shutil.rmtree(own)
        wait_for_text(lines, "removed   own")
        assert get(port, "/own")[0] == 404 and not (data / "versions" / "own").exists()


def test_dev_with_two_workers_deploys_and_redeploys_to_both(tmp_path: Path) -> None:
    tree = tmp_path / "fns"
    shutil.copytree(EXAMPLES / "hello-wat", tree / "hello")
    (tmp_path / "pop.toml").write_text("workers = 2\nworker_header = true\n")
    with pop_process(tmp_path / "data", str(tree), "--config", str(tmp_path / "pop.toml"),
                     "--no-ai", command="dev") as (_, port, lines):
        assert "(2 workers, SO_REUSEPORT)" in "".join(lines)
        assert "deployed  hello" in "".join(lines)

        def bodies() -> dict[str, set[bytes]]:
            seen: dict[str, set[bytes]] = {}
            for _ in range(60):  # fresh connections: the kernel spreads them
                _, body, headers = get(port, "/hello")
                seen.setdefault(headers["x-edgefn-worker"], set()).add(body)
            return seen

        old = b"Hello from edgefn (WASM)!\n"
        assert list(bodies().values()) == [{old}, {old}]
        wat = tree / "hello" / "hello.wat"
        wat.write_text(wat.read_text().replace("Hello from edgefn (WASM)!",
                                               "Hello, live reload (WASM)"))
        deadline = time.monotonic() + 30
        while "".join(lines).count("deployed  hello") < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert any("redeploying" in line for line in lines)
        # the redeploy is printed once both workers switched: neither serves the old text
        new = b"Hello, live reload (WASM)\n"
        assert list(bodies().values()) == [{new}, {new}]


@pytest.mark.parametrize("workers", [1, 2])
def test_dev_renames_a_function_without_a_moment_unrouted(tmp_path: Path, workers: int) -> None:
    """The old name was removed before the new one deployed: its routes answered 404
    while that loaded (43 of 35,000 requests in a QA run), and, when the rename came
    with code that did not load, until it was fixed. (Two workers: the other one
    follows the records, and switched the gone function off first too.)"""
    tree = tmp_path / "fns"
    d = function_dir(tree, "one", reactor(""), routes=["/r"])
    (tmp_path / "pop.toml").write_text(f"workers = {workers}\n")
    with pop_process(tmp_path / "data", str(tree), "--config", str(tmp_path / "pop.toml"),
                     "--no-ai", command="dev") as (_, port, lines):
        wait_for_text(lines, "deployed  one")
        statuses: list[int] = []
        stop = threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                statuses.append(get(port, "/r")[0])

        load = threading.Thread(target=hammer)
        load.start()
        try:
            toml = d / "edgefn.toml"
            toml.write_text(toml.read_text().replace('name = "one"', 'name = "two"'))
            wait_for_text(lines, "removed   one")
            (d / "main.wat").write_text("(module (bad")  # renamed again, and broken
            toml.write_text(toml.read_text().replace('name = "two"', 'name = "three"'))
            wait_for_text(lines, "not a valid WebAssembly module")
            time.sleep(0.5)
            assert get(port, "/r")[2]["x-edgefn-function"].startswith("two@")
            (d / "main.wat").write_text(reactor(""))
            wait_for_text(lines, "removed   two")
        finally:
            stop.set()
            load.join()
        assert get(port, "/r")[2]["x-edgefn-function"].startswith("three@")
    assert len(statuses) > 50 and set(statuses) == {200}, collections.Counter(statuses)


def test_edgefn_data_applies_under_a_config_file_that_sets_no_data(tmp_path: Path) -> None:
    """With --config, $EDGEFN_DATA was ignored: the PoP used ./.edgefn, and the client
    commands (which read $EDGEFN_DATA) found no PoP. --data > the file's `data` >
    $EDGEFN_DATA > ./.edgefn."""
    env = {"EDGEFN_DATA": str(tmp_path / "x"), "PYTHONPATH": str(ROOT)}  # run from tmp_path
    bare, own = tmp_path / "cfg" / "pop.toml", tmp_path / "cfg" / "own.toml"
    bare.parent.mkdir()
    bare.write_text('name = "bare"\n')
    own.write_text('data = "d"\n')
    with pop_process(None, "--config", str(bare), "--no-ai", cwd=tmp_path, env=env) as \
            (_, port, lines):
        assert f"(token in {tmp_path / 'x' / 'admin.token'})" in "".join(lines)
        cli("deploy", str(EXAMPLES / "hello-wat"), data=None, env=env)
        assert get(port, "/hello")[0] == 200
    assert not (tmp_path / ".edgefn").exists()
    cli("keys", "create", "--tenant", "t", "--scopes", "*", "--rpm", "7", data=None, env=env)
    shown = json.loads(cli("limits", "show", "--config", str(bare), "--json", data=None,
                           env=env).stdout)
    assert [k["rpm"] for k in shown["keys"]] == [7]  # the keys in $EDGEFN_DATA
    with pop_process(None, "--config", str(own), "--no-ai", cwd=tmp_path, env=env) as \
            (_, _, lines):
        assert f"(token in {tmp_path / 'cfg' / 'd' / 'admin.token'})" in "".join(lines)
    (tmp_path / "file").write_text("")  # an unusable one is named as what set it
    r = cli("serve", "--config", str(bare), "--no-ai", "--port", "0", data=None, check=False,
            env={**env, "EDGEFN_DATA": str(tmp_path / "file")})
    assert r.stderr == f"edgefn: $EDGEFN_DATA: {tmp_path / 'file'} is not a directory\n"


def test_module_entry_point_runs_help() -> None:
    r = subprocess.run([*EDGEFN, "--help"], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ})
    assert r.returncode == 0 and "deploy" in r.stdout and "rollback" in r.stdout


def test_in_flight_request_finishes_on_the_old_version_during_a_deploy(tmp_path: Path) -> None:
    data = tmp_path / "data"
    d = function_dir(tmp_path, "sleepy", SLEEP_WASI, limits="wall_ms = 5000")
    with pop_process(data) as (_, port, _):
        v1 = json.loads(cli("deploy", str(d), "--json", data=data).stdout)["version"]
        result: dict[str, object] = {}
        t = threading.Thread(target=lambda: result.setdefault("r", get(port, "/sleepy")))
        t.start()
        time.sleep(0.1)
        with open(d / "edgefn.toml", "a") as f:
            f.write('\n[env]\nV = "2"\n')
        v2 = json.loads(cli("deploy", str(d), "--json", data=data).stdout)["version"]
        assert get(port, "/sleepy")[2]["x-edgefn-function"] == f"sleepy@{v2}"
        t.join(10)
        status, body, headers = result["r"]  # type: ignore[misc]
        assert (status, body, headers["x-edgefn-function"]) == (200, b"slept", f"sleepy@{v1}")


def test_a_stop_during_a_deploy_undoes_it_and_exits_at_once(tmp_path: Path) -> None:
    """SIGINT while a deploy's isolate started (its import never ends): the PoP held
    its exit for the 30 s start timeout, then undid the deploy after its stores had
    closed (a StoreClosed traceback)."""
    data = tmp_path / "data"
    d = python_function(tmp_path, "hang", "while True:\n    pass\n")
    with pop_process(data, "--no-ai") as (proc, _, lines):
        deploy = subprocess.Popen([*EDGEFN, "deploy", str(d), "--data", str(data)], cwd=ROOT,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not host_pids("hang", proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host_pids("hang", proc.pid), "".join(lines)
        time.sleep(0.5)  # its import is running
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(40)
        took = time.monotonic() - started
        deploy.wait(10)
    out = "".join(lines)
    assert took < 6, (took, out)
    assert "Traceback" not in out and "StoreClosed" not in out, out
    assert not host_pids("hang", proc.pid)
    assert not (data / "versions" / "hang").exists() or not any((data / "versions" / "hang")
                                                                .iterdir())


@pytest.mark.parametrize("sig, ignored_at_start", [(signal.SIGTERM, False),
                                                   (signal.SIGINT, True)])
def test_a_signal_while_dev_deploys_stops_it_at_once(tmp_path: Path, sig: signal.Signals,
                                                     ignored_at_start: bool) -> None:
    """`edgefn dev` signalled while it deploys its folders (a function whose import
    takes 20 s holds the deploy): SIGTERM killed it outright (status -15, the deploy
    left as it was), and SIGINT was lost where the shell started it with SIGINT
    ignored (a background job: Python then installs no handler). Now either stops it
    at once, undoes the deploy and reports 128 + the signal's number."""
    data, tree = tmp_path / "data", tmp_path / "fns"
    shutil.copytree(EXAMPLES / "hello-wat", tree / "a-hello")
    python_function(tree, "slow", "import time\ntime.sleep(20)\n\ndef handle(request, env):\n"
                                  "    return 'never'\n")
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored_at_start else None
    proc = subprocess.Popen([*EDGEFN, "dev", str(tree), "--no-ai", "--port", "0", "--data",
                             str(data)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=ROOT, preexec_fn=ignore)
    try:
        deadline = time.monotonic() + 30
        while not host_pids("slow", proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host_pids("slow", proc.pid), "the slow function's deploy did not start"
        time.sleep(0.3)  # its import is running
        started = time.monotonic()
        proc.send_signal(sig)
        status = proc.wait(30)
        took = time.monotonic() - started
        out = proc.stdout.read() if proc.stdout else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout:
            proc.stdout.close()
    assert status == 128 + sig, (status, out)
    assert took < 6, (took, out)  # as the deploy-by-admin test; it was never (30 s)
    assert "deployed  hello" in out and "deployed  slow" not in out, out
    assert f"edgefn: {sig.name} while starting; what had started is stopped" in out, out
    assert "Traceback" not in out, out
    assert not host_pids("slow", proc.pid)
    assert not (data / "pop.json").exists()
    assert not (data / "versions" / "slow").exists() or not any((data / "versions" / "slow")
                                                                .iterdir())


class SlowDev:
    """`edgefn dev` on a tree whose first function's import takes `sleep` seconds,
    holding the first deploy, and the example hello-wat deployed after it."""

    def __init__(self, tmp_path: Path, workers: int, sleep: float) -> None:
        data, tree = tmp_path / "data", tmp_path / "fns"
        python_function(tree, "a-slow", "import time\nfrom edgefn import Response\n"
                                        f"time.sleep({sleep})\n\ndef handle(request, env):\n"
                                        "    return Response('slow')\n")
        shutil.copytree(EXAMPLES / "hello-wat", tree / "z-hello")  # deployed after it
        (tmp_path / "pop.toml").write_text(f"workers = {workers}\nworker_header = true\n")
        self.proc = subprocess.Popen(
            [*EDGEFN, "dev", str(tree), "--no-ai", "--port", "0", "--data", str(data),
             "--config", str(tmp_path / "pop.toml")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        self.lines: list[str] = []
        try:
            self.read_to("dev mode: deploying")
            self.port, self.admin_port = (
                next(int(m.group(1)) for line in self.lines if (m := re.search(pattern, line)))
                for pattern in (r"listening on http://127\.0\.0\.1:(\d+)",
                                r"admin API on 127\.0\.0\.1:(\d+)"))
        except BaseException:
            self.stop()
            raise

    def read_to(self, start: str) -> None:
        """Dev's output up to its next line that starts with `start`."""
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            assert line, "".join(self.lines)
            self.lines.append(line)
            if line.startswith(start):
                return

    def assert_starting(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        """The answer is dev's 503 ``starting``."""
        assert status == 503, (status, body, "".join(self.lines))
        assert json.loads(body)["error"]["kind"] == "starting", body
        assert b"edgefn dev is deploying the functions under" in body, body
        assert headers["retry-after"] == "1" and headers["x-edgefn-error"] == "starting"

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(20)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_dev_answers_503_starting_not_404_while_it_deploys_its_folders(tmp_path: Path,
                                                                        workers: int) -> None:
    """`edgefn dev` listens before it has deployed its folders (a function whose import
    takes 1.5 s holds the first deploy here): a request for a route not deployed yet
    got the 404 ``no_route``, as if nothing would serve it. Now it gets 503
    ``starting`` with ``Retry-After: 1`` until the folders are deployed, from every
    worker; then the function answers, and a path nothing serves is a 404 again."""
    dev = SlowDev(tmp_path, workers, 1.5)
    try:
        seen, refusing = [], set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status, body, headers = get(dev.port, "/hello")  # a fresh connection each
            seen.append(status)
            if status == 200:
                break
            dev.assert_starting(status, body, headers)
            refusing.add(headers["x-edgefn-worker"])
            time.sleep(0.1)
        assert seen[0] == 503 and seen[-1] == 200, seen
        assert len(refusing) == workers, (refusing, seen)  # every worker said so
        # the last function answers once its deploy switched, a moment before dev clears
        # the 503 (on every worker) and says "serving": a path nothing serves is a 404
        # from then on
        dev.read_to("serving ")
        status, body, _ = get(dev.port, "/nothing-here")
        assert status == 404 and json.loads(body)["error"]["kind"] == "no_route", body
        assert get(dev.port, "/a-slow")[:2] == (200, b"slow")
    finally:
        dev.stop()


def test_a_worker_started_again_while_dev_deploys_answers_503_starting(tmp_path: Path) -> None:
    """A worker killed while `edgefn dev` deploys its folders is started again by its
    parent; it answered 404 ``no_route`` for the functions not deployed yet (the 503
    was only told to the workers running then). It reads the 503 from the data dir
    now. The first function's import takes 5 s: the worker is back well before the
    function after it is deployed."""
    dev = SlowDev(tmp_path, 2, 5)
    try:
        pids: set[str] = set()
        wait_for(lambda: pids.add(get(dev.port, "/hello")[2]["x-edgefn-worker"]) or
                 len(pids) == 2, 20, "both workers answering")
        (follower,) = [int(p) for p in pids if dev.admin_port not in listening(int(p))]
        os.kill(follower, signal.SIGKILL)
        answers: list[tuple[int, bytes, dict[str, str]]] = []
        wait_for(lambda: (answers.append(get(dev.port, "/hello")) or
                          answers[-1][2]["x-edgefn-worker"] not in pids), 30,
                 "the killed worker started again and answering")
        dev.assert_starting(*answers[-1])
        dev.read_to("serving ")
        seen = {get(dev.port, "/hello")[:2] for _ in range(20)}
        assert seen == {(200, b"Hello from edgefn (WASM)!\n")}, seen  # then every worker serves it
    finally:
        dev.stop()
