"""Vector index: a stateful test against exact numpy search, crash repair, bad input."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from edgefn_core.errors import InvalidValue, KeyNotFound, LimitExceeded, UnknownNamespace
from kv.vectors import VectorStore

DIM = 6
IDS = st.sampled_from([f"doc{i}" for i in range(12)])
VEC = st.lists(st.integers(-5, 5), min_size=DIM, max_size=DIM).filter(any)
TAG = st.sampled_from(["red", "blue"])


def exact_l2(model: dict[str, tuple[np.ndarray, dict]], q: np.ndarray, k: int,
             tag: str | None) -> list[tuple[str, float]]:
    rows = [(i, float(((v - q) ** 2).sum())) for i, (v, m) in model.items()
            if tag is None or m["tag"] == tag]
    return sorted(rows, key=lambda r: (r[1], r[0]))[:k]


class VectorModel(RuleBasedStateMachine):
    """The index against a dict of numpy vectors; exact search on both sides so the
    bookkeeping (ids, metadata, deletes, filters, reopen) is checked exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp()
        self.store = VectorStore(self.dir, sync=False)
        self.store.create("v", DIM, metric="l2")
        self.model: dict[str, tuple[np.ndarray, dict]] = {}

    @rule(items=st.lists(st.tuples(IDS, VEC, TAG), min_size=1, max_size=4,
                         unique_by=lambda t: t[0]))
    def upsert(self, items: list[tuple[str, list[int], str]]) -> None:
        self.store.upsert("v", [(i, v, {"tag": t}) for i, v, t in items])
        for i, v, t in items:
            self.model[i] = (np.array(v, dtype=np.float32), {"tag": t})

    @rule(ids=st.lists(IDS, max_size=3, unique=True))
    def delete(self, ids: list[str]) -> None:
        assert self.store.delete("v", ids) == sum(i in self.model for i in ids)
        for i in ids:
            self.model.pop(i, None)

    @rule(q=VEC, k=st.integers(1, 5), tag=st.none() | TAG)
    def query(self, q: list[int], k: int, tag: str | None) -> None:
        qv = np.array(q, dtype=np.float32)
        got = self.store.query("v", qv, k, {"tag": tag} if tag else None, exact=True)
        want = exact_l2(self.model, qv, k, tag)
        assert [round(m.distance, 3) for m in got] == [round(d, 3) for _, d in want]
        assert all(m.metadata == self.model[m.id][1] for m in got)

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = VectorStore(self.dir, sync=False)

    @rule()
    def save(self) -> None:
        self.store.save("v")

    @invariant()
    def counts_agree(self) -> None:
        stats = self.store.stats("v")
        assert stats["count"] == stats["indexed"] == len(self.model)

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestVectorModel = VectorModel.TestCase
TestVectorModel.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


WRITER = """
import sys, numpy as np
from kv.vectors import VectorStore
s = VectorStore(sys.argv[1])
s.create("crash", 16)
rng = np.random.default_rng(0)
i = 0
while True:
    s.upsert("crash", [(f"id{i}", rng.normal(size=16), {"i": i})])
    if i % 7 == 3:
        s.delete("crash", [f"id{i - 2}"])
    if i % 50 == 49:
        s.save("crash")
    print(i, flush=True)
    i += 1
"""


def test_index_is_repaired_after_a_sigkill(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True, cwd=root)
    assert proc.stdout is not None
    acked = []
    for line in proc.stdout:
        acked.append(int(line))
        if len(acked) >= 180:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    deleted = {i - 2 for i in acked if i % 7 == 3}
    alive = [i for i in acked if i not in deleted]
    with VectorStore(tmp_path) as s:
        stats = s.stats("crash")
        assert stats["count"] == stats["indexed"]
        # the writer ran on past the lines read here before the kill: at least these
        assert stats["count"] >= len(alive)
        for i in alive:
            vec, meta = s.get("crash", f"id{i}")
            assert meta == {"i": i}
            assert s.query("crash", vec, 1)[0].id == f"id{i}"
        for i in deleted:
            with pytest.raises(KeyNotFound):
                s.get("crash", f"id{i}")
    # a lost or corrupt index file is rebuilt from LMDB
    (tmp_path / "crash.usearch").write_bytes(b"garbage")
    with VectorStore(tmp_path) as s:
        assert s.stats("crash")["indexed"] == s.stats("crash")["count"] >= len(alive)
    (tmp_path / "crash.usearch").unlink()
    with VectorStore(tmp_path) as s:
        assert s.stats("crash")["indexed"] >= len(alive)


