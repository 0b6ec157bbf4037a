"""The registry without sockets: deploys straight into a `Registry` with real wasmtime
(reserved routes, labels in errors, what a switch retires, restore's errors)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefn_core.errors import (
    DeployError,
    FunctionError,
    ManifestError,
    NotFound,
    NotOwner,
    RouteConflict,
)
from runtime.bindings import Stores
from runtime.executors.wasm.engine import WasmEngine
from runtime.functions import deploys
from runtime.functions.registry import DeployResult, Registry
from tests.support import EXAMPLES, function_dir, own_records, reactor

RESERVED = frozenset({b"/v1/models", b"/v1/chat/completions"})


@pytest.fixture
def wasm(tmp_path: Path) -> Iterator[WasmEngine]:
    engine = WasmEngine(tmp_path / "cache")
    yield engine
    engine.close()


@pytest.fixture
def registry(tmp_path: Path, wasm: WasmEngine) -> Iterator[Registry]:
    stores = Stores(tmp_path / "data")
    r = Registry(tmp_path / "data", wasm, stores, reserved=RESERVED)
    yield r
    r.close()
    stores.close()


def deploy(registry: Registry, d: Path, source: str = "") -> DeployResult:
    return asyncio.run(registry.deploy(deploys.pack_dir(d), source))


def test_nothing_is_routed_before_a_deploy(registry: Registry) -> None:
    assert registry.router.match(b"localhost", b"/") is None and registry.listing() == []


@pytest.mark.parametrize(("routes", "index", "endpoint"), [
    (["/v1"], 0, "/v1/chat/completions"),
    (["/v1/models/"], 0, "/v1/models"),
    (["/", "/x", "/v1/"], 2, "/v1/chat/completions"),
])
def test_a_route_may_not_cover_a_built_in_endpoint(registry: Registry, tmp_path: Path,
                                                   routes: list[str], index: int,
                                                   endpoint: str) -> None:
    d = function_dir(tmp_path, "f", reactor(""), routes=routes)
    with pytest.raises(RouteConflict) as err:
        deploy(registry, d, "src/f")
    assert str(err.value) == (
        f"src/f/edgefn.toml: field `routes[{index}]`: route {routes[index]!r} would cover the "
        f"built-in endpoint {endpoint}; choose another path")
    assert (err.value.path, err.value.owner) == (routes[index], "<built-in>")
    assert registry.listing() == []


def test_routes_beside_the_built_in_endpoints_are_fine(registry: Registry,
                                                       tmp_path: Path) -> None:
    routes = ["/", "/v", "/v1/model", "/v1/models-old", "/x/v1/models", "/v1/modelsX"]
    deploy(registry, function_dir(tmp_path, "f", reactor(""), routes=routes))
    assert registry.router.match(b"h", b"/v1/models-old/a") is not None


def test_a_package_without_its_manifest_or_entry_is_named_in_the_error(
        registry: Registry, tmp_path: Path) -> None:
    d = function_dir(tmp_path, "f", reactor(""))
    files = deploys.pack_dir(d)
    missing = {k: v for k, v in files.items() if k != "edgefn.toml"}
    for source, label in (("", "<package>"), ("fns/f", "fns/f")):
        with pytest.raises(ManifestError) as err:
            asyncio.run(registry.deploy(missing, source))
        assert str(err.value) == (f"{label}/edgefn.toml: no such file: every function folder "
                                  "needs an edgefn.toml")
    without_entry = {k: v for k, v in files.items() if k != "main.wat"}
    with pytest.raises(ManifestError) as err:
        asyncio.run(registry.deploy(without_entry))
    assert str(err.value) == ("<package>/edgefn.toml: field `entry`: entry file 'main.wat' "
                              "is not in the package")
    assert err.value.field == "entry"
    (d / "edgefn.toml").write_text("name = 3\n")
    with pytest.raises(ManifestError) as err:
        deploy(registry, d, "fns/f")
    assert str(err.value).startswith("fns/f/edgefn.toml: field `name`: ")


def test_deploy_result_listing_and_record(registry: Registry, tmp_path: Path) -> None:
    b = deploy(registry, function_dir(tmp_path, "b", reactor("")), "src/b")
    a = deploy(registry, function_dir(tmp_path, "a", reactor(""), routes=["/a", "/aa"]), "src/a")
    assert (a.name, a.routes, a.changed, a.abi) == ("a", [{"path": "/a"}, {"path": "/aa"}],
                                                    True, "reactor")
    assert isinstance(a.took_ms, float) and a.took_ms > 0 and a.took_ms == round(a.took_ms, 2)
    assert registry.listing() == [
        {"name": "a", "version": a.version, "abi": "reactor",
         "routes": [{"path": "/a"}, {"path": "/aa"}]},
        {"name": "b", "version": b.version, "abi": "reactor", "routes": [{"path": "/b"}]}]
    record = registry.versions("a")
    assert (record.current, [(v.version, v.source) for v in record.versions]) == (
        a.version, [(a.version, "src/a")])
    assert [(e.version, e.action) for e in record.history] == [(a.version, "deploy")]
    v2 = deploy(registry, function_dir(tmp_path / "2", "a", reactor("nop")), "src/a2")
    assert [(v.version, v.source) for v in registry.versions("a").versions] == [
        (a.version, "src/a"), (v2.version, "src/a2")]
    again = deploy(registry, function_dir(tmp_path / "2", "a", reactor("nop")), "src/a2")
    assert again.changed is False
    rolled = asyncio.run(registry.rollback("a"))
    assert (rolled.version, rolled.changed) == (a.version, True)
    with pytest.raises(NotFound) as err:
        asyncio.run(registry.rollback("a", "deadbeef"))
    known = ", ".join(sorted([a.version, v2.version]))
    assert str(err.value) == f"a has no version 'deadbeef'; known: {known}"


def test_a_switch_retires_what_it_replaced_and_nothing_else(registry: Registry,
                                                            tmp_path: Path) -> None:
    deploy(registry, function_dir(tmp_path, "a", reactor("")))
    deploy(registry, function_dir(tmp_path, "b", reactor("")))
    retired: list[str] = []
    for fn in registry.functions.values():
        fn.executor.retire = lambda label=fn.label: retired.append(label)  # type: ignore[method-assign]
    old_a = registry.functions["a"].label
    deploy(registry, function_dir(tmp_path / "2", "a", reactor("nop")))
    assert retired == [old_a]
    old_b = registry.functions["b"].label
    asyncio.run(registry.delete("b"))
    assert retired == [old_a, old_b] and list(registry.functions) == ["a"]


def test_a_function_with_bindings_gets_them_from_the_stores(registry: Registry) -> None:
    result = deploy(registry, EXAMPLES / "counter-c")
    assert result.name == "counter-c"
    assert "counters" in registry.stores.kv.namespaces()  # created by its [bindings]


def test_function_failures_answer_with_the_function_and_the_reason(registry: Registry,
                                                                   tmp_path: Path) -> None:
    deploy(registry, function_dir(tmp_path, "f", reactor("")))
    fn = registry.functions["f"]
    response = fn.error_response(FunctionError("trap", 500, "trapped: unreachable"))
    assert response.status == 500
    assert response.headers[-2:] == [(b"x-edgefn-error", b"trap"),
                                     (b"x-edgefn-function", f"f@{fn.version}".encode())]
    assert json.loads(response.body) == {"error": {
        "kind": "trap", "function": "f", "version": fn.version,
        "message": "function 'f' trapped: unreachable"}}
    crash = fn.crashed(RuntimeError("boom"))
    assert (crash.code, crash.status, str(crash)) == (
        "crash", 502, "failed inside edgefn: RuntimeError('boom')")


def test_restore_skips_a_function_that_no_longer_loads_and_says_why(
        tmp_path: Path, wasm: WasmEngine, caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    stores = Stores(data)
    first = Registry(data, wasm, stores)
    ok = deploy(first, function_dir(tmp_path, "ok", reactor("")))
    bad = deploy(first, function_dir(tmp_path, "bad", reactor("")))
    first.close()
    (first.store.version_dir("bad", bad.version) / "edgefn.toml").write_text("name = 3\n")
    second = Registry(data, wasm, stores)
    with caplog.at_level(logging.ERROR, logger="edgefn.pop"):
        errors = second.restore()
    try:
        assert list(second.functions) == ["ok"] and second.functions["ok"].version == ok.version
        assert len(errors) == 1 and errors[0].startswith("bad: ")
        reason = errors[0].removeprefix("bad: ")
        assert "edgefn.toml" in reason
        assert [r.getMessage() for r in own_records(caplog, "edgefn.pop")] == [
            f"not serving bad@{bad.version}: {reason}"]
        asyncio.run(second.delete("bad"))  # recorded but not served: it can still be deleted
        assert not second.store.version_dir("bad", bad.version).exists()
    finally:
        second.close()
        stores.close()


def test_a_tenant_may_not_route_into_another_tenants_paths(registry: Registry,
                                                           tmp_path: Path) -> None:
    """bob's /alice/y, more specific than alice's /alice/*, took alice's clients there
    and the credentials they sent."""
    deploy(registry, function_dir(tmp_path, "alice", reactor(""), routes=["/alice/*"],
                                  extra='owner = "alice"'))
    for n, routes in enumerate((["/alice/y"], ["/bob", "/alice"], ["/:who/y"], ["/"],
                                ["/alice/x/deeper"])):
        d = function_dir(tmp_path / f"b{n}", "hijack", reactor(""), routes=routes,
                         extra='owner = "bob"')
        with pytest.raises(RouteConflict, match=r"^src/edgefn\.toml: field `routes\[\d\]`: "
                           r"route .* reaches paths of route "
                           r"'/alice/\*' of function 'alice', which belongs to another tenant "
                           r"\('alice'\)"):
            deploy(registry, d, "src")
    assert registry.router.match(b"h", b"/alice/y")[0].name == "alice"  # type: ignore[index]
    # beside its paths, alice's own, and the operator's (no owner): deployed
    deploy(registry, function_dir(tmp_path / "ok1", "bobs", reactor(""),
                                  routes=["/bob/*", "/alicex"], extra='owner = "bob"'))
    deploy(registry, function_dir(tmp_path / "ok2", "alice2", reactor(""), routes=["/alice/y"],
                                  extra='owner = "alice"'))
    deploy(registry, function_dir(tmp_path / "ok3", "ops", reactor(""), routes=["/alice/z"]))
    assert sorted(f["name"] for f in registry.listing()) == ["alice", "alice2", "bobs", "ops"]


def test_a_rollback_or_an_activation_may_not_overlap_another_owners_routes(
        registry: Registry, tmp_path: Path) -> None:
    """Only deploys were checked: a rollback to a version whose routes reached into
    another owner's, or a staged version activated after the other went live, took
    its traffic (review of helper 70's fix)."""
    bob = function_dir(tmp_path / "v1", "bob", reactor(""), routes=["/shared/*"],
                       extra='owner = "bob"')
    v1 = deploy(registry, bob).version
    deploy(registry, function_dir(tmp_path / "v2", "bob", reactor("(nop)"), routes=["/bob/*"],
                                  extra='owner = "bob"'))
    deploy(registry, function_dir(tmp_path, "alice", reactor(""), routes=["/shared/x"],
                                  extra='owner = "alice"'))
    with pytest.raises(RouteConflict, match="belongs to another tenant"):
        asyncio.run(registry.rollback("bob", v1))
    staged = function_dir(tmp_path / "s", "carol", reactor(""), routes=["/carol/*"],
                          extra='owner = "carol"')
    version = asyncio.run(registry.stage(deploys.pack_dir(staged), "src")).version
    deploy(registry, function_dir(tmp_path / "d", "dave", reactor(""), routes=["/carol/y"],
                                  extra='owner = "dave"'))
    with pytest.raises(RouteConflict, match="belongs to another tenant"):
        asyncio.run(registry.activate("carol", version))
    hit = registry.router.match(b"h", b"/shared/x")
    assert hit is not None and hit[0].name == "alice"


def test_overlapping_owners_an_older_edgefn_deployed_are_restored_with_a_warning(
        tmp_path: Path, wasm: WasmEngine, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Served as they were (nothing is taken away at a restart), but said: a deploy of
    either is refused until one goes (helper 74)."""
    stores = Stores(tmp_path / "data")
    old = Registry(tmp_path / "data", wasm, stores, reserved=RESERVED)
    monkeypatch.setattr(old, "_check_tenant_routes", lambda m, label: None)  # as before
    deploy(old, function_dir(tmp_path, "alice", reactor(""), routes=["/alice/*"],
                             extra='owner = "alice"'))
    deploy(old, function_dir(tmp_path, "bob", reactor(""), routes=["/alice/y"],
                             extra='owner = "bob"'))
    old.close()
    new = Registry(tmp_path / "data", wasm, stores, reserved=RESERVED)
    try:
        with caplog.at_level(logging.WARNING, logger="edgefn.pop"):
            assert new.restore() == []
        assert sorted(new.functions) == ["alice", "bob"]
        said = [r.getMessage() for r in caplog.records if "overlap" in r.getMessage()]
        assert said and "delete one of them" in said[0], caplog.text
    finally:
        new.close()
        stores.close()


def test_a_deploy_that_replaces_a_function_takes_its_routes_over_in_one_switch(
        registry: Registry, tmp_path: Path) -> None:
    """A folder renamed in `edgefn dev`: the old name was deleted first, so its routes
    answered 404 until the new one loaded, and for good when its code did not load."""
    deploy(registry, function_dir(tmp_path, "old", reactor(""), routes=["/x"]))
    broken = function_dir(tmp_path / "b", "new", "(module (bad", routes=["/x"])
    with pytest.raises(DeployError, match="not a valid WebAssembly module"):
        asyncio.run(registry.deploy(deploys.pack_dir(broken), replaces="old"))
    hit = registry.router.match(b"h", b"/x")
    assert hit is not None and hit[0].name == "old" and registry.versions("old")
    switches: list[set[str]] = []
    switch = registry._switch

    def seen(functions: dict[str, object], router: object) -> None:
        switches.append(set(functions))
        switch(functions, router)  # type: ignore[arg-type]

    registry._switch = seen  # type: ignore[method-assign]
    good = function_dir(tmp_path / "g", "new", reactor(""), routes=["/x"])
    r = asyncio.run(registry.deploy(deploys.pack_dir(good), replaces="old"))
    assert (r.name, switches) == ("new", [{"new"}])  # one switch: no moment without /x
    hit = registry.router.match(b"h", b"/x")
    assert hit is not None and hit[0].name == "new"
    with pytest.raises(NotFound):
        registry.versions("old")
    assert [rec.name for rec in registry.store.records()] == ["new"]


def test_a_function_of_another_owner_is_not_replaced(registry: Registry,
                                                     tmp_path: Path) -> None:
    deploy(registry, function_dir(tmp_path, "theirs", reactor(""), extra='owner = "globex"'))
    mine = function_dir(tmp_path / "m", "mine", reactor(""), extra='owner = "acme"')
    with pytest.raises(NotOwner, match="cannot replace 'theirs': it belongs to another owner"):
        asyncio.run(registry.deploy(deploys.pack_dir(mine), replaces="theirs"))
    assert set(registry.functions) == {"theirs"}


def test_a_replace_drops_the_staged_versions_of_what_it_replaced_and_names_its_failures(
        registry: Registry, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A deploy naming itself as what it replaces replaces nothing; one replacing another
    function closes that one's staged versions (not another's), and a record or grant
    that cannot be deleted is logged, naming the function and why."""
    deploy(registry, function_dir(tmp_path, "old", reactor(""), routes=["/x"]))
    deploy(registry, function_dir(tmp_path, "other", reactor(""), routes=["/y"]))
    for name in ("old", "other"):
        d = function_dir(tmp_path / "s", name, reactor("nop"), routes=[f"/s{name}"])
        asyncio.run(registry.stage(deploys.pack_dir(d)))
    again = function_dir(tmp_path / "a", "old", reactor("(nop)"), routes=["/x"])
    asyncio.run(registry.deploy(deploys.pack_dir(again), replaces="old"))
    hit = registry.router.match(b"h", b"/x")
    assert hit is not None and hit[0].name == "old"  # itself: nothing replaced

    def boom(*_: object) -> None:
        raise OSError("disk gone")
    monkeypatch.setattr(registry.store, "delete", boom)
    monkeypatch.setattr(registry.stores.owners, "forget", boom)
    new = function_dir(tmp_path / "n", "new", reactor(""), routes=["/x"])
    with caplog.at_level(logging.ERROR):
        asyncio.run(registry.deploy(deploys.pack_dir(new), replaces="old"))
    assert [k[0] for k in registry.staged] == ["other"]
    assert caplog.messages == ["old: replaced, but its record cannot be deleted: disk gone",
                               "old: cannot save the withdrawal of its grants: disk gone"]


def test_a_deploy_that_fails_making_its_namespaces_leaves_nothing(
        registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What raised is what the caller gets (the undo of a deploy that made no namespace
    yet has none to remove), and the version it wrote is gone."""
    def full(*_: object) -> list[str]:
        raise OSError("no room for a namespace")
    monkeypatch.setattr(registry.stores, "new_namespaces", full)
    d = function_dir(tmp_path, "f", reactor(""))
    with pytest.raises(OSError, match="no room for a namespace"):
        deploy(registry, d)
    assert registry.listing() == [] and not registry.store.version_dir(
        "f", deploys.version_of(deploys.pack_dir(d))).exists()
