"""Vector indexes shared by several processes (a PoP's workers): two `VectorStore`s
on one directory, this process's and a peer's (`tests/kv/vector_peer.py`). A write
in one is seen by the other's next query; keys are never reused, also by writers
running at once; a reader behind a trimmed log reloads the saved file; random
interleavings end in the state a plain dict predicts; threads of one process
writing and querying at once apply each entry once."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kv.vectors
from tests.kv import vector_peer

ROOT = Path(__file__).resolve().parents[2]
DIM = 4
IDS = [f"doc{i}" for i in range(10)]
ORIGIN = [0.0] * DIM


class Peer:
    """The store in another process."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.kv.vector_peer"], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def call(self, op: str, *args: Any) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([op, *args]) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply["ok"]

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        assert self.proc.wait(30) == 0
        self.proc.stdout.close()


class Local:
    """The store in this process, with the peer's operations (and its JSON)."""

    def call(self, op: str, *args: Any) -> Any:
        return json.loads(json.dumps(vector_peer.run(op, json.loads(json.dumps(args)))))

    def store(self) -> kv.vectors.VectorStore:
        assert vector_peer.store is not None
        return vector_peer.store


@pytest.fixture(scope="module")
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.close()


@pytest.fixture
def sides(peer: Peer, tmp_path: Path) -> Iterator[tuple[Local, Peer]]:
    """This process's store and the peer's, both open on `tmp_path`."""
    local = Local()
    peer.call("open", str(tmp_path))
    local.call("open", str(tmp_path))
    yield local, peer
    local.call("close")
    peer.call("close")


def contents(side: Local | Peer) -> dict[str, tuple[float, dict[str, Any] | None]]:
    """Every id in `side`'s index, by an exact query from the origin: its squared
    length and metadata (so a replaced vector or metadata shows)."""
    return {i: (round(d, 3), m) for i, d, m in side.call("query", "v", ORIGIN, len(IDS) + 5)}


def model_contents(model: dict[str, tuple[list[float], dict[str, Any]]]) -> dict[str, Any]:
    return {i: (round(sum(x * x for x in v), 3), m) for i, (v, m) in model.items()}


def check_keys(side: Local | Peer, seen: dict[str, int]) -> None:
    """No two ids share a key, and an id that got a key since `seen` (updated here)
    got one above every key seen before."""
    keys = side.call("keys", "v")
    assert len(set(keys.values())) == len(keys), f"a key is shared: {keys}"
    top = max(seen.values(), default=0)
    for id_, key in keys.items():
        if seen.get(id_) != key:
            assert key > top, f"{id_} got key {key}, not above the {top} seen before"
    seen.update(keys)


def test_each_process_sees_the_other_ones_writes_at_once(
        sides: tuple[Local, Peer], rand: random.Random) -> None:
    local, peer = sides
    peer.call("create", "v", DIM, "l2")  # the local store opens it on first use
    model: dict[str, tuple[list[float], dict[str, Any]]] = {}
    seen: dict[str, int] = {}
    for step in range(60):
        writer, reader = (local, peer) if rand.random() < 0.5 else (peer, local)
        if rand.random() < 0.7:
            items = [(i, [float(rand.randint(-5, 5)) for _ in range(DIM)], {"step": step})
                     for i in rand.sample(IDS, rand.randint(1, 3))]
            assert writer.call("upsert", "v", items) == len(items)
            model.update((i, (v, m)) for i, v, m in items)
        else:
            ids = rand.sample(IDS, 2)
            assert writer.call("delete", "v", ids) == sum(i in model for i in ids)
            for i in ids:
                model.pop(i, None)
        assert contents(reader) == model_contents(model), f"step {step}"
        check_keys(reader, seen)
    assert contents(local) == contents(peer) == model_contents(model)
    stats = [side.call("stats", "v") for side in sides]
    assert stats[0]["seq"] == stats[1]["seq"] > 60
    assert all(s["count"] == s["indexed"] == len(model) for s in stats)


def test_a_write_from_a_process_that_has_not_looked_since_gets_fresh_keys(
        sides: tuple[Local, Peer]) -> None:
    local, peer = sides
    peer.call("create", "v", DIM, "l2")
    assert local.call("stats", "v")["seq"] == 0  # local has the index open, at 0
    peer.call("upsert", "v", [["a", [1, 0, 0, 0], None], ["b", [0, 1, 0, 0], None]])
    local.call("upsert", "v", [["c", [0, 0, 1, 0], None]])  # no query in between
    assert local.call("keys", "v") == {"a": 1, "b": 2, "c": 3}
    assert set(contents(peer)) == set(contents(local)) == {"a", "b", "c"}
    assert local.call("stats", "v")["seq"] == peer.call("stats", "v")["seq"] == 3


def test_a_reader_behind_a_trimmed_log_reloads_the_saved_file(
        sides: tuple[Local, Peer]) -> None:
    local, peer = sides
    peer.call("create", "v", DIM, "l2")
    peer.call("upsert", "v", [["a", [1, 0, 0, 0], None], ["b", [0, 2, 0, 0], None]])
    assert set(contents(local)) == {"a", "b"}  # local has applied seq 2
    peer.call("upsert", "v", [["c", [0, 0, 3, 0], None], ["d", [0, 0, 0, 4], None]])
    peer.call("delete", "v", ["a"])
    peer.call("save", "v")  # the log is trimmed up to 5: local's copy is behind it
    store = local.store()
    with store.env.begin() as txn:  # the log both see, trimmed
        assert txn.stat(store._open["v"].log)["entries"] == 0
    assert contents(local) == {"b": (4.0, None), "c": (9.0, None), "d": (16.0, None)}
    assert local.call("stats", "v")["saved_seq"] == 5  # loaded from the file
    peer.call("upsert", "v", [["e", [1, 1, 0, 0], None]])  # and replays on from there
    assert set(contents(local)) == {"b", "c", "d", "e"}


