"""`edgefn dev`'s tree scan, without a PoP."""

from __future__ import annotations

from pathlib import Path

from runtime.cli.dev import function_dirs, snapshot


def make_function(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "edgefn.toml").write_text('name = "x"\n')
    return d


def test_hidden_folders_below_dir_are_skipped_but_dir_may_be_hidden(tmp_path: Path) -> None:
    root = tmp_path / ".config" / "fns"
    a = make_function(root / "a")
    make_function(root / ".cache" / "b")
    assert function_dirs(root) == [a]


def test_snapshot_sees_edits_and_survives_a_missing_tree(tmp_path: Path) -> None:
    d = make_function(tmp_path / "a")
    before = snapshot(d)
    (d / "main.wat").write_text("(module)")
    assert snapshot(d) != before and len(snapshot(d)) == 2
    assert snapshot(tmp_path / "gone") == ()