def test_a_filtered_query_looks_among_a_bounded_number_of_candidates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A filter that matches only far vectors (or none) used to widen the search to
    the whole index: one request held the PoP's loop for 0.5 s on 100k vectors."""
    import kv.vectors

    rng = np.random.default_rng(7)
    with VectorStore(tmp_path) as s:
        s.create("docs", 4)
        near = rng.normal(0, 0.1, (600, 4)) + np.array([10, 0, 0, 0])
        s.upsert("docs", [(f"n{i}", v.tolist(), {"t": "near"}) for i, v in enumerate(near)])
        s.upsert("docs", [("far", [-10, 0, 0, 0], {"t": "far"})])
        q = [10, 0, 0, 0]
        assert [m.id for m in s.query("docs", q, k=1, filter={"t": "far"})] == ["far"]
        monkeypatch.setattr(kv.vectors, "FILTER_SCAN", 64)
        assert s.query("docs", q, k=1, filter={"t": "far"}) == []  # beyond the 64 nearest
        assert s.query("docs", q, k=1, filter={"t": "none"}) == []
        assert len(s.query("docs", q, k=5, filter={"t": "near"})) == 5


def test_many_equal_vectors_do_not_hide_another(tmp_path: Path) -> None:
    """200 copies of one vector: the HNSW graph never reached the one vector apart
    from them, even queried with that vector itself (a small index is exact now)."""
    with VectorStore(tmp_path) as s:
        s.create("dups", 3)
        s.upsert("dups", [(f"dup{i}", [1, 1, 1], None) for i in range(200)])
        s.upsert("dups", [("u1", [-0.5, 0.2, -0.8], None)])
        assert s.query("dups", [-0.5, 0.2, -0.8], k=2)[0].id == "u1"


def test_bad_input_gets_clear_errors(tmp_path: Path) -> None:
    with VectorStore(tmp_path) as s:
        s.create("docs", 3)
        with pytest.raises(InvalidValue, match="has dimension 3, got a vector of 2"):
            s.upsert("docs", [("a", [1, 2], None)])
        with pytest.raises(InvalidValue, match="NaN"):
            s.query("docs", [1, float("nan"), 0])
        with pytest.raises(UnknownNamespace, match="unknown vector index 'nope'"):
            s.query("nope", [1, 2, 3])
        with pytest.raises(LimitExceeded, match="vector ids must be"):
            s.upsert("docs", [("x" * 300, [1, 2, 3], None)])
        with pytest.raises(InvalidValue, match="metric must be one of"):
            s.create("other", 3, metric="hamming")
        with pytest.raises(InvalidValue, match="exists with dim=3"):
            s.create("docs", 4)
        with pytest.raises(InvalidValue, match="dimension must be"):
            s.create("big", 100_000)
        s.upsert("docs", [("ok", [1, 2, 3], {"a": 1})])
        with pytest.raises(InvalidValue):  # a batch with one bad vector writes nothing
            s.upsert("docs", [("b", [1, 2, 3], None), ("c", [1], None)])
        assert s.stats("docs")["count"] == 1
        # metadata a filter could not read (it broke every filtered query of the index)
        for meta in ("oops", [1], 3):
            with pytest.raises(InvalidValue, match="metadata of 'p' must be an object"):
                s.upsert("docs", [("p", [1, 0, 0], meta)])  # type: ignore[list-item]
        for k in (0, -1, "3", 2.0, True, 1001, 10**6):
            with pytest.raises(InvalidValue, match="k must be an integer from 1 to 1000"):
                s.query("docs", [1, 2, 3], k=k)  # type: ignore[arg-type]
        with pytest.raises(InvalidValue, match="filter must be an object"):
            s.query("docs", [1, 2, 3], filter=["a"])  # type: ignore[arg-type]
        assert [m.id for m in s.query("docs", [1, 2, 3], filter={"a": 1})] == ["ok"]
        s.upsert("docs", [("flag", [1, 2, 3], {"a": True}), ("float", [1, 2, 3], {"a": 1.0})])
        assert sorted(m.id for m in s.query("docs", [1, 2, 3], filter={"a": 1})) == [
            "float", "ok"]  # JSON's equality: true is not 1
        assert [m.id for m in s.query("docs", [1, 2, 3], filter={"a": True})] == ["flag"]


