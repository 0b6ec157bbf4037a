"""`edgefn kv` and `edgefn vectors` on a data dir and through a running PoP."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.support import pop_thread

ROOT = Path(__file__).resolve().parents[2]


def edgefn(*args: str, data: Path, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "runtime.cli", *args, "--data", str(data)],
                          input=stdin, capture_output=True, timeout=60, cwd=ROOT)


def ok(*args: str, data: Path, stdin: bytes = b"") -> bytes:
    r = edgefn(*args, data=data, stdin=stdin)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


def test_kv_and_vectors_on_a_data_dir(tmp_path: Path) -> None:
    d = tmp_path / "data"
    ok("kv", "put", "docs", "greeting", "hello", "--metadata", '{"lang": "en"}', data=d)
    ok("kv", "put", "docs", "bin", "-", data=d, stdin=b"\x00\x01\x02")
    assert ok("kv", "get", "docs", "greeting", data=d) == b"hello"
    assert ok("kv", "get", "docs", "bin", data=d) == b"\x00\x01\x02"
    assert ok("kv", "list", "docs", data=d).split() == [b"bin", b"greeting"]
    assert ok("kv", "increment", "docs", "n", data=d).strip() == b"1"
    assert json.loads(ok("kv", "delete", "docs", "bin", data=d)) is True
    ok("vectors", "create", "emb", "--dim", "3", data=d)
    (tmp_path / "v.jsonl").write_text('{"id": "a", "vector": [1, 0, 0], "metadata": {"t": 1}}\n'
                                      '{"id": "b", "vector": [0, 1, 0]}\n')
    assert json.loads(ok("vectors", "import", "emb", str(tmp_path / "v.jsonl"), data=d)) == {
        "imported": 2}
    np.save(tmp_path / "m.npy", np.array([[0, 0, 1]], dtype=np.float32))
    ok("vectors", "import", "emb", str(tmp_path / "m.npy"), data=d)
    hits = json.loads(ok("vectors", "query", "emb", "--vector", "[0.9, 0.1, 0]", "-k", "2",
                         data=d))
    assert [h["id"] for h in hits] == ["a", "b"] and hits[0]["metadata"] == {"t": 1}
    assert json.loads(ok("vectors", "stats", "emb", data=d))["count"] == 3


def test_kv_get_ends_its_line_at_a_terminal_only(tmp_path: Path) -> None:
    """README's `kv get docs greeting; kv list docs` printed `hellogreeting`; a pipe
    still gets the value's bytes as stored (the test above)."""
    d = tmp_path / "data"
    ok("kv", "put", "docs", "greeting", "hello", data=d)
    ok("kv", "put", "docs", "line", "-", data=d, stdin=b"hi\n")
    for key, shown in (("greeting", b"hello\r\n"), ("line", b"hi\r\n")):  # \r: the tty's
        main, tty = pty.openpty()
        with os.fdopen(main, "rb", buffering=0) as out:
            done = subprocess.run([sys.executable, "-m", "runtime.cli", "kv", "get", "docs", key,
                                   "--data", str(d)], stdout=tty, stderr=subprocess.PIPE,
                                  timeout=60, cwd=ROOT)
            os.close(tty)
            assert done.returncode == 0, done.stderr
            assert out.read(100) == shown


def test_bad_input_is_reported_and_changes_nothing(tmp_path: Path) -> None:
    d = tmp_path / "data"
    ok("vectors", "create", "emb", "--dim", "2", data=d)
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "vector": [1, 0]}\nnot json\n')
    r = edgefn("vectors", "import", "emb", str(tmp_path / "bad.jsonl"), data=d)
    assert r.returncode == 1 and b"bad.jsonl:2:" in r.stderr
    r = edgefn("vectors", "query", "emb", "--vector", "[1, 2, 3]", data=d)
    assert r.returncode == 1 and b"has dimension 2, got a vector of 3" in r.stderr
    r = edgefn("kv", "get", "nowhere", "k", data=d)
    assert r.returncode == 1 and b"unknown namespace 'nowhere'" in r.stderr
    for read in (["kv", "get", "n", "k"], ["kv", "list", "n"], ["vectors", "stats", "v"]):
        r = edgefn(*read, data=tmp_path / "typo")  # reads make no data dir
        assert r.returncode == 1 and b"no such data dir" in r.stderr
    assert not (tmp_path / "typo").exists()
    assert json.loads(ok("vectors", "stats", "emb", data=d))["count"] == 0
    # a refused put makes no namespace (it left an empty one); an increment makes its own
    assert edgefn("kv", "put", "fresh", "", "v", data=d).returncode == 1
    assert b"unknown namespace 'fresh'" in edgefn("kv", "list", "fresh", data=d).stderr
    assert ok("kv", "increment", "counters", "n", data=d).strip() == b"1"
    for bad in (["--metadata", '{"a": NaN}'], ["--ttl", "nan"], ["--ttl", "inf"]):
        r = edgefn("kv", "put", "docs", "k", "v", *bad, data=d)
        assert r.returncode == 2 and bad[0].encode() in r.stderr, r.stderr
    # a batch the store refuses (past f16's range: the import's check does not know the
    # index's dtype): where it starts and what went in before; ids are strings
    ok("vectors", "create", "half", "--dim", "2", "--dtype", "f16", data=d)
    (tmp_path / "late.jsonl").write_text("".join(
        f'{{"id": "v{i}", "vector": [1, {i % 100}]}}\n' for i in range(1200))
        + '{"id": "big", "vector": [1, 1e6]}\n')
    r = edgefn("vectors", "import", "half", str(tmp_path / "late.jsonl"), data=d)
    assert r.returncode == 1 and b"the records from line 1001 on were not imported (1000 " \
        b"before them were): " in r.stderr and b"past f16's" in r.stderr, r.stderr
    (tmp_path / "ids.jsonl").write_text('{"id": null, "vector": [1, 0]}\n')
    r = edgefn("vectors", "import", "emb", str(tmp_path / "ids.jsonl"), data=d)
    assert r.returncode == 1 and b'ids.jsonl:1: "id" must be a string' in r.stderr


