"""A client of an emulated topology: it enters at its geography's anycast port
(`plan.Network.entries`: the home edge, or the nearest healthy one when that is
down) or, for the centralized baseline, at the port straight to central.

One keep-alive connection per client, re-opened when the far side closed it while
idle (as HTTP client pools do); a request that fails after it was sent is a
failure, never retried.
"""

from __future__ import annotations

import http.client
import select
import time
from pathlib import Path

import msgspec

from runtime.topology.runner import read_network


class Sample(msgspec.Struct, kw_only=True):
    """One request: when it started (monotonic), how long it took, and what came back."""

    geo: str
    kind: str
    started: float
    seconds: float = 0.0
    ttfb: float = 0.0  # to the first bytes of the body: an AI stream's first token
    status: int = 0  # 0: no answer (connection failed or closed)
    cache: str = ""  # the edge's x-edgefn-cache
    error: str = ""


def entry_port(run: Path, geo: str, direct: bool = False) -> int:
    """Raises `Failure` (no_topology) if nothing runs in `run`, KeyError for an unknown geo."""
    net = read_network(run)
    return (net.direct if direct else net.entries)[geo]


class Client:
    """Requests from one geography, in sequence, on one keep-alive connection."""

    def __init__(self, geo: str, port: int, timeout: float = 60.0) -> None:
        self.geo, self.port, self.timeout = geo, port, timeout
        self.conn: http.client.HTTPConnection | None = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _connection(self) -> http.client.HTTPConnection:
        """The open connection, or a new one if there is none or the far side closed
        it while it was idle (it is readable: EOF or a stray byte)."""
        conn = self.conn
        if conn is not None and conn.sock is not None and select.select([conn.sock], [], [], 0)[0]:
            self.close()
            conn = None
        if conn is None:
            conn = self.conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                          timeout=self.timeout)
        return conn

    def _exchange(self, method: str, path: str, body: bytes | None,
                  headers: dict[str, str]) -> http.client.HTTPResponse:
        """Send and read the status line. An idempotent request (GET, HEAD) on a
        kept-alive connection the far side closed just as it went out (no byte of an
        answer came back) is sent once more on a fresh connection, as HTTP clients do
        with a stale pooled connection (RFC 9110 9.2.2); any other failure is the
        request's. Raises OSError and `http.client.HTTPException`."""
        reused = self.conn is not None
        conn = self._connection()
        try:
            conn.request(method, path, body, headers)
            return conn.getresponse()
        except (ConnectionError, http.client.RemoteDisconnected):
            if not reused or method not in ("GET", "HEAD"):
                raise
            self.close()
            conn = self._connection()
            conn.request(method, path, body, headers)
            return conn.getresponse()

    def send(self, kind: str, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> Sample:
        """One request; never raises for what the network or the PoPs do."""
        sample = Sample(geo=self.geo, kind=kind, started=time.monotonic())
        try:
            resp = self._exchange(method, path, body, headers or {})
            first = resp.read1(65536)
            sample.ttfb = time.monotonic() - sample.started
            rest = resp.read()
            sample.status, sample.cache = resp.status, resp.getheader("x-edgefn-cache") or ""
            if resp.status >= 400:
                sample.error = (first + rest)[:200].decode(errors="replace")
            if resp.will_close:
                self.close()
        except (OSError, http.client.HTTPException) as e:
            sample.error = f"{type(e).__name__}: {e}"
            self.close()
        sample.seconds = time.monotonic() - sample.started
        return sample


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of Prometheus samples of `name` whose labels include `labels`."""
    total = 0.0
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and all(w in line for w in want):
            total += float(line.rsplit(" ", 1)[1])
    return total


def failed_beyond(samples: list[Sample], kills: list[float], grace: float | list[float]
                  ) -> list[Sample]:
    """Failed samples that were not in flight at a kill: sent more than `grace`
    seconds (the time the news takes to cross a link; one per kill, or one for all)
    after every kill before them, or finished before it."""
    graces = grace if isinstance(grace, list) else [grace] * len(kills)

    def in_flight(s: Sample) -> bool:
        return any(s.started <= k + g and s.started + s.seconds >= k
                   for k, g in zip(kills, graces, strict=True))
    return [s for s in samples if s.status != 200 and not in_flight(s)]


def in_flight(samples: list[Sample], kill: float) -> list[Sample]:
    """The samples sent before `kill` that had not ended by then."""
    return [s for s in samples if s.started < kill <= s.started + s.seconds]


def recovery(samples: list[Sample], kill: float, geos: set[str], kind: str = "") -> float:
    """Seconds from when a client of `geos` could send again after `kill` (the kill,
    or the end of its request then in flight: how long that one took is the
    machine's, not the failover's) to its sending of the first request (of `kind`,
    if given) that then succeeded: how long new requests could not get through.
    inf if none did."""
    busy = {s.geo: s.started + s.seconds for s in in_flight(samples, kill)}
    starts = [s.started - max(kill, busy.get(s.geo, kill)) for s in samples
              if s.started >= kill and s.status == 200 and s.geo in geos and kind in ("", s.kind)]
    return min(starts, default=float("inf"))
