"""End to end over loopback: a real PoP, the admin API, real wasmtime."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runtime.admin.client import AdminClient, AdminError
from tests.support import EXAMPLES, Running, function_dir, pop_thread, reactor


def deploy_examples(pop: Running) -> None:
    for name in ("hello-wat", "echo", "hello-c"):
        pop.deploy(EXAMPLES / name)


def test_examples_answer_over_http(pop: Running) -> None:
    deploy_examples(pop)
    status, headers, body = pop.get("/hello")
    assert (status, body) == (200, b"Hello from edgefn (WASM)!\n")
    assert headers["x-edgefn-function"].startswith("hello@")
    status, headers, body = pop.request("POST", "/echo/x?y=1", b"payload")
    assert (status, body, headers["x-echo-query"]) == (200, b"payload", "y=1")
    status, _, body = pop.get("/hello-c?name=Ada")
    assert body == b"Hello, Ada from C! method=GET path=/hello-c\n"
    assert pop.get("/nothing-here")[0] == 404


def test_hostile_guests_are_contained_while_another_function_keeps_serving(
        pop: Running, tmp_path: Path) -> None:
    pop.deploy(EXAMPLES / "echo")
    hostile = {
        "loop": (reactor("(loop $l (br $l))"), "cpu_ms = 20", 503, "cpu_limit"),
        "bomb": (reactor("(loop $g (br_if $g (i32.ne (memory.grow (i32.const 1)) (i32.const -1))))"
                         " unreachable"), "memory_mb = 4", 503, "memory_limit"),
        "recurse": (reactor("(call $r)", prelude="(func $r (call $r))"), "", 500, "trap"),
        "trap": (reactor("unreachable"), "", 500, "trap"),
        "huge": (reactor("(return (i64.const 0x00000010ffffffff))"), "", 502, "bad_response"),
    }
    for name, (src, limits, _, _) in hostile.items():
        pop.deploy(function_dir(tmp_path, name, src, limits=limits))

    errors: list[str] = []
    served = [0]
    stop = threading.Event()

    def bystander() -> None:
        while not stop.is_set():
            status, _, body = pop.request("POST", "/echo", b"still here")
            if (status, body) != (200, b"still here"):
                errors.append(f"{status} {body!r}")
            served[0] += 1

    t = threading.Thread(target=bystander)
    t.start()
    try:
        for _ in range(5):
            for name, (_, _, status, kind) in hostile.items():
                got, headers, body = pop.get(f"/{name}")
                assert (got, headers["x-edgefn-error"]) == (status, kind), body
                assert f"function '{name}'".encode() in body
    finally:
        stop.set()
        t.join()
    assert errors == [] and served[0] > 0


def test_invalid_deploys_are_rejected_and_the_old_version_keeps_serving(
        pop: Running, tmp_path: Path) -> None:
    good = function_dir(tmp_path, "svc", reactor(""), routes=["/svc"])
    v1 = pop.deploy(good)["version"]
    broken = {
        "bad-manifest": ('name = "svc"\nruntime = "wasm"\n', "invalid_manifest"),
        "bad-wasm": (None, "deploy_rejected"),
        "missing-export": (None, "deploy_rejected"),
    }
    (tmp_path / "bad-manifest").mkdir()
    (tmp_path / "bad-manifest" / "edgefn.toml").write_text(broken["bad-manifest"][0] or "")
    function_dir(tmp_path / "x", "svc", b"not wasm at all", entry="f.wasm", routes=["/svc"])
    function_dir(tmp_path / "y", "svc", '(module (memory (export "memory") 1))', routes=["/svc"])
    for d, kind in ((tmp_path / "bad-manifest", "invalid_manifest"),
                    (tmp_path / "x" / "svc", "deploy_rejected"),
                    (tmp_path / "y" / "svc", "deploy_rejected")):
        with pytest.raises(AdminError) as err:
            pop.deploy(d)
        assert (err.value.status, err.value.code) == (400, kind)
        status, headers, body = pop.get("/svc")
        assert (status, body, headers["x-edgefn-function"]) == (200, b"ok", f"svc@{v1}")
    assert "field `entry`" in str(_deploy_error(pop, tmp_path / "bad-manifest"))
    assert [v["version"] for v in pop.admin.request("GET", "/v1/functions/svc/versions")
            ["versions"]] == [v1]


def answering(body: str) -> str:
    """A reactor guest that answers 200 with `body` (ASCII, under 256 bytes)."""
    response = f"\\c8\\00\\00\\00\\00\\00\\00\\00\\{len(body):02x}\\00\\00\\00{body}"
    return reactor(f"(return (i64.or (i64.shl (i64.const 16) (i64.const 32)) "
                   f"(i64.const {12 + len(body)})))",
                   prelude=f'(data (i32.const 16) "{response}")')


def _deploy_error(pop: Running, d: Path) -> AdminError:
    with pytest.raises(AdminError) as err:
        pop.deploy(d)
    return err.value


def test_route_conflicts_are_rejected(pop: Running, tmp_path: Path) -> None:
    pop.deploy(function_dir(tmp_path, "a", reactor(""), routes=["/shared"]))
    listing = pop.admin.request("GET", "/v1/functions")
    err = _deploy_error(pop, function_dir(tmp_path, "b", reactor(""), routes=["/shared/"]))
    assert (err.status, err.code) == (409, "route_conflict")
    assert "already served by function 'a'" in str(err)
    assert pop.get("/shared")[1]["x-edgefn-function"].startswith("a@")
    assert pop.admin.request("GET", "/v1/functions") == listing  # the rejected one is not in it
    with pytest.raises(AdminError) as missing:
        pop.admin.request("GET", "/v1/functions/b/versions")
    assert missing.value.status == 404
    for name in ("b%00", "B", "a.b", "x" * 70):  # a NUL was a 500 (../ is the front's 400)
        for method, path in (("GET", f"/v1/functions/{name}/versions"),
                             ("POST", f"/v1/functions/{name}/rollback")):
            with pytest.raises(AdminError) as odd:
                pop.admin.request(method, path, b"{}" if method == "POST" else None)
            assert (odd.value.status, odd.value.code) == (404, "not_found"), (name, method)
    fixed = pop.deploy(function_dir(tmp_path / "fixed", "b", answering("b"), routes=["/b"]))
    status, headers, body = pop.get("/b")
    assert (status, headers["x-edgefn-function"], body) == (200, f"b@{fixed['version']}", b"b")
    # a redeploy of `a` onto b's route names b, not a (a's older entry came first)
    err = _deploy_error(pop, function_dir(tmp_path / "onto", "a", answering("a2"),
                                          routes=["/b"]))
    assert "already served by function 'b'" in str(err), str(err)
    assert pop.get("/shared")[2] == b"ok"
    assert [f["name"] for f in pop.admin.request("GET", "/v1/functions")["functions"]] == ["a", "b"]


def test_versions_rollback_and_delete(pop: Running, tmp_path: Path) -> None:
    d = function_dir(tmp_path, "ver", answering("one"))
    versions = [pop.deploy(d)["version"]]
    for body in ("two", "three"):
        (d / "main.wat").write_text(answering(body))
        deployed = pop.deploy(d)
        assert deployed["changed"] and deployed["version"] not in versions
        versions.append(deployed["version"])
        assert pop.get("/ver")[2] == body.encode()
    v1, v2, v3 = versions
    assert pop.deploy(d)["changed"] is False  # same content, same version

    def rollback(body: bytes = b"{}") -> str:
        version: str = pop.admin.request("POST", "/v1/functions/ver/rollback", body)["version"]
        status, headers, served = pop.get("/ver")
        assert status == 200 and headers["x-edgefn-function"] == f"ver@{version}"
        return f"{version}:{served.decode()}"

    assert rollback() == f"{v2}:two"  # the one before the current, not the oldest
    assert rollback() == f"{v1}:one"
    oldest = f"{v1} is the oldest version that served, none before it to roll back to .*" \
             "`edgefn rollback ver VERSION`"
    with pytest.raises(AdminError, match=oldest):
        rollback()
    assert rollback(f'{{"version": "{v3}"}}'.encode()) == f"{v3}:three"
    assert rollback() == f"{v1}:one"  # what served before v3 this time
    assert rollback(f'{{"version": "{v3}"}}'.encode()) == f"{v3}:three"
    assert rollback(f'{{"version": "{v1}"}}'.encode()) == f"{v1}:one"
    with pytest.raises(AdminError, match=oldest):  # v3 and v2 served before, but not before
        rollback()  # v1: the message said "nothing served before" as if they never had
    assert rollback(f'{{"version": "{v3}"}}'.encode()) == f"{v3}:three"
    with pytest.raises(AdminError) as err:
        rollback(b'{"version": "deadbeef"}')
    assert err.value.status == 404 and pop.get("/ver")[2] == b"three"
    record = pop.admin.request("GET", "/v1/functions/ver/versions")
    assert record["current"] == v3
    assert [v["version"] for v in record["versions"]] == [v1, v2, v3]
    assert [(e["version"], e["action"]) for e in record["history"]] == [
        (v1, "deploy"), (v2, "deploy"), (v3, "deploy"),
        (v2, "rollback"), (v1, "rollback"), (v3, "rollback"), (v1, "rollback"),
        (v3, "rollback"), (v1, "rollback"), (v3, "rollback")]
    # older files deployed again serve as their old version; a rollback then goes to
    # what served before them, not to a version created before theirs (there was none)
    (d / "main.wat").write_text(answering("one"))
    assert pop.deploy(d)["version"] == v1 and pop.get("/ver")[2] == b"one"
    assert rollback() == f"{v3}:three"
    pop.admin.request("DELETE", "/v1/functions/ver")
    assert pop.get("/ver")[0] == 404
    with pytest.raises(AdminError) as err:
        pop.admin.request("DELETE", "/v1/functions/ver")
    assert err.value.status == 404


# Run in a child process: deploy FIRST, then deploy SECOND and die by SIGKILL the moment
# its record is saved, printing what the router would serve at that instant.
CRASH_AT_SAVE = """
import os, signal, sys
from pathlib import Path
from edgefn_core.process import load_system_libstdcxx
load_system_libstdcxx()
from runtime.functions.deploys import DeployStore
from tests.support import pop_thread

