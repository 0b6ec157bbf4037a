"""Two-phase deploys and canaries on one registry, without sockets (real wasmtime,
real deploy store): stage routes nothing, activate switches, abort leaves nothing,
a canary splits by key, promote and rollback end it, a restart restores it."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from edgefn_core.errors import DeployError, InvalidConfig, NotFound, RouteConflict
from runtime.bindings import Stores
from runtime.executors.wasm.engine import WasmEngine
from runtime.functions import canary, deploys
from runtime.functions.registry import Registry
from runtime.net.message import Request
from runtime.pipeline.stage import Context
from runtime.pipeline.targets import Targets
from tests.support import function_dir, reactor


def run[T](coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def package(root: Path, rev: int, routes: list[str] | None = None, name: str = "f"
            ) -> deploys.Files:
    """A function `name` whose version differs by `rev` (a manifest comment)."""
    d = function_dir(root / f"r{rev}", name, reactor(""), routes=routes or [f"/{name}"],
                     extra=f"# rev {rev}")
    return deploys.pack_dir(d)


def served(registry: Registry, key: str, path: bytes = b"/f") -> str:
    """The version a request with canary key `key` resolves to."""
    req = Request(b"GET", path, b"", [(canary.HEADER, key.encode())], b"h", "1.1", True,
                  "127.0.0.1:9")
    target = Targets(registry).resolve(req, Context("127.0.0.1:9"))
    assert target is not None
    return target.version  # type: ignore[attr-defined, no-any-return]


def test_a_staged_version_is_stored_and_warm_but_not_routed(registry: Registry,
                                                            tmp_path: Path) -> None:
    v1 = run(registry.deploy(package(tmp_path, 1))).version
    staged = run(registry.stage(package(tmp_path, 2)))
    assert (staged.previous, staged.changed) == (v1, True)
    assert served(registry, "k") == v1 and registry.store.record("f").current == v1
    assert registry.store.version_dir("f", staged.version).is_dir()
    assert list(registry.staged) == [("f", staged.version)]


def test_activate_switches_and_records(registry: Registry, tmp_path: Path) -> None:
    v1 = run(registry.deploy(package(tmp_path, 1))).version
    v2 = run(registry.stage(package(tmp_path, 2))).version
    done = run(registry.activate("f", v2))
    assert (done.previous, done.changed, done.canary) == (v1, True, None)
    assert served(registry, "k") == v2 and registry.store.record("f").current == v2
    assert registry.staged == {}
    assert run(registry.activate("f", v2)).changed is False  # again: nothing to do


def test_abort_leaves_nothing_of_the_staged_version(registry: Registry, tmp_path: Path) -> None:
    v1 = run(registry.deploy(package(tmp_path, 1))).version
    v2 = run(registry.stage(package(tmp_path, 2))).version
    assert run(registry.abort("f", v2)) is True
    assert not registry.store.version_dir("f", v2).exists()
    assert registry.store.record("f").current == v1 and served(registry, "k") == v1
    assert run(registry.abort("f", v2)) is False
    with pytest.raises(NotFound, match=r"f@\w+ is not staged on this PoP"):
        run(registry.activate("f", v2))


def test_a_stage_that_conflicts_stages_nothing(registry: Registry, tmp_path: Path) -> None:
    run(registry.deploy(package(tmp_path, 1, ["/taken"], name="g")))
    files = package(tmp_path, 2, ["/f", "/taken"])
    with pytest.raises(RouteConflict):
        run(registry.stage(files))
    assert registry.staged == {}
    assert not (registry.store.versions_dir / "f").exists()


def test_staging_the_live_version_changes_nothing(registry: Registry, tmp_path: Path) -> None:
    v1 = run(registry.deploy(package(tmp_path, 1))).version
    again = run(registry.stage(package(tmp_path, 1)))
    assert (again.version, again.changed, registry.staged) == (v1, False, {})


def canary_of(registry: Registry, tmp_path: Path, percent: float = 10.0) -> tuple[str, str]:
    v1 = run(registry.deploy(package(tmp_path, 1))).version
    v2 = run(registry.stage(package(tmp_path, 2))).version
    run(registry.activate("f", v2, percent))
    return v1, v2


def test_a_canary_serves_its_share_of_keys_sticky(registry: Registry, tmp_path: Path) -> None:
    v1, v2 = canary_of(registry, tmp_path)
    first = {k: served(registry, f"user-{k}") for k in range(1000)}
    assert set(first.values()) == {v1, v2}
    assert abs(sum(v == v2 for v in first.values()) / 10 - 10) <= 3
    assert all(served(registry, f"user-{k}") == v for k, v in first.items())
    record = registry.store.record("f")
    assert (record.current, record.canary) == (v1, deploys.CanaryInfo(v2, 10.0))
    assert registry.listing()[0]["canary"] == {"version": v2, "percent": 10.0}


def test_promote_makes_the_canary_live(registry: Registry, tmp_path: Path) -> None:
    _, v2 = canary_of(registry, tmp_path)
    assert run(registry.promote("f")).version == v2
    assert {served(registry, f"user-{k}") for k in range(200)} == {v2}
    record = registry.store.record("f")
    assert (record.current, record.canary, registry.canaries) == (v2, None, {})
    assert record.history[-1].action == "promote"


def test_rollback_during_a_canary_drops_it(registry: Registry, tmp_path: Path) -> None:
    v1, v2 = canary_of(registry, tmp_path)
    assert run(registry.rollback("f")).version == v1
    assert {served(registry, f"user-{k}") for k in range(200)} == {v1}
    record = registry.store.record("f")
    assert (record.current, record.canary) == (v1, None)
    assert v2 in {v.version for v in record.versions}  # still stored: it can be tried again


def test_a_canary_needs_a_live_version_with_the_same_routes(registry: Registry,
                                                            tmp_path: Path) -> None:
    run(registry.deploy(package(tmp_path, 1)))
    v2 = run(registry.stage(package(tmp_path, 2, ["/f", "/f2"]))).version
    with pytest.raises(DeployError, match="a canary must serve the same routes"):
        run(registry.activate("f", v2, 10.0))
    assert registry.canaries == {} and ("f", v2) in registry.staged
    with pytest.raises(InvalidConfig, match="strictly between 0% and 100%"):
        run(registry.activate("f", v2, 100.0))
    g = run(registry.stage(package(tmp_path, 3, name="g"))).version
    with pytest.raises(DeployError, match="g has no live version for a canary"):
        run(registry.activate("g", g, 10.0))


def test_the_live_version_is_no_canary_beside_another(registry: Registry,
                                                      tmp_path: Path) -> None:
    """Staged again while a canary ran, the live version became a canary of itself
    (`versions` showed it live and a canary; `promote` promoted it onto itself)."""
    v1, v2 = canary_of(registry, tmp_path)
    again = run(registry.stage(package(tmp_path, 1)))
    assert again.version == v1
    with pytest.raises(DeployError, match=f"f@{v1} is already the live version"):
        run(registry.activate("f", v1, 20.0))
    assert registry.canaries["f"].fn.version == v2
    assert registry.store.record("f").canary == deploys.CanaryInfo(v2, 10.0)


def test_promote_needs_a_canary(registry: Registry, tmp_path: Path) -> None:
    run(registry.deploy(package(tmp_path, 1)))
    with pytest.raises(DeployError, match="f has no canary to promote"):
        run(registry.promote("f"))
    with pytest.raises(NotFound, match="no function named 'nope' is deployed"):
        run(registry.promote("nope"))


def test_a_restart_serves_the_canary_again(tmp_path: Path, wasm: WasmEngine) -> None:
    data = tmp_path / "data"
    stores = Stores(data)
    first = Registry(data, wasm, stores)
    _, v2 = canary_of(first, tmp_path, 25.0)
    before = {k: served(first, f"user-{k}") for k in range(300)}
    first.close()
    again = Registry(data, wasm, stores)
    try:
        assert run(_restore(again)) == []
        assert again.listing()[0]["canary"] == {"version": v2, "percent": 25.0}
        assert {k: served(again, f"user-{k}") for k in range(300)} == before
    finally:
        again.close()
        stores.close()


async def _restore(registry: Registry) -> list[str]:
    return registry.restore()  # on a loop, as a PoP restores before it listens
