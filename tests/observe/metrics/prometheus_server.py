"""A real Prometheus server (Debian's ``prometheus``) for the metrics tests: a free
loopback port, a temporary storage folder, and a generated prometheus.yml that
scrapes one target's ``/metrics`` every second (with a bearer token).

Skipped with a hint when prometheus is missing (``make services`` installs it),
except under CI=true, where that fails the run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support import free_port

CONFIG = """global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: edgefn
    metrics_path: /metrics
    authorization:
      credentials: {token}
    static_configs:
      - targets: ["{target}"]
"""


class Prometheus:
    def __init__(self, port: int, process: subprocess.Popen[bytes]) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.process = process

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector `promql` evaluates to now. Raises on an API error."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as resp:
            answer = json.load(resp)
        assert answer["status"] == "success", answer
        return list(answer["data"]["result"])

    def wait_for[T](self, what: str, check: Callable[[], T | None],
                    within: float = 30.0) -> T:
        """The first non-None `check()`, polled while Prometheus scrapes (every 1 s)."""
        deadline = time.monotonic() + within
        while True:
            got = check()
            if got is not None:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"Prometheus never showed {what} within {within} s")
            time.sleep(0.1)


def executable() -> str:
    exe = shutil.which("prometheus")
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("prometheus is missing: `make services` installs it")
        pytest.skip("prometheus is missing: run `make services` (apt-get install prometheus)")
    return exe


@contextmanager
def prometheus_server(folder: Path, target: str, token: str) -> Iterator[Prometheus]:
    """Prometheus scraping ``http://<target>/metrics`` with `token`, ready to query."""
    exe = executable()
    (folder / "prometheus.yml").write_text(CONFIG.format(token=token, target=target))
    port = free_port()
    proc = subprocess.Popen([exe, f"--config.file={folder / 'prometheus.yml'}",
                             f"--storage.tsdb.path={folder / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = Prometheus(port, proc)
    try:
        _wait_ready(server)
        yield server
    finally:
        proc.terminate()
        proc.wait(20)


def _wait_ready(server: Prometheus) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if server.process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError("prometheus did not become ready")
        time.sleep(0.05)
