"""Who owns KV namespaces and vector indexes: claims, grants and refusals, through a
`Registry` with real wasmtime and LMDB (no sockets) and the bindings it prepares."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefn_core.errors import BindingError, Failure, NotOwner, RouteConflict
from runtime.bindings import Bindings, Stores
from runtime.bindings.owners import Owners
from runtime.executors.wasm.engine import WasmEngine
from runtime.functions import deploys, manifest
from runtime.functions.registry import DeployResult, Registry
from tests.support import function_dir, reactor


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def registry(data: Path, tmp_path: Path) -> Iterator[Registry]:
    wasm = WasmEngine(data / "cache")
    stores = Stores(data)
    r = Registry(data, wasm, stores)
    yield r
    r.close()
    stores.close()
    wasm.close()


def fn(root: Path, name: str, bindings: str, owner: str | None = None,
       routes: list[str] | None = None) -> Path:
    """A do-nothing reactor `name` with `bindings` (the body of its [bindings] table)."""
    top = f'owner = "{owner}"\n' if owner else ""
    d = function_dir(root / name, name, reactor(""), routes=routes)
    text = (d / "edgefn.toml").read_text()
    head, limits = text.split("[limits]")
    (d / "edgefn.toml").write_text(f"{head}{top}[bindings]\n{bindings}\n[limits]{limits}")
    return d


def deploy(registry: Registry, d: Path) -> DeployResult:
    return asyncio.run(registry.deploy(deploys.pack_dir(d), str(d)))


def refused(registry: Registry, d: Path) -> NotOwner:
    with pytest.raises(NotOwner) as err:
        deploy(registry, d)
    assert (err.value.code, err.value.status) == ("not_owner", 403)
    return err.value


def binding(registry: Registry, d: Path) -> Bindings:
    """The bindings a deployment of `d` gets (what its host calls go through)."""
    return Bindings.prepare(registry.stores, manifest.load(d), create=False)


def test_the_first_function_claims_and_another_owner_is_refused(registry: Registry,
                                                                tmp_path: Path) -> None:
    deploy(registry, fn(tmp_path, "victim", 'kv = ["secret"]\nvectors = ["docs"]'))
    assert registry.stores.owners.owner("kv", "secret") == "victim"
    thief = fn(tmp_path, "thief", 'kv = ["mine", "secret"]')
    err = refused(registry, thief)
    assert str(err) == (
        f"{thief}/edgefn.toml: field `bindings.kv`: KV namespace 'secret' belongs to owner "
        "'victim' and is not shared with 'thief'; bind another name, or have its owner grant it "
        '([bindings.share.kv] secret = { read = ["thief"] })')
    err = refused(registry, fn(tmp_path / "2", "thief", 'vectors = ["docs"]', owner="acme"))
    assert "field `bindings.vectors`: vector index 'docs' belongs to owner 'victim' and is " \
           "not shared with 'acme'" in str(err)
    assert "thief" not in registry.functions and "mine" not in registry.stores.kv.namespaces()
    assert registry.stores.owners.owner("kv", "mine") is None  # a refused deploy claims nothing


def test_functions_of_one_owner_share_their_names(registry: Registry, tmp_path: Path) -> None:
    deploy(registry, fn(tmp_path, "a", 'kv = ["n"]', owner="acme"))
    deploy(registry, fn(tmp_path, "b", 'kv = ["n"]', owner="acme"))
    assert registry.stores.owners.owner("kv", "n") == "acme"
    refused(registry, fn(tmp_path / "2", "c", 'kv = ["n"]'))  # owner: its own name, "c"


def test_a_grant_lets_another_owner_read_or_write(registry: Registry, tmp_path: Path) -> None:
    owner = fn(tmp_path, "owner", 'kv = ["n"]\n[bindings.share.kv]\nn = { read = ["r"], '
               'write = ["w"] }')
    deploy(registry, owner)
    reader, writer = fn(tmp_path, "r", 'kv = ["n"]'), fn(tmp_path, "w", 'kv = ["n"]')
    deploy(registry, reader)
    deploy(registry, writer)
    registry.stores.kv.put("n", b"k", b"v")
    put = {"namespace": "n", "key": "k", "value": "eA=="}
    assert binding(registry, reader).call("kv.get", {"namespace": "n", "key": "k"})["value"] \
        == "dg=="
    with pytest.raises(BindingError) as err:
        binding(registry, reader).call("kv.put", put)
    assert str(err.value) == "KV namespace 'n' of owner 'owner' is shared with 'r' read-only"
    binding(registry, writer).call("kv.put", put)
    assert registry.stores.kv.get("n", b"k") == b"x"
    assert registry.stores.owners.owner("kv", "n") == "owner"  # binding it claims nothing


def test_a_withdrawn_grant_stops_the_other_function_at_once(registry: Registry,
                                                           tmp_path: Path) -> None:
    deploy(registry, fn(tmp_path, "owner", 'vectors = ["v"]\n[bindings.share.vectors]\n'
                        'v = { write = ["other"] }'))
    other = fn(tmp_path, "other", 'vectors = ["v"]')
    deploy(registry, other)
    live = binding(registry, other)
    upsert = {"index": "v", "items": [{"id": "a", "vector": [1.0, 0.0]}]}
    assert live.call("vectors.upsert", upsert) == 1
    deploy(registry, fn(tmp_path / "2", "owner", 'vectors = ["v"]'))  # a new version, no grant
    with pytest.raises(BindingError) as err:
        live.call("vectors.query", {"index": "v", "vector": [1.0, 0.0]})
    assert str(err.value) == "vector index 'v' belongs to owner 'owner' and is not shared with " \
                             "'other'"
    refused(registry, fn(tmp_path / "2", "other", 'vectors = ["v"]\nai = false'))


def test_grants_count_while_their_function_is_deployed(registry: Registry,
                                                       tmp_path: Path) -> None:
    deploy(registry, fn(tmp_path, "o1", 'kv = ["n"]\n[bindings.share.kv]\nn = { read = ["x"] }',
                        owner="acme"))
    deploy(registry, fn(tmp_path, "o2", 'kv = ["n"]', owner="acme"))
    deploy(registry, fn(tmp_path, "x", 'kv = ["n"]'))
    asyncio.run(registry.delete("o1"))
    owners = registry.stores.owners
    assert (owners.owner("kv", "n"), owners.access("kv", "n", "x")) == ("acme", None)
    asyncio.run(registry.delete("o2"))  # the data stays, and so does its owner
    assert owners.owner("kv", "n") == "acme"
    refused(registry, fn(tmp_path / "2", "y", 'kv = ["n"]'))


def test_only_the_owner_may_share(registry: Registry, tmp_path: Path) -> None:
    deploy(registry, fn(tmp_path, "owner", 'kv = ["n"]\n[bindings.share.kv]\nn = { read = '
                        '["guest"] }'))
    guest = fn(tmp_path, "guest", 'kv = ["n"]\n[bindings.share.kv]\nn = { write = ["pal"] }')
    assert str(refused(registry, guest)) == (
        f"{guest}/edgefn.toml: field `bindings.share.kv.n`: KV namespace 'n' belongs to owner "
        "'owner'; only its owner may share it")


def test_claims_survive_a_restart_and_restore_checks_them(data: Path, tmp_path: Path,
                                                          registry: Registry) -> None:
    deploy(registry, fn(tmp_path, "z", 'kv = ["n"]\n[bindings.share.kv]\nn = { read = ["b"] }'))
    deploy(registry, fn(tmp_path, "b", 'kv = ["n"]'))
    deploy(registry, fn(tmp_path, "y", 'kv = ["m"]\n[bindings.share.kv]\nm = { read = ["c"] }'))
    deploy(registry, fn(tmp_path, "c", 'kv = ["m"]'))
    deploy(registry, fn(tmp_path / "2", "y", 'kv = ["m"]'))  # withdraws c's grant
    registry.close()
    registry.stores.close()  # the fixture closes them again: a no-op
    claims = json.loads((data / "owners.json").read_bytes())
    assert claims["kv"] == {"n": {"owner": "z", "shares": {"z": {"b": "read"}}},
                            "m": {"owner": "y"}}
    del claims["kv"]["n"]["shares"]  # a claims file that lost z's grant: z's restore makes it
    (data / "owners.json").write_text(json.dumps(claims))
    wasm, stores = WasmEngine(data / "cache"), Stores(data)
    second = Registry(data, wasm, stores)
    try:
        errors = second.restore()
        assert sorted(second.functions) == ["b", "y", "z"]  # b once z had loaded
        assert len(errors) == 1 and errors[0].startswith("c: ") and \
            "KV namespace 'm' belongs to owner 'y' and is not shared with 'c'" in errors[0]
    finally:
        second.close()
        stores.close()
        wasm.close()


def test_a_rollback_is_checked_like_a_deploy(registry: Registry, tmp_path: Path) -> None:
    deploy(registry, fn(tmp_path, "o", 'kv = ["n"]\n[bindings.share.kv]\nn = { read = ["f"] }'))
    v1 = deploy(registry, fn(tmp_path, "f", 'kv = ["n"]'))
    deploy(registry, fn(tmp_path / "2", "f", "kv = []"))
    deploy(registry, fn(tmp_path / "2", "o", 'kv = ["n"]'))  # the grant is withdrawn
    with pytest.raises(NotOwner) as err:
        asyncio.run(registry.rollback("f", v1.version))
    assert "KV namespace 'n' belongs to owner 'o' and is not shared with 'f'" in str(err.value)
    assert registry.functions["f"].version != v1.version


def test_a_deploy_that_fails_late_claims_and_creates_nothing(registry: Registry,
                                                             tmp_path: Path, data: Path) -> None:
    deploy(registry, fn(tmp_path, "a", "kv = []", routes=["/same"]))
    before = sorted(p.relative_to(data) for p in data.rglob("*"))
    with pytest.raises(RouteConflict):
        deploy(registry, fn(tmp_path, "b", 'kv = ["n"]\nvectors = ["v"]', routes=["/same"]))
    assert registry.stores.owners.owner("kv", "n") is None
    assert "n" not in registry.stores.kv.namespaces()
    after = sorted(p.relative_to(data) for p in data.rglob("*"))
    assert [p for p in after if not str(p).startswith("kv")] == \
           [p for p in before if not str(p).startswith("kv")]



def test_a_deploy_past_the_namespace_limit_is_refused_before_anything_is_saved(
        registry: Registry, tmp_path: Path, data: Path) -> None:
    """It failed after saving its record (a 500), left its namespaces created and the
    limit used up for every other tenant's next deploy."""
    from edgefn_core.errors import LimitExceeded

    limit = registry.stores.kv.max_namespaces
    names = ", ".join(f'"n{i}"' for i in range(limit + 4))
    with pytest.raises(LimitExceeded, match=f"at most {limit} namespaces and has 0"):
        deploy(registry, fn(tmp_path, "greedy", f"kv = [{names}]"))
    assert registry.stores.kv.namespaces() == [] and registry.store.records() == []
    deploy(registry, fn(tmp_path, "fits", 'kv = ["a", "b"]'))  # the limit is untouched
    assert registry.stores.kv.namespaces() == ["a", "b"]



