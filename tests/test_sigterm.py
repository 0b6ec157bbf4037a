"""SIGTERM on `edgefn serve`: it stops accepting, lets in-flight requests finish
for `grace_seconds` (from pop.toml), cuts a request still running past it, and exits."""

from __future__ import annotations

import http.client
import signal
import socket
import threading
import time
from pathlib import Path

from runtime.admin.client import AdminClient
from tests.support import host_pids, pop_process, python_function, running

GRACE = 2.0

NAP = """
import time
from edgefn import Response

def handle(request, env):
    env.log("started", request.query["tag"])  # the PoP's log: the test reads its stderr
    time.sleep(float(request.query["s"]))
    return Response(f"slept {request.query['s']}")
"""


def test_sigterm_lets_requests_finish_within_the_grace_then_cuts_and_exits(
        tmp_path: Path) -> None:
    with pop_process(tmp_path, f"grace_seconds = {GRACE}\n") as pop:
        proc, host, port, stderr_lines = pop.proc, pop.host, pop.port, pop.stderr
        AdminClient(tmp_path / "data").deploy(python_function(
            tmp_path, "nap", NAP, limits="wall_ms = 60000",
            pool="min = 2\nmax = 2\nstandby = false"))
        hosts = host_pids("nap", parent=proc.pid)
        assert hosts
        outcome: dict[str, tuple[float, object]] = {}

        def call(tag: str, seconds: float) -> None:
            conn = http.client.HTTPConnection(host, port, timeout=30)
            try:
                conn.request("GET", f"/nap?s={seconds}&tag={tag}")
                resp = conn.getresponse()
                result: object = (resp.status, resp.getheader("connection"), resp.read())
            except (ConnectionError, http.client.HTTPException) as e:
                result = e
            finally:
                conn.close()
            outcome[tag] = (time.monotonic(), result)

        threads = [threading.Thread(target=call, args=("short", GRACE / 4)),
                   threading.Thread(target=call, args=("long", 30))]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while not all(any("nap@" in line and f": started {tag}" in line
                              for line in list(stderr_lines)) for tag in ("short", "long")):
            assert time.monotonic() < deadline, "the requests did not start"
            time.sleep(0.01)

        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        refused = False
        while not refused and time.monotonic() - sent < GRACE / 2:
            try:  # it stops accepting at once
                socket.create_connection((host, port), timeout=1).close()
                time.sleep(0.02)
            except ConnectionRefusedError:
                refused = True
        assert refused, "still accepting connections after SIGTERM"
        for t in threads:
            t.join(30)
        proc.wait(GRACE * 3)
        exited = time.monotonic() - sent

    # the short request finished normally (and its connection closes: we are stopping)
    assert outcome["short"][1] == (200, "close", f"slept {GRACE / 4}".encode())
    # the long one was cut when the grace ran out, and the PoP exited right after
    when, what = outcome["long"]
    assert isinstance(what, ConnectionError | http.client.HTTPException), what
    cut_after = when - sent
    assert GRACE * 0.95 <= cut_after <= GRACE * 1.25 + 0.25, f"cut {cut_after:.2f}s after SIGTERM"
    assert exited <= GRACE * 1.5 + 0.5, f"exited {exited:.2f}s after SIGTERM"
    stderr = "".join(stderr_lines)
    assert proc.returncode == 0, stderr[-3000:]
    assert f"still busy after the {GRACE:.1f}s grace period" in stderr
    assert "Traceback" not in stderr, stderr[-3000:]
    assert not any(running(pid) for pid in hosts), "isolate hosts outlived the PoP"
