"""De-sensitised event samples, shipped from every PoP to central (``[residency.samples]``).

`Sampler` (an `Observer`) keeps a share of the events (``rate``, decided by a keyed
hash of the request id, so a run is reproducible) in de-sensitised form: request
id, tenant, key id and client address hashed with the topology's secret, the error
kept only when it is a code, and nothing of the path, query, body, prompt, subject
or decisions: no free text leaves the region, so there is nothing left to scrub. It appends
them to an open spool file in ``DATA/samples/out/``; a batch closes after ``batch``
samples or ``interval_s`` seconds and is renamed ``<batch id>.jsonl``. `Shipper`
posts closed batches to central's `Ingest` in order, deleting each once it is
accepted; a failure leaves it on disk, retried with backoff. `Ingest` keeps the
first copy of each batch id, so a batch sent twice (an answer lost) lands once.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import time
from pathlib import Path
from typing import IO, Any

import msgspec

from runtime.net.message import Request, Response, json_response
from runtime.observe.event import Event
from runtime.security.residency import SampleSettings, hashed_id, mac

log = logging.getLogger("edgefn.samples")
INGEST_PATH = b"/_edgefn/samples"
BATCH_HEADER = b"x-edgefn-batch"
AUTH_HEADER = b"x-edgefn-auth"
MAX_BACKOFF_S = 5.0
_CODE = re.compile(r"^[a-z][a-z0-9_]{0,47}$")  # an error code ("rate_limited"), not a text


def batch_mac(secret: str, batch_id: str, body: bytes) -> str:
    return mac(secret, "samples", batch_id, hashlib.sha256(body).hexdigest())


class Sample(msgspec.Struct, omit_defaults=True, kw_only=True, gc=False):
    """One event, de-sensitised: no path, body, prompt or raw identifier."""

    ts: float
    pop: str
    tier: str
    geo: str = ""
    region: str = ""
    rid: str  # keyed hashes from here on
    tenant: str | None = None
    key_id: str | None = None
    client: str
    method: str
    status: int
    target: str | None = None
    duration_ms: float
    error: str | None = None
    operation: str | None = None
    model: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    ttft_ms: float | None = None


class Sampler:
    """The `Observer` that spools samples. Call `close` when done."""

    def __init__(self, settings: SampleSettings, secret: str, region: str,
                 spool: Path) -> None:
        self.settings = settings
        self.secret = secret
        self.region = region
        self.spool = spool
        spool.mkdir(parents=True, exist_ok=True)
        self.file: IO[bytes] | None = None  # the open batch
        self.open_id = ""
        self.count = 0
        self.opened = 0.0
        self.seq = 0
        for part in spool.glob("*.part"):  # a batch a crash left open is still a batch
            part.rename(part.with_suffix(".jsonl"))

    def observe(self, event: Event) -> None:
        if not self._chosen(event.rid):
            return
        if self.file is None:
            self._open()
        assert self.file is not None
        self.file.write(msgspec.json.encode(self.sample(event)) + b"\n")
        self.file.flush()
        self.count += 1
        if self.count >= self.settings.batch:
            self.seal()

    def sample(self, e: Event) -> Sample:
        """`e` de-sensitised."""
        ai = e.ai
        return Sample(
            ts=round(e.ts, 3), pop=e.pop, tier=e.tier, geo=e.geo, region=self.region,
            rid=self._hash(e.rid) or "", tenant=self._hash(e.tenant), key_id=self._hash(e.key_id),
            client=self._hash(e.client) or "", method=e.method, status=e.status,
            target=e.target.partition("@")[0] if e.target else None,
            duration_ms=e.duration_ms, error=_code(e.error),
            operation=ai.operation if ai else None, model=ai.model if ai else None,
            prompt_tokens=ai.prompt_tokens if ai else 0,
            completion_tokens=ai.completion_tokens if ai else 0,
            cached_tokens=ai.cached_tokens if ai else 0, ttft_ms=ai.ttft_ms if ai else None)

    def seal(self) -> None:
        """Close the open batch (if any) so the shipper may send it."""
        if self.file is None:
            return
        self.file.close()
        self.file = None
        (self.spool / f"{self.open_id}.part").rename(self.spool / f"{self.open_id}.jsonl")

    def due(self) -> bool:
        """The open batch is older than ``interval_s``."""
        return self.file is not None and time.monotonic() - self.opened >= \
            self.settings.interval_s

    def close(self) -> None:
        self.seal()

    def _open(self) -> None:
        self.seq += 1
        self.open_id = f"{time.time_ns():020d}-{os.getpid()}-{self.seq}"
        self.file = open(self.spool / f"{self.open_id}.part", "ab")  # noqa: SIM115
        self.count = 0
        self.opened = time.monotonic()

    def _chosen(self, rid: str) -> bool:
        rate = self.settings.rate
        if rate >= 1:
            return True
        h = hashlib.sha256(f"{self.secret}\n{rid}".encode()).digest()
        return int.from_bytes(h[:8]) < rate * 2**64

    def _hash(self, value: str | None) -> str | None:
        return None if value is None else hashed_id(self.secret, value)


def _code(error: str | None) -> str | None:
    if error is None:
        return None
    return error if _CODE.match(error) else "[text]"


def closed_batches(spool: Path) -> list[Path]:
    """The spool's sealed batches, oldest first."""
    return sorted(spool.glob("*.jsonl"))


