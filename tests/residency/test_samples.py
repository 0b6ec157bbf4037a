"""De-sensitised samples without sockets: a real `Sampler` spooling to a real
folder, a `Shipper` whose post goes straight to a real `Ingest` (or fails, as a
central outage does)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec

from runtime.net.message import Request
from runtime.observe.event import AIUsage, Event
from runtime.observe.samples import (
    AUTH_HEADER,
    BATCH_HEADER,
    INGEST_PATH,
    Ingest,
    Sampler,
    Shipper,
    batch_mac,
    closed_batches,
)
from runtime.security.residency import SampleSettings

SECRET = "0123456789abcdef-topology"
MARK = "MARKER-7f3a"


def event(i: int) -> Event:
    return Event(ts=1000.0 + i, rid=f"rid-{MARK}-{i}", pop="edge-eu", tier="edge", geo="eu-west",
                 client="203.0.113.9", tenant="acme-eu", key_id="k_acme", subject="bob",
                 method="POST", host="api.example", path=f"/v1/{MARK}", query=f"q={MARK}",
                 status=500, target="hello@1a2b3c4d", decisions={"waf": {"body": MARK}},
                 error=f"failed for bob@example.com at 10.1.2.3 ({MARK})",
                 ai=AIUsage(operation="chat", model="smollm2-135m", prompt=f"hi {MARK}",
                            prompt_tokens=7, completion_tokens=3))


def sampler(tmp_path: Path, rate: float = 1.0, batch: int = 3) -> Sampler:
    return Sampler(SampleSettings(rate=rate, batch=batch, interval_s=60, to="http://x/"),
                   SECRET, "emea", tmp_path / "out")


def posting_to(ingest: Ingest) -> tuple[list[str], object]:
    sent: list[str] = []

    async def post(batch_id: str, body: bytes) -> int:
        sent.append(batch_id)
        req = Request(b"POST", INGEST_PATH, b"", [
            (BATCH_HEADER, batch_id.encode()),
            (AUTH_HEADER, batch_mac(SECRET, batch_id, body).encode())], b"c", "1.1", True, "c:1")
        req.body = body
        return ingest(req).status
    return sent, post


def test_a_sample_keeps_no_marker_and_no_raw_identifier(tmp_path: Path) -> None:
    s = sampler(tmp_path, batch=1)
    s.observe(event(1))
    (batch,) = closed_batches(tmp_path / "out")
    text = batch.read_text()
    for raw in (MARK, "acme-eu", "k_acme", "bob", "203.0.113.9", "10.1.2.3", "/v1/"):
        assert raw not in text, raw
    sample = json.loads(text)
    assert sample["tenant"] == s.sample(event(2)).tenant, "a tenant hashes the same each time"
    assert sample["region"] == "emea" and sample["completion_tokens"] == 3
    assert sample["error"] == "[text]", "an error that is not a code is dropped"
    assert s.sample(msgspec.structs.replace(event(3), error="rate_limited")).error == \
        "rate_limited"


def test_the_rate_picks_a_share_reproducibly(tmp_path: Path) -> None:
    s = sampler(tmp_path, rate=0.25, batch=100_000)
    picked = [i for i in range(2000) if s._chosen(f"rid-{i}")]
    assert 400 <= len(picked) <= 600
    again = sampler(tmp_path, rate=0.25)  # another process of the topology: same choice
    assert [i for i in range(2000) if again._chosen(f"rid-{i}")] == picked


def test_batches_survive_an_outage_and_arrive_once(tmp_path: Path) -> None:
    s = sampler(tmp_path, batch=3)
    for i in range(10):
        s.observe(event(i))
    s.seal()
    assert len(closed_batches(tmp_path / "out")) == 4
    ingest = Ingest(SECRET, tmp_path / "in")
    sent, post = posting_to(ingest)

    async def down(batch_id: str, body: bytes) -> int:
        raise ConnectionRefusedError("central is down")

    assert asyncio.run(Shipper(s, down).once()) is False
    assert len(closed_batches(tmp_path / "out")) == 4, "nothing lost while central is down"
    restarted = sampler(tmp_path, batch=3)  # the PoP restarts too: the spool is on disk
    assert asyncio.run(Shipper(restarted, post).once()) is True
    assert closed_batches(tmp_path / "out") == []
    rows = [json.loads(line) for f in sorted((tmp_path / "in").glob("*.jsonl"))
            for line in f.read_text().splitlines()]
    assert len(rows) == 10 and len(sent) == 4


def test_a_batch_sent_twice_lands_once(tmp_path: Path) -> None:
    ingest = Ingest(SECRET, tmp_path / "in")
    answers = []
    for _ in range(2):  # the first answer was lost: the shipper sends it again
        req = Request(b"POST", INGEST_PATH, b"", [
            (BATCH_HEADER, b"123-4-5"),
            (AUTH_HEADER, batch_mac(SECRET, "123-4-5", b'{"a":1}\n').encode())],
            b"c", "1.1", True, "c:1")
        req.body = b'{"a":1}\n'
        response = ingest(req)
        answers.append((response.status, json.loads(response.body)["new"]))  # type: ignore[arg-type]
    assert answers == [(200, True), (200, False)]
    assert [p.name for p in (tmp_path / "in").iterdir()] == ["123-4-5.jsonl"]


def test_a_part_batch_left_by_a_crash_is_shipped_after_restart(tmp_path: Path) -> None:
    s = sampler(tmp_path, batch=100)
    s.observe(event(1))  # open, not sealed: the process dies here
    assert s.file is not None and closed_batches(tmp_path / "out") == []
    s.file.close()
    assert len(closed_batches(sampler(tmp_path).spool)) == 1


def test_ingest_refuses_a_batch_not_signed_with_the_secret(tmp_path: Path) -> None:
    ingest = Ingest(SECRET, tmp_path / "in")
    req = Request(b"POST", INGEST_PATH, b"", [(BATCH_HEADER, b"1-2-3"),
                                              (AUTH_HEADER, b"0" * 32)], b"c", "1.1", True, "c:1")
    req.body = b"{}\n"
    assert ingest(req).status == 403
    req.headers = [(BATCH_HEADER, b"../../etc"), (AUTH_HEADER, b"x")]
    assert ingest(req).status == 400
    assert list((tmp_path / "in").iterdir()) == []
