"""Helpers of the rollout tests: a topology of real PoPs, a keep-alive client that
says which version served, and a poller that watches every PoP during a rollout."""

from __future__ import annotations

import http.client
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.admin.client import AdminClient
from tests.support import Running

TIERS = {"edge-a": "edge", "edge-b": "edge", "central": "central"}


@dataclass
class Member:
    """A PoP of the topology: an `edgefn serve` process (its own GIL, as in a real
    topology) with its public listener and data dir."""

    host: str
    port: int
    data: Path

    @property
    def admin(self) -> AdminClient:
        return AdminClient(self.data)

    def deploy(self, directory: Path) -> dict[str, Any]:
        """A one-PoP deploy through its admin API, out of band of any rollout."""
        return self.admin.deploy(directory)

    def status(self, path: str) -> int:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            return resp.status
        finally:
            conn.close()


@dataclass
class Topology:
    run: Path
    pops: dict[str, Member]



class Client:
    """One keep-alive connection to a PoP's public listener."""

    def __init__(self, pop: Member | Running) -> None:
        self.conn = http.client.HTTPConnection(pop.host, pop.port, timeout=10)

    def version(self, path: str, key: str = "k") -> str:
        """The version (of ``x-edgefn-function: NAME@VERSION``) that served the request."""
        self.conn.request("GET", path, headers={"x-edgefn-canary-key": key})
        resp = self.conn.getresponse()
        resp.read()
        tag = resp.getheader("x-edgefn-function")
        assert resp.status == 200 and tag, (resp.status, tag)
        return tag.split("@", 1)[1]

    def close(self) -> None:
        self.conn.close()


def versions(pop: Member | Running, path: str, keys: list[str]) -> dict[str, str]:
    """The version that served `path` on `pop` for each canary key (one connection)."""
    client = Client(pop)
    try:
        return {k: client.version(path, k) for k in keys}
    finally:
        client.close()


@dataclass
class Poller:
    """Requests `path` on every PoP in turn, from a thread, until stopped; `seen` holds
    (when the request was sent, PoP, version that served it)."""

    pops: dict[str, Member]
    path: str
    seen: list[tuple[float, str, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Poller:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while len(self.seen) < len(self.pops) and time.monotonic() < deadline:
            time.sleep(0.005)  # wait for its first round, not for correctness
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)

    def _run(self) -> None:
        clients = {name: Client(p) for name, p in self.pops.items()}
        try:
            while not self.stop.is_set():
                for name, c in clients.items():
                    sent = time.monotonic()
                    self.seen.append((sent, name, c.version(self.path)))
        finally:
            for c in clients.values():
                c.close()