data, first, second = (Path(arg) for arg in sys.argv[1:])
with pop_thread(data) as pop:
    print("first", pop.deploy(first)["version"], flush=True)
    save = DeployStore.save

    def save_then_crash(store, record):
        save(store, record)
        routed = pop.pop.registry.router.match(b"localhost", b"/svc")
        print("routed", routed[0].version if routed else None, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    DeployStore.save = save_then_crash
    pop.deploy(second)
"""


def test_a_crash_between_saving_a_deploy_and_serving_it_takes_back_nothing_served(
        tmp_path: Path) -> None:
    """The record is the commit point and is saved before routing switches: a crash
    between the two leaves the new version unseen, and the restarted PoP serves it."""
    data = tmp_path / "data"
    one = function_dir(tmp_path / "1", "svc", answering("one"))
    two = function_dir(tmp_path / "2", "svc", answering("two"))
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    child = subprocess.run([sys.executable, "-c", CRASH_AT_SAVE, data, one, two], cwd=root,
                           env=env, capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    lines = dict(line.split(" ", 1) for line in child.stdout.splitlines())
    v1 = lines["first"]
    assert lines["routed"] == v1  # v2 was saved but no request could have reached it yet
    with pop_thread(data) as restarted:
        status, headers, body = restarted.get("/svc")
        assert status == 200 and body == b"two"
        v2 = headers["x-edgefn-function"].removeprefix("svc@")
        record = restarted.admin.request("GET", "/v1/functions/svc/versions")
        assert v2 != v1 and record["current"] == v2


def test_a_deploy_or_rollback_whose_record_cannot_be_saved_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    with pop_thread(data) as pop:
        v1 = pop.deploy(function_dir(tmp_path / "1", "svc", answering("one")))["version"]
        v2 = pop.deploy(function_dir(tmp_path / "2", "svc", answering("two")))["version"]
        listing = pop.admin.request("GET", "/v1/functions")

        def disk_full(record: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(pop.pop.registry.store, "save", disk_full)
        with pytest.raises(AdminError) as err:
            pop.deploy(function_dir(tmp_path / "3", "svc", answering("three")))
        assert (err.value.status, err.value.code) == (500, "deploy_not_saved")
        assert "No space left on device" in str(err.value)
        with pytest.raises(AdminError) as err:
            pop.admin.request("POST", "/v1/functions/svc/rollback", b"{}")
        assert (err.value.status, err.value.code) == (500, "deploy_not_saved")
        status, headers, body = pop.get("/svc")
        assert (status, headers["x-edgefn-function"], body) == (200, f"svc@{v2}", b"two")
        assert pop.admin.request("GET", "/v1/functions") == listing
        assert sorted(os.listdir(data / "versions" / "svc")) == sorted(
            [v1, v2, f"{v1}.files", f"{v2}.files"])  # each version and its file hashes
        monkeypatch.undo()
    with pop_thread(data) as restarted:
        assert restarted.get("/svc")[2] == b"two"


def test_restarted_pop_serves_every_function_at_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with pop_thread(data) as first:
        deploy_examples(first)
        v = first.get("/hello")[1]["x-edgefn-function"]
    with pop_thread(data) as second:  # no deploys: restored from the data dir, warm
        status, headers, _ = second.get("/hello")
        assert status == 200 and headers["x-edgefn-function"] == v
        assert second.request("POST", "/echo", b"x")[2] == b"x"
        assert second.get("/hello-c")[0] == 200


def test_second_pop_on_the_same_data_dir_is_refused(pop: Running) -> None:
    from runtime.app import DataDirBusy

    with pytest.raises(DataDirBusy, match="in use by another PoP"), pop_thread(pop.data):
        pass


def test_admin_api_needs_the_token(pop: Running) -> None:
    client = AdminClient(pop.data)
    client.token = "wrong"
    with pytest.raises(AdminError) as err:
        client.request("GET", "/v1/functions")
    assert err.value.status == 401
    with pytest.raises(AdminError) as err:
        pop.admin.request("GET", "/v1/nope")
    assert err.value.status == 404


def test_oversized_and_malformed_requests_over_a_real_socket(pop: Running) -> None:
    pop.deploy(EXAMPLES / "echo")
    with socket.create_connection((pop.host, pop.port), timeout=5) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % (64 << 20))
        assert s.recv(100).startswith(b"HTTP/1.1 413")
    with socket.create_connection((pop.host, pop.port), timeout=5) as s:
        s.sendall(b"\x00\x01garbage\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    assert pop.request("POST", "/echo", b"fine")[2] == b"fine"


def test_first_request_after_deploy_is_served_warm(pop: Running, tmp_path: Path) -> None:
    result = pop.deploy(EXAMPLES / "hello-wat")
    assert result["took_ms"] < 5000
    status, headers, _ = pop.get("/hello")
    assert status == 200 and headers["x-edgefn-function"] == f"hello@{result['version']}"


def test_responses_carry_request_ids_and_each_request_is_logged(
        pop: Running, capfd: pytest.CaptureFixture[str]) -> None:
    deployed = pop.deploy(EXAMPLES / "hello-wat")
    status, headers, _ = pop.get("/hello", headers={"x-request-id": "trace-7"})
    assert status == 200 and headers["x-request-id"] == "trace-7"
    status, headers, _ = pop.get("/nowhere")
    assert status == 404 and headers["x-request-id"] != "trace-7"
    fn = f"{deployed['name']}@{deployed['version']}"
    wanted = [f"method=GET path=/hello status=200 fn={fn} ",
              "rid=trace-7 ", "method=GET path=/nowhere status=404 fn=- "]
    seen = ""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(w in seen for w in wanted):
        seen += capfd.readouterr().err  # the log is flushed once per loop iteration
        time.sleep(0.02)
    assert all(w in seen for w in wanted), seen


FORGER = """
from edgefn import Response

def handle(request, env):
    return Response("hi", headers={"x-edgefn-function": "victim@deadbeef",
                                   "x-edgefn-cache": "HIT", "x-edgefn-error": "trap",
                                   "x-request-id": "forged", "x-mine": "kept"})
"""


def test_a_function_cannot_set_the_pops_own_headers(pop: Running, tmp_path: Path) -> None:
    """`x-edgefn-function` and `x-edgefn-cache` are the PoP's: a function's own copy
    went out before the real one, so a client reading the first was misled."""
    import http.client

    from tests.support import python_function

    deployed = pop.deploy(python_function(tmp_path, "forger", FORGER))
    conn = http.client.HTTPConnection(pop.host, pop.port, timeout=30)
    try:
        conn.request("GET", "/forger")
        resp = conn.getresponse()
        resp.read()
        headers = [(k.lower(), v) for k, v in resp.getheaders()]
    finally:
        conn.close()
    assert [v for k, v in headers if k == "x-edgefn-function"] == [
        f"forger@{deployed['version']}"]
    assert [v for k, v in headers if k == "x-edgefn-cache"] == ["MISS"]  # the PoP's
    assert "x-edgefn-error" not in dict(headers)  # its event said error "trap" for a 200
    rids = [v for k, v in headers if k == "x-request-id"]
    assert len(rids) == 1 and rids != ["forged"]  # a client saw both
    assert ("x-mine", "kept") in headers