def test_an_owner_holds_at_most_its_kv_quota_across_its_namespaces(
        registry: Registry, tmp_path: Path) -> None:
    """The KV store is shared: one tenant's function filled it (MDB_MAP_FULL) and every
    tenant's next write failed."""
    from edgefn_core.errors import LimitExceeded

    registry.stores.kv_quota = 10_000
    a = fn(tmp_path, "a", 'kv = ["a1", "a2"]', owner="acme")
    b = fn(tmp_path, "b", 'kv = ["b1"]', owner="beta")
    deploy(registry, a)
    deploy(registry, b)
    ka, kb = binding(registry, a).kv.store, binding(registry, b).kv.store
    ka.put("a1", b"k1", b"x" * 6000)
    assert registry.stores.kv.usage(["a1"]) == 2 + 20 + 6000  # key, record head, value
    with pytest.raises(LimitExceeded, match="owner 'acme' hold 6022 bytes; 6022 more would "
                                            "pass its quota of 10000 bytes"):
        ka.put("a2", b"k2", b"x" * 6000)  # both namespaces count
    assert ka.get("a2", b"k2") is None
    kb.put("b1", b"k", b"x" * 6000)  # another owner's quota is its own
    ka.put("a1", b"k1", b"x" * 100)  # a smaller value: room again
    ka.put("a2", b"k2", b"x" * 3000)
    assert registry.stores.kv.usage(["a1", "a2"]) == (22 + 100) + (22 + 3000)
    ka.delete("a1", b"k1")
    assert registry.stores.kv.usage(["a1"]) == 0
    registry.stores.kv.put("a1", b"big", b"x" * 20_000)  # the operator is not held to it
    with pytest.raises(LimitExceeded):
        ka.increment("a2", b"n")


