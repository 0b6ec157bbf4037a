"""The deployments that stored a response, shared by a PoP's workers
(`runtime.cache.http.labels`): real files, two handles on one folder standing in
for two workers."""

from __future__ import annotations

import os
from pathlib import Path

from runtime.cache.http.labels import SharedLabels


def test_what_one_worker_adds_the_other_reads_once_and_a_new_one_reads_all(
        tmp_path: Path) -> None:
    a, b = SharedLabels(tmp_path), SharedLabels(tmp_path)
    try:
        assert (a.stamp(), a.fresh(), b.fresh()) == (0, [], [])
        a.add("hello@1")
        assert b.stamp() != 0 and b.fresh() == ["hello@1"] and b.fresh() == []
        before = a.stamp()
        b.add("api@2")
        b.add("hello@1")  # two workers' first stores of one deployment: harmless
        assert a.stamp() != before
        assert a.fresh() == ["hello@1", "api@2", "hello@1"]
    finally:
        a.close()
        b.close()
    c = SharedLabels(tmp_path)  # a worker started later (or after a restart)
    try:
        assert set(c.fresh()) == {"hello@1", "api@2"}
    finally:
        c.close()


def test_a_line_the_size_does_not_cover_yet_is_not_read(tmp_path: Path) -> None:
    """A worker reads up to the size the writer published after its write: a line
    being written (no size yet, or cut short) is read once it is whole."""
    labels = SharedLabels(tmp_path)
    try:
        labels.add("one@1")
        with open(tmp_path / "labels", "ab") as f:  # a write not published yet
            f.write(b"two@2\n")
        assert labels.fresh() == ["one@1"]
        labels.size[0] = os.path.getsize(tmp_path / "labels") - 2  # mid-line
        assert labels.fresh() == []
        labels.size[0] = os.path.getsize(tmp_path / "labels")
        assert labels.fresh() == ["two@2"]
    finally:
        labels.close()