def test_an_import_checks_every_line_before_it_writes_any(tmp_path: Path) -> None:
    """A misspelt "metadata" was imported as none; a bad line 1201 left the 1000 lines
    before it imported; a wrong dimension on line 2 was said of "line 1 on"."""
    d = tmp_path / "data"
    ok("vectors", "create", "emb", "--dim", "2", data=d)
    good = "".join(f'{{"id": "v{i}", "vector": [1, {i}]}}\n' for i in range(1200))
    for lines, error in [
        (['{"id": "c", "vector": [0, 1], "meta": {"t": 1}}'],
         ':1: unknown field "meta" (a record has "id", "vector" and "metadata")'),
        (['{"id": "a", "vector": [1, 0]}', '{"id": "c", "vector": [0, 1], "metdata": {}}'],
         ':2: unknown field "metdata"'),
        ([good + "not json"], ":1201: Expecting value"),
        (['{"id": "a", "vector": [1, 0]}', '{"id": "b", "vector": [1, 0, 0]}'],
         ':2: "vector" has 3 numbers; the index has dimension 2'),
        (['{"id": "a", "vector": [1, "0"]}'], ':1: "vector" must be a list of numbers'),
        (['{"id": "a", "vector": [1, 0], "metadata": [1]}'], ':1: "metadata" must be an '
                                                            "object (or null), got [1]"),
        # what the store refuses, before anything is written (1000 lines were)
        ([good + '{"id": "big", "vector": [1, 1e39]}'],
         ":1201: \"vector\" has a number past float32's range"),
        ([good + '{"id": "' + "x" * 257 + '", "vector": [1, 0]}'],
         ':1201: "id" must be 1 to 256 bytes'),
    ]:
        (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
        r = edgefn("vectors", "import", "emb", str(tmp_path / "in.jsonl"), data=d)
        assert r.returncode == 1 and r.stderr.decode().startswith(
            f"edgefn: {tmp_path / 'in.jsonl'}{error}"), r.stderr
        assert r.stderr.endswith(b"; nothing was imported\n"), r.stderr
        # read from a pipe (read once, held until checked): the same
        r = edgefn("vectors", "import", "emb", "/dev/stdin", data=d,
                   stdin=(tmp_path / "in.jsonl").read_bytes())
        assert r.returncode == 1 and f"/dev/stdin{error}".encode() in r.stderr, r.stderr
    assert json.loads(ok("vectors", "stats", "emb", data=d))["count"] == 0
    # a new index takes the first vector's dimension: a later one is named against it
    (tmp_path / "new.jsonl").write_text('{"id": "a", "vector": [1, 0]}\n'
                                        '{"id": "b", "vector": [1, 0, 0]}\n')
    r = edgefn("vectors", "import", "fresh", str(tmp_path / "new.jsonl"), data=d)
    assert r.returncode == 1 and b"""new.jsonl:2: "vector" has 3 numbers; line 1's has 2""" \
        in r.stderr, r.stderr
    rows = np.ones((1500, 2), dtype=np.float32)
    rows[1200, 1] = np.nan
    np.save(tmp_path / "nan.npy", rows)
    r = edgefn("vectors", "import", "emb", str(tmp_path / "nan.npy"), data=d)
    assert r.returncode == 1 and b"nan.npy: row 1200 has a NaN" in r.stderr, r.stderr
    assert json.loads(ok("vectors", "stats", "emb", data=d))["count"] == 0
    np.save(tmp_path / "m.npy", np.zeros((2, 3), dtype=np.float32))
    r = edgefn("vectors", "import", "emb", str(tmp_path / "m.npy"), data=d)
    assert r.returncode == 1 and b"m.npy: rows of 3 numbers; the index has dimension 2" \
        in r.stderr, r.stderr
    assert json.loads(ok("vectors", "import", "emb", "/dev/stdin", data=d,
                         stdin=good.encode())) == {"imported": 1200}


def test_commands_go_through_a_running_pop(tmp_path: Path) -> None:
    d = tmp_path / "data"
    with pop_thread(d) as running:
        ok("vectors", "create", "live", "--dim", "2", data=d)
        ok("vectors", "upsert", "live", "x", "--vector", "[1, 0]", data=d)
        ok("kv", "put", "live", "k", "v", data=d)
        (tmp_path / "v.jsonl").write_text('{"id": "y", "vector": [0, 1]}\n'
                                          '{"id": "z", "vector": [0, 1, 0]}\n')
        r = edgefn("vectors", "import", "live", str(tmp_path / "v.jsonl"), data=d)
        assert r.returncode == 1 and b'v.jsonl:2: "vector" has 3 numbers; the index has ' \
            b"dimension 2; nothing was imported" in r.stderr, r.stderr
        # the PoP's own in-memory index sees the write at once
        assert running.pop.stores.vectors.query("live", [1, 0], 1)[0].id == "x"
        assert running.pop.stores.kv.get("live", b"k") == b"v"


def test_a_dead_pops_files_do_not_stand_for_a_running_one(tmp_path: Path) -> None:
    """A PoP killed -9 leaves pop.json: the CLI then failed to reach it instead of
    opening the data dir. And one that runs is never written behind (its admin
    token gone, the CLI had opened the stores directly)."""
    import fcntl

    d = tmp_path / "data"
    ok("kv", "put", "n", "k", "v", data=d)
    (d / "pop.json").write_text('{"pid": 1, "public": "http://127.0.0.1:9", '
                                '"admin": "127.0.0.1:9"}')
    (d / "admin.token").write_text("x")
    (d / "pop.lock").touch()
    assert ok("kv", "get", "n", "k", data=d) == b"v"  # on the data dir: nobody holds it
    with (d / "pop.lock").open() as held:  # a PoP that runs (it holds the lock)
        fcntl.flock(held, fcntl.LOCK_EX)
        (d / "pop.json").unlink()
        r = edgefn("kv", "put", "n", "k", "w", data=d)
        assert r.returncode == 1 and b"a PoP holds data dir" in r.stderr
    assert ok("kv", "get", "n", "k", data=d) == b"v"


def test_a_value_at_the_limit_and_odd_names_through_a_running_pop(tmp_path: Path) -> None:
    """A 16 MiB value arrives base64 in JSON (~21.4 MiB): it was refused by the admin
    listener's body limit, and the CLI said the PoP could not be reached. A name with
    a space or "/" crashed the CLI (InvalidURL) or reached another endpoint."""
    d = tmp_path / "data"
    value = np.random.default_rng(1).bytes(16 << 20)
    with pop_thread(d):
        ok("kv", "put", "big", "v", "-", data=d, stdin=value)
        assert ok("kv", "get", "big", "v", data=d) == value
        for name in ("BAD NS", "a/b", "a?b"):
            r = edgefn("kv", "get", name, "k", data=d)
            assert r.returncode == 1, name  # the store's own answer about that very name
            assert r.stderr == f"edgefn: unknown namespace {name!r}\n".encode(), r.stderr
    r = edgefn("vectors", "query", "emb", "--vector", "[NaN, 0]", data=d)
    assert r.returncode == 2 and b"finite numbers" in r.stderr  # a usage error, at once


def test_vectors_create_takes_graph_settings_and_refuses_bad_ones(tmp_path: Path) -> None:
    d = tmp_path / "data"
    ok("vectors", "create", "emb", "--dim", "2", "--connectivity", "8",
       "--expansion-search", "32", data=d)
    stats = json.loads(ok("vectors", "stats", "emb", data=d))
    assert (stats["connectivity"], stats["expansion_search"]) == (8, 32)
    r = edgefn("vectors", "create", "other", "--dim", "2", "--expansion-add", "5", data=d)
    assert r.returncode == 1 and b"expansion_add must be an integer 8..4096, got 5" in r.stderr


def test_the_imports_checks_agree_with_the_store() -> None:
    from kv import vectors
    from runtime.cli import store
    assert store.MAX_ID_BYTES == vectors.MAX_ID_BYTES
    assert float(np.finfo(np.float32).max) == store.F32_MAX