class Shipper:
    """Sends a `Sampler`'s sealed batches to central with `post` (an async
    ``(batch_id, body) -> status``); run `forever` as a task."""

    def __init__(self, sampler: Sampler, post: Any) -> None:
        self.sampler = sampler
        self.post = post
        self.backoff = 0.0
        self.shipped = 0

    async def once(self) -> bool:
        """Seal a due batch, then send every sealed one in order. True when the
        spool is empty; False at the first failure (that batch stays)."""
        if self.sampler.due():
            self.sampler.seal()
        for path in closed_batches(self.sampler.spool):
            try:
                status = await self.post(path.stem, path.read_bytes())
            except Exception as e:  # central down, the link cut: keep it, retry later
                log.info("samples: batch %s not sent (%s); retrying", path.stem, e)
                return False
            if status // 100 != 2:
                log.warning("samples: central answered %d to batch %s", status, path.stem)
                return False
            path.unlink()
            self.shipped += 1
        return True

    async def forever(self) -> None:
        interval = self.sampler.settings.interval_s
        while True:
            ok = await self.once()
            self.backoff = 0.0 if ok else min(MAX_BACKOFF_S, max(interval, self.backoff * 2))
            await asyncio.sleep(self.backoff or interval / 2)


def http_post(url: str, secret: str) -> Any:
    """A `Shipper` post function sending to central's ingest `url` (httpx2)."""
    import httpx2

    client = httpx2.AsyncClient(timeout=10.0)

    async def post(batch_id: str, body: bytes) -> int:
        resp = await client.post(url, content=body, headers={
            BATCH_HEADER.decode(): batch_id, AUTH_HEADER.decode(): batch_mac(
                secret, batch_id, body), "content-type": "application/x-ndjson"})
        return int(resp.status_code)

    return post


class Ingest:
    """Central's end: POST ``/_edgefn/samples`` with a batch, kept once per batch id
    in ``dir/<batch id>.jsonl``."""

    path = INGEST_PATH

    def __init__(self, secret: str, dir: Path) -> None:
        self.secret = secret
        self.dir = dir
        dir.mkdir(parents=True, exist_ok=True)

    def __call__(self, request: Request) -> Response:
        batch_id = (request.header(BATCH_HEADER) or b"").decode("latin-1")
        tag = (request.header(AUTH_HEADER) or b"").decode("latin-1")
        if request.method != b"POST":
            return _error(405, "method_not_allowed", "POST a batch of samples")
        if not batch_id.isascii() or not batch_id.replace("-", "").isdigit() or len(batch_id) > 80:
            return _error(400, "bad_batch", "x-edgefn-batch: expected a batch id")
        if tag != batch_mac(self.secret, batch_id, request.body):
            return _error(403, "forbidden", "x-edgefn-auth does not match this topology's "
                          "secret")
        return json_response({"batch": batch_id, "new": self._keep(batch_id, request.body)})

    def _keep(self, batch_id: str, body: bytes) -> bool:
        """Write the batch unless it is here already: False for a repeat."""
        final = self.dir / f"{batch_id}.jsonl"
        if final.exists():
            return False
        tmp = final.with_suffix(".tmp")
        tmp.write_bytes(body)
        tmp.rename(final)
        return True


def _error(status: int, code: str, message: str) -> Response:
    return json_response({"error": {"code": code, "message": message}}, status)