def test_what_the_graph_cannot_hold_and_ids_that_are_not_a_list_are_refused(
        tmp_path: Path) -> None:
    """70000 became inf in the default f16 graph: that vector came first in every cos
    query, at distance NaN (not JSON). delete("doc") deleted "d" and "o"."""
    with VectorStore(tmp_path) as s:
        s.create("docs", 3)  # f16
        s.upsert("docs", [("d", [1, 0, 0], None), ("o", [0, 1, 0], None),
                          ("doc", [0, 0, 1], None)])
        with pytest.raises(InvalidValue, match="past f16's 65504"):
            s.upsert("docs", [("huge", [70000, 0, 0], None)])
        with pytest.raises(InvalidValue, match="past f16's 65504"):
            s.query("docs", [0, 0, -70000])
        s.upsert("docs", [("edge", [65504, 0, 0], None)])  # f16's largest: held
        assert [m.id for m in s.query("docs", [0, 1, 0], k=1)] == ["o"]
        s.create("wide", 3, dtype="f32")
        s.upsert("wide", [("huge", [70000, 0, 0], None)])  # f32 holds it
        with pytest.raises(InvalidValue, match="past f32's range"):
            s.upsert("wide", [("huger", [1e39, 0, 0], None)])
        for ids in ("doc", b"doc", [1], None):
            with pytest.raises(InvalidValue, match="ids"):
                s.delete("docs", ids)  # type: ignore[arg-type]
        assert s.stats("docs")["count"] == 4
        assert s.delete("docs", ["doc"]) == 1 and s.delete("docs", ("d", "o")) == 2
        with pytest.raises(InvalidValue, match="not a list of numbers"):
            s.upsert("docs", [("s", "1.5", None)])


def test_i8_is_for_cos_only(tmp_path: Path) -> None:
    """usearch scales each vector to length 1 for i8: under l2, [3, 0] and [100, 0]
    were one point, and [100, 0] the nearest to [50, 0] (with [3, 0] in the index)."""
    with VectorStore(tmp_path) as s:
        for metric in ("l2", "ip"):
            with pytest.raises(InvalidValue, match=f"use it with metric cos, f16 or f32 for "
                                                   f"{metric}"):
                s.create(f"q-{metric}", 2, metric=metric, dtype="i8")
        assert s.names() == []
        s.create("cosine", 2, dtype="i8")
        s.upsert("cosine", [("far", [100, 0], None), ("up", [0, 100], None),
                            ("near", [3, 0.1], None)])
        assert [m.id for m in s.query("cosine", [50, 1], k=3)] == ["near", "far", "up"]


def test_an_id_repeated_in_one_upsert_keeps_the_last(tmp_path: Path) -> None:
    with VectorStore(tmp_path) as s:
        s.create("v", 2, metric="l2")
        assert s.upsert("v", [("a", [1, 0], {"n": 1}), ("a", [0, 1], {"n": 2})]) == 1
        vec, meta = s.get("v", "a")
        assert vec.tolist() == [0, 1] and meta == {"n": 2}
        assert s.stats("v")["indexed"] == 1


def test_graph_settings_are_stored_applied_and_kept_across_reopen(tmp_path: Path) -> None:
    with VectorStore(tmp_path) as s:
        s.create("g", 4, connectivity=8, expansion_add=64, expansion_search=24)
        s.upsert("g", [("a", [1, 0, 0, 0], None)])
        assert s.create("g", 4).connectivity == 8  # settings left out are not compared
        s.create("old", 4, dtype="f32")  # made before f16 was the default
        assert s.create("old", 4).dtype == "f32"
        assert s.create("new", 4).dtype == "f16"
    with VectorStore(tmp_path) as s:
        stats = s.stats("g")
        assert (stats["connectivity"], stats["expansion_add"], stats["expansion_search"]) == (
            8, 64, 24)
        index = s._open["g"].index  # the usearch index itself runs with them
        assert (index.connectivity, index.expansion_add, index.expansion_search) == (8, 64, 24)
        with pytest.raises(InvalidValue, match="exists with dim=4 metric=cos connectivity=8"):
            s.create("g", 4, connectivity=16)
        with pytest.raises(InvalidValue, match="exists with dim=4 metric=cos dtype=f16"):
            s.create("g", 4, dtype="f32")


