"""``[events] backups = 0``: the JSONL file starts over at `max_bytes` and keeps
no rotated copy (no ``events.jsonl.1``): what a PoP was told to keep on disk is
one file of at most `max_bytes`, not that and one more."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from runtime.observe.sink import JsonlSink
from tests.observe.events.test_ring import event


def test_no_backups_keeps_only_the_current_file(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    one = len(msgspec.json.encode(event(0))) + 1
    sink = JsonlSink(path, max_bytes=one * 3, backups=0)
    for i in range(10):  # no loop running: each event is handed over at once
        sink.observe(event(i))
    sink.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.jsonl"]
    assert [json.loads(line)["rid"] for line in path.read_text().splitlines()] == ["r9"]
    assert path.stat().st_size <= one * 3 and path.stat().st_mode & 0o777 == 0o600


def test_one_backup_keeps_exactly_one_rotated_file(tmp_path: Path) -> None:
    """The counterpart: ``backups = 1`` keeps the file before as ``.1``, no ``.2``."""
    path = tmp_path / "events.jsonl"
    one = len(msgspec.json.encode(event(0))) + 1
    sink = JsonlSink(path, max_bytes=one * 3, backups=1)
    for i in range(10):
        sink.observe(event(i))
    sink.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.jsonl", "events.jsonl.1"]
    rotated = Path(f"{path}.1").read_text().splitlines()
    assert [json.loads(line)["rid"] for line in rotated] == ["r6", "r7", "r8"]
