"""A real ``redis-server`` for the tests that share limits across PoPs: started on
a free loopback port with no persistence, in a temporary folder, and stopped.

Skipped with a hint when redis-server is missing (``make services`` installs it),
except under CI=true, where that fails the run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from tests.support import free_port


class RedisServer:
    def __init__(self, port: int, process: subprocess.Popen[bytes]) -> None:
        self.port, self.process = port, process
        self.url = f"redis://127.0.0.1:{port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with started_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@contextmanager
def started_redis(folder: Path, port: int | None = None) -> Iterator[RedisServer]:
    """A redis-server on `port` (default: a free one), stopped on exit (if it is
    still running)."""
    exe = shutil.which("redis-server")
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is missing: `make services` installs it")
        pytest.skip("redis-server is missing: run `make services` (apt-get install "
                    "redis-server)")
    folder.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(folder)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = RedisServer(port, proc)
    try:
        _wait_ready(server)
        yield server
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(10)


def _wait_ready(server: RedisServer) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            with server.client() as c:
                c.ping()
            return
        except redis.ConnectionError:
            if server.process.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.02)