@pytest.mark.parametrize(("field", "value"), [
    ("connectivity", 1), ("connectivity", 129), ("expansion_add", 7),
    ("expansion_search", 4097), ("expansion_search", "64"), ("connectivity", True),
    ("expansion_add", 64.0),
])
def test_bad_graph_settings_are_refused_by_name(tmp_path: Path, field: str,
                                                value: object) -> None:
    with VectorStore(tmp_path) as s:
        with pytest.raises(InvalidValue, match=f"{field} must be an integer .*got {value!r}"):
            s.create("g", 4, **{field: value})  # type: ignore[arg-type]
        assert s.names() == []


def test_a_write_whose_save_fails_is_acknowledged_and_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The save after a full log runs after the write committed: a full disk made
    the write answer 500 though it had happened (and left a 0-byte .tmp file)."""
    import errno

    import kv.vectors

    monkeypatch.setattr(kv.vectors, "SAVE_EVERY", 4)
    with VectorStore(tmp_path / "v") as vs:
        vs.create("docs", 2)

        def full(path: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(kv.vectors, "_fsync", full)
        items = [(f"d{i}", [1.0, float(i)], None) for i in range(5)]
        assert vs.upsert("docs", items) == 5  # acknowledged, not raised
        assert "saving its file failed" in caplog.text
        assert vs.stats("docs")["count"] == 5
        assert not list((tmp_path / "v").glob("*.tmp"))
        assert vs.delete("docs", ["d0"]) == 1
        monkeypatch.undo()
    with VectorStore(tmp_path / "v") as vs:  # reopened: what was acknowledged is there
        assert vs.stats("docs")["count"] == 4
        assert [m.id for m in vs.query("docs", [1.0, 4.0], 1)] == ["d4"]


def test_an_index_file_damaged_in_place_is_rebuilt_from_the_records(tmp_path: Path) -> None:
    """Same size, garbage inside: it loaded, and every query answered "Out of memory!"
    until the file was deleted by hand. Its save's sum now tells it apart."""
    rng = np.random.default_rng(5)
    vecs = rng.normal(size=(300, 8)).astype(np.float32)
    with VectorStore(tmp_path / "v") as vs:
        vs.create("docs", 8, "l2")
        vs.upsert("docs", [(f"d{i}", vecs[i], None) for i in range(300)])
        vs.save("docs")
    file = tmp_path / "v" / "docs.usearch"
    data = bytearray(file.read_bytes())
    data[len(data) // 3: len(data) // 3 + 4096] = rng.integers(0, 255, 4096, np.uint8).tobytes()
    file.write_bytes(bytes(data))
    with VectorStore(tmp_path / "v") as vs:
        assert vs.stats("docs")["count"] == 300
        got = vs.query("docs", vecs[42], 1)
        assert [m.id for m in got] == ["d42"]


def test_past_the_stores_last_index_a_create_is_refused_and_leaves_nothing(
        tmp_path: Path) -> None:
    """LMDB's named databases run out at MAX_INDEXES indexes: the next create raised
    MDB_DBS_FULL after it had stored the index's record, so every later count of its
    owner's indexes (the quota, `held`) failed opening the databases of an index
    that did not exist. Refused, saying so, and nothing of it is left."""
    from kv.quota import Quota
    from kv.vectors import MAX_INDEXES

    vs = VectorStore(tmp_path / "v", sync=False)
    try:
        for i in range(MAX_INDEXES):
            vs.create(f"i{i}", 1)
        with pytest.raises(LimitExceeded, match=rf"^the vector store holds at most "
                                                rf"{MAX_INDEXES} indexes; index 'one' would "
                                                r"be one more$"):
            vs.create("one", 1)
        assert "one" not in vs.names() and len(vs.names()) == MAX_INDEXES
        names = ("i0", "one")
        assert vs.held(names) == 0
        assert vs.upsert("i0", [("a", [1.0], None)], Quota(names, 1 << 20, "o")) == 1
        assert vs.held(names) == 4
    finally:
        vs.close()
    reopened = VectorStore(tmp_path / "v", sync=False)  # and a restart loads them all
    try:
        assert len(reopened.names()) == MAX_INDEXES
    finally:
        reopened.close()