def test_at_its_quota_an_owner_may_shrink_a_value_but_not_grow_one(
        registry: Registry, tmp_path: Path) -> None:
    """An overwrite counted its whole value as added: a function at its quota could
    not shrink a value (only delete first); and a value past the 16 MiB limit was
    said to pass the quota."""
    from edgefn_core.errors import InvalidValue, LimitExceeded

    registry.stores.kv_quota = 10_000
    a = fn(tmp_path, "a", 'kv = ["a1"]', owner="acme")
    deploy(registry, a)
    ka = binding(registry, a).kv.store
    ka.put("a1", b"k1", b"x" * 6000)
    ka.put("a1", b"k2", b"x" * 3900)  # 9944 held
    ka.put("a1", b"k1", b"y" * 5000)  # shrinks it: no room needed
    assert ka.get("a1", b"k1") == b"y" * 5000
    ka.put("a1", b"k1", b"z" * 5020)  # 20 bytes more: 8964 held
    with pytest.raises(LimitExceeded, match="owner 'acme' hold 8964 bytes; 1080 more would "
                                            "pass its quota"):
        ka.put("a1", b"k1", b"z" * 6100)  # (2 + 20 + 6100) - (2 + 20 + 5020): key, head, value
    ka.put("a1", b"k1", b"z" * 6000)
    assert ka.cas("a1", b"k2", ka.get_entry("a1", b"k2").version, b"w") is not None
    assert ka.increment("a1", b"n") == 1 and ka.increment("a1", b"n") == 2  # in place
    with pytest.raises(LimitExceeded, match="exceeds the limit of 16777216 bytes"):
        ka.put("a1", b"k1", b"x" * ((16 << 20) + 1))
    with pytest.raises(InvalidValue, match="key of 0 bytes"):
        ka.put("a1", b"", b"x")


