"""Commands in a real subprocess: `rollback` with a version prefix against a real
PoP, `lora rm` against a stand-in admin API, `gpu-worker --help`, and the log
lines `serve`/`dev` show at each verbosity."""

from __future__ import annotations

import fcntl
import json
import logging
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from runtime.cli.logs import configure
from runtime.cli.main import main
from tests.cli import ROOT, edgefn, one_line_error
from tests.support import EXAMPLES, Running, function_dir, reactor


def test_rollback_takes_a_unique_version_prefix(pop: Running, tmp_path: Path) -> None:
    v1 = pop.deploy(EXAMPLES / "hello-wat")["version"]
    v2 = pop.deploy(function_dir(tmp_path, "hello", reactor(""), routes=["/hello"]))["version"]
    data = str(pop.data)
    r = edgefn("rollback", "hello", v1[:6], "--data", data)
    assert r.returncode == 0 and r.stdout == f"hello now serves version {v1}\n", r.stderr
    assert pop.get("/hello")[2] == b"Hello from edgefn (WASM)!\n"
    r = edgefn("rollback", "hello", v2[:5], "--json", "--data", data)
    assert json.loads(r.stdout)["version"] == v2
    unknown = "g" + v1[:3]  # versions are hex: nothing starts with "g"
    r = edgefn("rollback", "hello", unknown, "--data", data)
    assert one_line_error(r) == (f"edgefn: function 'hello' has no version {unknown!r} "
                                 "(see `edgefn versions hello`)")


class AdminStandIn(BaseHTTPRequestHandler):
    """Records each request; answers 404 for a model named `missing`, else 200 {}."""

    seen: list[tuple[str, str, str]] = []

    def do_DELETE(self) -> None:
        self.seen.append((self.command, self.path, self.headers["authorization"]))
        missing = self.path.endswith("/missing")
        body = {"error": {"kind": "not_found", "message": "no adapter 'missing'"}} if missing else {}
        data = json.dumps(body).encode()
        self.send_response(404 if missing else 200)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def admin_stand_in(data: Path) -> Iterator[list[tuple[str, str, str]]]:
    """An HTTP server posing as a PoP's admin API on `data` (pop.json, admin.token)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), AdminStandIn)
    port = server.server_address[1]
    data.mkdir()
    (data / "pop.json").write_text(json.dumps({"pid": 1, "public": "http://127.0.0.1:1",
                                               "admin": f"127.0.0.1:{port}"}))
    (data / "admin.token").write_text("secret")
    lock = (data / "pop.lock").open("a+")  # as a running PoP holds it
    fcntl.flock(lock, fcntl.LOCK_EX)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    AdminStandIn.seen = []
    try:
        yield AdminStandIn.seen
    finally:
        lock.close()
        server.shutdown()
        server.server_close()


def test_lora_rm_asks_the_admin_api_to_delete_the_adapter(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with admin_stand_in(data) as seen:
        r = edgefn("lora", "rm", "my-style", "--data", str(data))
        assert (r.returncode, r.stdout) == (0, "removed my-style\n"), r.stderr
        assert seen == [("DELETE", "/v1/ai/loras/my-style", "Bearer secret")]
        r = edgefn("lora", "rm", "missing", "--json", "--data", str(data))
        assert r.returncode == 1 and json.loads(r.stderr) == {
            "error": {"code": "not_found", "message": "no adapter 'missing'"}}


def test_gpu_worker_help_lists_the_worker_options() -> None:
    r = edgefn("gpu-worker", "--help")
    assert r.returncode == 0 and "--socket" in r.stdout and "(default: info)" in r.stdout
    own = subprocess.run([sys.executable, "-m", "gpu_worker", "--help"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT).stdout
    # the worker's own options, all passed through by `edgefn gpu-worker`
    assert set(re.findall(r"--[a-z][a-z-]+", own)) <= set(re.findall(r"--[a-z][a-z-]+", r.stdout))


def test_gpu_worker_passes_its_options_to_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    import gpu_worker.__main__

    seen: list[list[str]] = []
    monkeypatch.setattr(gpu_worker.__main__, "main", lambda argv: seen.append(argv) or 3)
    assert main(["gpu-worker", "--socket", "/tmp/w.sock"]) == 3
    assert main(["gpu-worker", "--socket", "s", "--config", "w.toml", "--log-level", "debug"]) == 3
    assert seen == [["--socket", "/tmp/w.sock", "--log-level", "info"],
                    ["--socket", "s", "--log-level", "debug", "--config", "w.toml"]]


LOG_LINES = """
import logging, sys
from runtime.cli.logs import configure
configure(int(sys.argv[1]))
logging.getLogger("edgefn.functions.hello").info("hello says hi")
logging.getLogger("edgefn.functions").warning("a warning", extra={"function": "echo"})
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("edgefn.functions.echo").exception("handler failed")
logging.getLogger("edgefn.functions.hello").debug("debug detail")
logging.getLogger("edgefn.pop").info("deployed hello")
logging.getLogger("edgefn.pop").warning("restore failed")
"""


def log_lines(verbosity: int) -> list[str]:
    r = subprocess.run([sys.executable, "-c", LOG_LINES, str(verbosity)], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    return unstamped(r.stderr)


def unstamped(text: str) -> list[str]:
    """The log lines in `text` without their time stamps."""
    stamp = re.compile(r"^(\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(,\d+)? ")
    return [stamp.sub("", line) for line in text.splitlines() if stamp.match(line)]


def test_function_logs_and_warnings_show_by_default() -> None:
    assert log_lines(0) == ["[hello] hello says hi", "[echo] WARNING a warning",
                            "[echo] ERROR handler failed", "WARNING edgefn.pop: restore failed"]


def test_v_shows_info_from_everything_and_vv_debug() -> None:
    assert "INFO edgefn.pop: deployed hello" in log_lines(1)
    assert "debug detail" not in "\n".join(log_lines(1))
    assert "[hello] debug detail" in log_lines(2)


def test_a_function_traceback_follows_its_line() -> None:
    r = subprocess.run([sys.executable, "-c", LOG_LINES, "0"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    after = r.stderr.split("[echo] ERROR handler failed\n")[1]
    assert after.startswith("Traceback") and "ZeroDivisionError" in after


def test_logs_follow_stderr_when_its_caller_replaces_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`edgefn` run in-process by a caller who swaps stderr (pytest's capture does, and
    closes the old one): its lines go to the stderr of the moment. Bound to the first,
    every later line failed with "--- Logging error ---" and a printed call stack."""
    import io

    first, now = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure(0)
    first.close()
    monkeypatch.setattr(sys, "stderr", now)
    logging.getLogger("edgefn.functions.hello").info("hello says hi")
    logging.getLogger("edgefn.pop").warning("restore failed")
    assert unstamped(now.getvalue()) == ["[hello] hello says hi",
                                         "WARNING edgefn.pop: restore failed"], now.getvalue()
