"""`Registry.follow` without processes (real wasmtime, real deploy store): a
second registry on the same data dir, as a worker of ``workers = N`` holds, serves
what the first one saved once told to follow, and nothing before."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.bindings import Stores
from runtime.executors.wasm.engine import WasmEngine
from runtime.functions import deploys
from runtime.functions.registry import Registry
from tests.support import function_dir, reactor
from tests.test_registry import RESERVED, registry, wasm  # noqa: F401


@pytest.fixture
def follower(tmp_path: Path, wasm: WasmEngine) -> Iterator[Registry]:  # noqa: F811
    """A registry on the leader's data dir (its own stores: one LMDB env a process)."""
    stores = Stores(tmp_path / "follower-stores")
    r = Registry(tmp_path / "data", wasm, stores, reserved=RESERVED)
    yield r
    r.close()
    stores.close()


def package(root: Path, rev: int) -> deploys.Files:
    d = function_dir(root / f"r{rev}", "f", reactor(""), extra=f"# rev {rev}")
    return deploys.pack_dir(d)


def live(r: Registry) -> str | None:
    fn = r.functions.get("f")
    return fn.version if fn is not None else None


def test_follow_switches_to_what_the_leader_saved(registry: Registry, follower: Registry,  # noqa: F811
                                                  tmp_path: Path) -> None:
    v1 = asyncio.run(registry.deploy(package(tmp_path, 1))).version
    assert follower.restore() == [] and live(follower) == v1
    v2 = asyncio.run(registry.deploy(package(tmp_path, 2))).version
    assert live(follower) == v1  # nothing changes until told
    assert asyncio.run(follower.follow()) == []
    assert live(follower) == v2
    assert follower.router.match(b"", b"/f") is not None
    asyncio.run(registry.rollback("f"))
    asyncio.run(follower.follow())
    assert live(follower) == v1


def test_follow_starts_and_ends_a_canary(registry: Registry, follower: Registry,  # noqa: F811
                                         tmp_path: Path) -> None:
    v1 = asyncio.run(registry.deploy(package(tmp_path, 1))).version
    follower.restore()
    v2 = asyncio.run(registry.stage(package(tmp_path, 2))).version
    asyncio.run(registry.activate("f", v2, canary=10))
    asyncio.run(follower.follow())
    split = follower.canaries["f"]
    assert (split.fn.version, split.percent, live(follower)) == (v2, 10, v1)
    asyncio.run(registry.promote("f"))
    asyncio.run(follower.follow())
    assert live(follower) == v2 and "f" not in follower.canaries


def test_follow_drops_a_canary_the_leader_dropped(registry: Registry,  # noqa: F811
                                                  follower: Registry, tmp_path: Path) -> None:
    v1 = asyncio.run(registry.deploy(package(tmp_path, 1))).version
    v2 = asyncio.run(registry.stage(package(tmp_path, 2))).version
    asyncio.run(registry.activate("f", v2, canary=25))
    follower.restore()
    assert follower.canaries["f"].fn.version == v2
    asyncio.run(registry.rollback("f"))  # during a canary: drops it, the live one stays
    asyncio.run(follower.follow())
    assert live(follower) == v1 and follower.canaries == {}


def test_follow_stops_serving_a_deleted_function(registry: Registry, follower: Registry,  # noqa: F811
                                                 tmp_path: Path) -> None:
    asyncio.run(registry.deploy(package(tmp_path, 1)))
    follower.restore()
    asyncio.run(registry.delete("f"))
    assert asyncio.run(follower.follow()) == []
    assert live(follower) is None and follower.router.match(b"", b"/f") is None


def test_a_version_that_no_longer_loads_is_reported(registry: Registry,  # noqa: F811
                                                    follower: Registry, tmp_path: Path) -> None:
    v1 = asyncio.run(registry.deploy(package(tmp_path, 1))).version
    follower.restore()
    v2 = asyncio.run(registry.deploy(package(tmp_path, 2))).version
    (registry.store.version_dir("f", v2) / "main.wat").write_text("(module)")  # tampered
    errors = asyncio.run(follower.follow())
    assert len(errors) == 1 and errors[0].startswith("f: ") and "main.wat" in errors[0]
    assert live(follower) == v1  # what it had: the admin worker then kills it


def test_follow_reads_the_grants_the_leader_saved(registry: Registry,  # noqa: F811
                                                  follower: Registry, tmp_path: Path) -> None:
    follower.stores.owners.path = registry.stores.owners.path  # one data dir's owners.json
    assert follower.stores.owners.owner("kv", "n") is None
    d = function_dir(tmp_path / "o", "o", reactor(""))
    text = (d / "edgefn.toml").read_text().replace("[limits]", '[bindings]\nkv = ["n"]\n'
                                                   '[bindings.share.kv]\nn = { read = ["r"] }'
                                                   "\n[limits]")
    (d / "edgefn.toml").write_text(text)
    asyncio.run(registry.deploy(deploys.pack_dir(d)))
    assert follower.stores.owners.owner("kv", "n") is None  # not read yet
    asyncio.run(follower.follow())
    assert follower.stores.owners.owner("kv", "n") == "o"
    assert follower.stores.owners.access("kv", "n", "r") == "read"


def test_a_version_that_did_not_load_is_tried_again_unreported(
        registry: Registry, follower: Registry, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """It was remembered as unserved for good: a worker whose load failed once (a
    flaky import) answered 404 for that function until another version came."""
    from runtime.functions import following

    v1 = asyncio.run(registry.deploy(package(tmp_path, 1))).version
    wat = registry.store.version_dir("f", v1) / "main.wat"
    good = wat.read_bytes()
    wat.write_text("(module)")  # fails at this worker's start
    assert len(follower.restore()) == 1 and live(follower) is None
    assert asyncio.run(follower.follow()) == [] and live(follower) is None  # too soon
    monkeypatch.setattr(following, "RETRY_UNSERVED_S", 0.0)
    assert asyncio.run(follower.follow()) == [] and live(follower) is None  # fails: unreported
    wat.write_bytes(good)
    assert asyncio.run(follower.follow()) == [] and live(follower) == v1
    assert follower.unserved == {} and follower.router.match(b"", b"/f") is not None