def test_a_write_waiting_on_another_is_held_to_the_quota_that_one_left(
        registry: Registry, tmp_path: Path) -> None:
    """The quota was read in a transaction of its own: writers arriving together all
    passed it, then wrote one after another (30 parallel puts took an owner 130 KB
    past a 2 MB quota). Here a write waits on another holding LMDB's write lock."""
    from edgefn_core.errors import LimitExceeded

    registry.stores.kv_quota = 10_000
    a = fn(tmp_path, "a", 'kv = ["a1"]', owner="acme")
    deploy(registry, a)
    ka = binding(registry, a).kv.store
    failed: list[BaseException] = []

    def second() -> None:
        try:
            ka.put("a1", b"k2", b"x" * 4000)
        except BaseException as e:
            failed.append(e)

    kv = registry.stores.kv
    with kv._write() as w:  # the first write, of 6000 bytes, holds the write lock
        w.put("a1", b"k1", b"x" * 6000)
        waiting = threading.Thread(target=second)
        waiting.start()
        waiting.join(0.3)  # checked and blocked on the lock (before: checked 0 bytes used)
        assert waiting.is_alive()
    waiting.join(5)
    assert len(failed) == 1 and isinstance(failed[0], LimitExceeded), failed
    assert "hold 6022 bytes; 4022 more would pass its quota" in str(failed[0])
    assert kv.get("a1", b"k2") is None and kv.usage(["a1"]) == 6022


def test_an_owner_holds_at_most_its_vectors_quota_across_its_indexes(
        registry: Registry, tmp_path: Path) -> None:
    """Every index lives in the PoP's memory: one tenant's upserts could fill it for
    all (vectors had no quota; KV had)."""
    from edgefn_core.errors import BindingError

    registry.stores.vectors_quota = 100 * 4 * 4  # 100 vectors of 4 dimensions
    a = fn(tmp_path, "a", 'vectors = ["a1", "a2"]', owner="acme")
    b = fn(tmp_path, "b", 'vectors = ["b1"]', owner="beta")
    deploy(registry, a)
    deploy(registry, b)
    va, vb = binding(registry, a), binding(registry, b)

    def upsert(bindings: Bindings, index: str, n: int, start: int = 0) -> object:
        items = [{"id": f"v{i}", "vector": [1.0, float(i), 0.0, 0.5]}
                 for i in range(start, start + n)]
        return bindings.call("vectors.upsert", {"index": index, "items": items})

    assert upsert(va, "a1", 60) == 60
    with pytest.raises(BindingError, match=r"the vector indexes of owner 'acme' hold 960 "
                                           r"bytes of vectors; 960 more would pass its quota "
                                           r"of 1600 bytes"):
        upsert(va, "a2", 60)  # both indexes count
    assert "a2" not in registry.stores.vectors.names()  # refused before it was made
    assert upsert(vb, "b1", 100) == 100  # another owner's quota is its own
    assert upsert(va, "a2", 40) == 40  # what fits still does
    va.call("vectors.delete", {"index": "a1", "ids": [f"v{i}" for i in range(30)]})
    assert upsert(va, "a2", 30, start=40) == 30  # room again
    with pytest.raises(BindingError, match="hold 1600 bytes of vectors; 560 more"):
        upsert(va, "a1", 35, start=100)  # into an index that exists: checked as it writes
    assert registry.stores.vectors.stats("a1")["count"] == 30