def test_writers_running_at_once_never_reuse_a_key(
        tmp_path: Path, peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three processes upsert 150 ids each at the same time (after two of them
    created the index again), saving and trimming the log every 40 entries; every
    process then finds all 455."""
    default = kv.vectors.SAVE_EVERY
    monkeypatch.setattr(kv.vectors, "SAVE_EVERY", 40)
    others = [peer, Peer()]
    local = Local()
    try:
        for p in others:
            p.call("save_every", 40)
            p.call("open", str(tmp_path))
        local.call("open", str(tmp_path))
        local.call("create", "v", 8, "l2")
        vector_peer.fill(local.store(), "v", "k", 5, 8)
        for p, prefix in zip(others, ("p", "q"), strict=True):
            p.call("create", "v", 8, "l2")  # as each worker's first upsert does: a no-op
            assert p.proc.stdin is not None
            p.proc.stdin.write(json.dumps(["fill", "v", prefix, 150, 8]) + "\n")
            p.proc.stdin.flush()
        vector_peer.fill(local.store(), "v", "l", 150, 8)
        for p in others:
            assert p.proc.stdout is not None
            assert json.loads(p.proc.stdout.readline()) == {"ok": None}
        sides: list[Local | Peer] = [local, *others]
        for side in sides:
            keys = side.call("keys", "v")
            assert len(keys) == len(set(keys.values())) == 455
            for prefix in "lpq":
                for i in range(0, 150, 7):
                    v = vector_peer.vector(prefix, i, 8)
                    assert side.call("query", "v", v, 1)[0][:1] == [f"{prefix}{i}"]
            assert side.call("stats", "v")["indexed"] == 455
        with local.store().env.begin() as txn:  # saves trimmed the log as they ran
            assert txn.stat(local.store()._open["v"].log)["entries"] < 40
    finally:
        for p in others:
            p.call("save_every", default)
            p.call("close")
        others[1].close()
        local.call("close")


OPS = st.one_of(
    st.tuples(st.just("upsert"), st.lists(
        st.tuples(st.sampled_from(IDS), st.lists(st.integers(-4, 4), min_size=DIM,
                                                 max_size=DIM), st.sampled_from("xy")),
        min_size=1, max_size=3, unique_by=lambda t: t[0])),
    st.tuples(st.just("delete"), st.lists(st.sampled_from(IDS), max_size=2, unique=True)),
    st.tuples(st.just("save"), st.none()),
    st.tuples(st.just("reopen"), st.none()))


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.booleans(), OPS, st.booleans()), min_size=1, max_size=20))
def test_random_interleavings_end_in_the_model_state(
        peer: Peer, steps: list[tuple[bool, tuple[str, Any], bool]]) -> None:
    """Each step runs on one side; the other side looks (a query) only sometimes, so
    it falls behind saves that trim the log."""
    with tempfile.TemporaryDirectory() as tmp:
        sides = (Local(), peer)
        for side in sides:
            side.call("open", tmp)
        try:
            sides[0].call("create", "v", DIM, "l2")
            sides[1].call("stats", "v")  # the peer has it open from here on
            model: dict[str, tuple[list[float], dict[str, Any]]] = {}
            for on_peer, (op, arg), look in steps:
                apply(sides[on_peer], op, arg, model, tmp)
                if look:
                    assert contents(sides[not on_peer]) == model_contents(model)
            assert contents(sides[0]) == contents(sides[1]) == model_contents(model)
        finally:
            for side in sides:
                side.call("close")


def apply(side: Local | Peer, op: str, arg: Any,
          model: dict[str, tuple[list[float], dict[str, Any]]], path: str) -> None:
    """One step on `side` and on the model."""
    match op:
        case "upsert":
            side.call("upsert", "v", [(i, [float(x) for x in v], {"t": t}) for i, v, t in arg])
            model.update((i, ([float(x) for x in v], {"t": t})) for i, v, t in arg)
        case "delete":
            side.call("delete", "v", arg)
            for i in arg:
                model.pop(i, None)
        case "save":
            side.call("save", "v")
        case "reopen":
            side.call("close")
            side.call("open", path)


def test_threads_writing_and_querying_at_once_keep_one_copy(tmp_path: Path) -> None:
    """Writes run on worker threads in a PoP: each catches the copy up after its
    commit, one thread at a time, so no entry is applied twice or missed."""

    with kv.vectors.VectorStore(tmp_path, sync=False) as vs:
        vs.create("v", 8, "l2")

        def write(prefix: str) -> None:
            for i in range(60):
                vs.upsert("v", [(f"{prefix}{i}", vector_peer.vector(prefix, i, 8), None)])
                if i % 5 == 4:
                    vs.delete("v", [f"{prefix}{i - 2}"])

        threads = [threading.Thread(target=write, args=(p,)) for p in "abcd"]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            vs.query("v", [0.0] * 8, 5)
        for t in threads:
            t.join()
        stats = vs.stats("v")
        assert stats["count"] == stats["indexed"] == 4 * (60 - 12)
        for p in "abcd":
            for i in range(60):
                (hit,) = vs.query("v", vector_peer.vector(p, i, 8), 1, exact=True)
                assert (hit.id == f"{p}{i}") == (i % 5 != 2)  # every i % 5 == 2 was deleted