def test_usage_is_counted_for_a_store_written_before_it_was_kept(tmp_path: Path) -> None:
    from kv import KVStore
    from kv.store import USAGE_DB

    with KVStore(tmp_path / "kv") as s:
        s.create_namespace("n")
        s.put("n", b"ab", b"xyz")
        s.put("n", b"c", b"")
        with s.env.begin(write=True) as txn:  # as an older edgefn left it: nothing counted
            txn.drop(s.env.open_db(USAGE_DB, txn=txn), delete=False)
    with KVStore(tmp_path / "kv") as s:
        assert s.usage(["n"]) == (2 + 20 + 3) + (1 + 20)


# -- Owners alone ----------------------------------------------------------------------------
def parse(text: str) -> manifest.Manifest:
    return manifest.parse(('name = "f"\nruntime = "wasm"\nentry = "m.wat"\nroutes = ["/f"]\n'
                           + text).encode(), "f/edgefn.toml")


def test_access_follows_owner_and_grants(tmp_path: Path) -> None:
    owners = Owners(tmp_path / "owners.json")
    assert owners.access("kv", "n", "anyone") == "write"  # unclaimed: whoever binds it claims it
    owners.commit(parse('owner = "o"\n[bindings]\nkv = ["n"]\nvectors = ["n"]\n'
                        '[bindings.share.kv]\nn = { read = ["r"], write = ["w"] }'))
    assert [owners.access("kv", "n", t) for t in ("o", "r", "w", "z")] == [
        "write", "read", "write", None]
    assert [owners.access("vectors", "n", t) for t in ("o", "r", "w")] == ["write", None, None]
    again = Owners(tmp_path / "owners.json")
    assert again.access("kv", "n", "r") == "read" and again.owner("vectors", "n") == "o"
    owners.forget("f")
    assert owners.access("kv", "n", "w") is None and Owners(tmp_path / "owners.json").access(
        "kv", "n", "w") is None


def test_a_corrupt_claims_file_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "owners.json").write_text('{"kv": {"n": {"owner": 3}}}')
    with pytest.raises(Failure) as err:
        Owners(tmp_path / "owners.json")
    assert (err.value.code, err.value.status) == ("owners_unreadable", 500)
    assert str(err.value) == (f"{tmp_path}/owners.json: cannot read who owns which KV namespace "
                              "and vector index (Expected `str`, got `int` - at `$.kv[...].owner`); "
                              "restore it from a backup")


def test_a_reload_moves_the_generation_native_readers_check(registry: Registry,
                                                            data: Path, tmp_path: Path) -> None:
    """A worker of ``workers = N`` re-reads grants another process saved; the C kv_get's
    table of readable namespaces is only refilled when the generation moves."""
    owners = registry.stores.owners
    other = Owners(owners.path)  # another worker's view of the same file
    before = other.generation.value
    deploy(registry, fn(tmp_path, "a", 'kv = ["ns"]'))
    other.reload()
    assert other.generation.value > before
    assert other.owner("kv", "ns") == owners.owner("kv", "ns") is not None



def _race_to_first_use(stores: object, n: int) -> tuple[list[object], list[BaseException]]:
    import threading

    start = threading.Barrier(n)
    got: list[object] = []
    errors: list[BaseException] = []

    def first_use(which: str) -> None:
        start.wait()
        try:
            got.append(getattr(stores, which))
        except BaseException as e:  # the race's error is the finding
            errors.append(e)

    threads = [threading.Thread(target=first_use, args=("kv" if i % 2 else "vectors",))
               for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert not any(t.is_alive() for t in threads)  # it also hung in open_db
    return got, errors


def test_the_stores_open_once_when_threads_race_to_first_use(tmp_path: Path) -> None:
    """WASM host calls and off-loop writes reach `Stores.kv` from several threads; two
    opening it at once got "already open in this process" (a 500) or hung."""
    from runtime.bindings import Stores

    for trial in range(5):
        stores = Stores(tmp_path / str(trial))
        got, errors = _race_to_first_use(stores, 6)
        assert errors == []
        assert len({id(s) for s in got}) == 2  # one KV store, one vector store
        stores.close()
