"""Warm-up before the switch (`runtime.functions.warmup`): what runs, what it must not
touch, and what a failing warm-up does."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from edgefn_core.errors import AdminError, DeployError
from runtime.bindings import Stores
from runtime.executors.wasm.engine import WasmEngine
from runtime.executors.wasm.function import WasmFunction
from runtime.functions import deploys, warmup
from runtime.functions.manifest import Route, parse
from runtime.functions.registry import Deployment, Registry
from tests.support import Running, function_dir, pop_thread, python_function, reactor

TRAPS = reactor("unreachable")
KV_IMPORT = '(import "edgefn" "kv_delete" (func (param i32 i32 i32 i32) (result i32)))'

# Lists its calls per isolate, each marked with the warm-up header's value or "-";
# /NAME/slow takes 0.3 s, /NAME/fail answers 500, /NAME/raise raises.
COUNTING = """\
import time

from edgefn import Response

calls = []

def handle(request, env):
    if request.path.endswith("/fail"):
        return Response("no", 500)
    if request.path.endswith("/raise"):
        raise ValueError("warm-up refused")
    if request.path.endswith("/forge"):
        raise ValueError("boom\\nts=2026-12-02T02:00:00.000Z status=200")
    calls.append(request.headers.get("x-edgefn-warmup", "-"))
    if request.path.endswith("/slow"):
        time.sleep(0.3)
    return Response(" ".join(calls))
"""


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    wasm = WasmEngine(tmp_path / "cache")
    stores = Stores(tmp_path / "data")
    r = Registry(tmp_path / "data", wasm, stores)
    yield r
    r.close()
    stores.close()
    wasm.close()


def deploy(registry: Registry, d: Path) -> Deployment:
    name = asyncio.run(registry.deploy(deploys.pack_dir(d))).name
    return registry.functions[name]


@pytest.fixture(autouse=True)
def handled(monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    """Calls of each WASM executor's request path, by `id` of the executor."""
    seen: dict[int, int] = {}
    held: list[WasmFunction] = []  # kept alive: a freed executor's id may be reused

    def counted(real: Any) -> Any:
        def counting(self: WasmFunction, *args: object, **kw: object) -> object:
            if id(self) not in seen:
                held.append(self)
            seen[id(self)] = seen.get(id(self), 0) + 1
            return real(self, *args, **kw)
        return counting
    monkeypatch.setattr(WasmFunction, "handle", counted(WasmFunction.handle))
    monkeypatch.setattr(WasmFunction, "dry_run", counted(WasmFunction.dry_run))
    return seen


def calls(fn: Deployment, seen: dict[int, int]) -> int:
    """Requests the reactor's request path ran so far (warm-up included)."""
    assert isinstance(fn.executor, WasmFunction)
    return seen.get(id(fn.executor), 0)


def test_a_pure_reactor_runs_its_handler_before_the_switch(
        registry: Registry, tmp_path: Path, handled: dict[int, int]) -> None:
    fn = deploy(registry, function_dir(tmp_path, "f", reactor("")))
    assert calls(fn, handled) == warmup.DRY_RUNS


def test_a_staged_and_a_rolled_back_version_are_warm_before_they_serve(
        registry: Registry, tmp_path: Path, handled: dict[int, int]) -> None:
    v1 = deploy(registry, function_dir(tmp_path / "1", "f", reactor("")))
    deploy(registry, function_dir(tmp_path / "2", "f", reactor("nop")))
    asyncio.run(registry.rollback("f"))
    back = registry.functions["f"]
    assert back.version == v1.version and back is not v1
    assert calls(back, handled) == warmup.DRY_RUNS
    staged = asyncio.run(registry.stage(deploys.pack_dir(function_dir(tmp_path / "3", "f",
                                                                      reactor("nop nop")))))
    assert calls(registry.staged[("f", staged.version)].fn, handled) == warmup.DRY_RUNS


def test_a_reactor_with_host_imports_is_not_run(registry: Registry, tmp_path: Path,
                                                handled: dict[int, int]) -> None:
    d = function_dir(tmp_path, "g", reactor("", imports=KV_IMPORT),
                     extra='[bindings]\nkv = ["ns"]')
    fn = deploy(registry, d)
    assert not fn.executor.pure and calls(fn, handled) == 0  # type: ignore[attr-defined]


def test_a_reactor_that_traps_on_its_warm_up_still_deploys(
        registry: Registry, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        handled: dict[int, int]) -> None:
    with caplog.at_level(logging.INFO, "edgefn.pop"):
        fn = deploy(registry, function_dir(tmp_path, "t", TRAPS))
    assert registry.functions["t"] is fn and calls(fn, handled) == 1  # the first trap ends it
    assert "t@" in caplog.text and "warm-up GET /t failed (deploying anyway)" in caplog.text


def test_a_looping_pure_reactor_costs_its_deploy_one_inline_slice(
        registry: Registry, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        handled: dict[int, int]) -> None:
    """Its warm-up stops at the 5 ms inline slice instead of running the whole 60 s
    budget (which held every other deploy, and a restarted PoP's listener, behind it)."""
    d = function_dir(tmp_path, "spin", reactor("(loop $l (br $l))"),
                     limits="cpu_ms = 60000\nwall_ms = 120000")
    started = time.monotonic()
    with caplog.at_level(logging.INFO, "edgefn.pop"):
        fn = deploy(registry, d)
    assert time.monotonic() - started < 5  # compile + two 5 ms runs; it took 60 s
    assert registry.functions["spin"] is fn and calls(fn, handled) == 1
    assert "warm-up GET /spin stopped at the 5 ms inline slice" in caplog.text


def test_a_declared_route_that_does_not_match_refuses_the_deploy(registry: Registry,
                                                                 tmp_path: Path) -> None:
    d = function_dir(tmp_path, "r", reactor(""), extra='warmup = "/elsewhere"')
    with pytest.raises(DeployError, match=r"r: warm-up route '/elsewhere' \(manifest `warmup`\) "
                                          "is not served by any of its routes"):
        deploy(registry, d)
    assert "r" not in registry.functions
    assert not (tmp_path / "data" / "functions" / "r").exists() or \
        not any((tmp_path / "data" / "functions" / "r").iterdir())


@pytest.mark.parametrize(("route", "path"), [
    ("/", "/"), ("/a/b/", "/a/b"), ("/users/:id", "/users/warmup"),
    ("/u/:id/posts/:post", "/u/warmup/posts/warmup"), ("/static/*", "/static"), ("/*", "/"),
])
def test_the_dry_run_gets_a_path_its_route_matches(route: str, path: str) -> None:
    m = parse(f'name = "x"\nruntime = "wasm"\nentry = "x.wasm"\nroutes = ["{route}"]\n'.encode(),
              "x/edgefn.toml")
    assert warmup.sample_path(Route(route)) == path
    request, matched, _ = warmup.request_for(m, path)
    assert matched == route and request.path == path.encode()


# -- a declared route, end to end: Python isolates behind a real PoP ----------------------
def test_a_declared_route_warms_every_initial_isolate_unseen(pop: Running,
                                                             tmp_path: Path) -> None:
    d = python_function(tmp_path, "cnt", COUNTING, pool="min = 2\nmax = 2\nstandby = false",
                        extra='warmup = "/cnt"')
    pop.deploy(d)
    with ThreadPoolExecutor(2) as pool:  # two at once: one on each isolate
        bodies = sorted(pool.map(lambda _: pop.get("/cnt/slow")[2], range(2)))
    # each isolate ran the warm-up (with its header) before its first request, and
    # one of them the quiet request through the pipeline after the switch
    assert bodies == [b"1 -", b"1 1 -"]
    pop.delivered()
    assert [e.path for e in pop.pop.ring.events] == ["/cnt/slow"] * 2  # none for warm-ups
    assert sum(float(line.rsplit(" ", 1)[1]) for line in pop.admin.metrics().splitlines()
               if line.startswith("edgefn_requests_total{")) == 2


@pytest.mark.parametrize(("route", "why"), [
    ("/bad/fail", "answered 500"),
    ("/bad/raise", "failed: trap: raised ValueError: warm-up refused"),
    # the message's newline, escaped: a warm-up failing at boot is logged
    ("/bad/forge", "failed: trap: raised ValueError: boom\\nts=2026-12-02T02:00:00.000Z"),
])
def test_a_failing_declared_route_refuses_the_deploy_and_the_old_version_serves(
        pop: Running, tmp_path: Path, route: str, why: str) -> None:
    good = python_function(tmp_path / "v1", "bad", COUNTING)
    v1 = pop.deploy(good)["version"]
    bad = python_function(tmp_path / "v2", "bad", COUNTING + "# v2\n",
                          extra=f'warmup = "{route}"')
    with pytest.raises(AdminError) as err:
        pop.deploy(bad)
    assert f"warm-up GET {route} (manifest `warmup`) {why}" in str(err.value)
    assert "nothing was switched" in str(err.value)
    status, headers, body = pop.get("/bad")
    assert status == 200 and body == b"-"  # v1, which had no warm-up
    assert headers["x-edgefn-function"] == f"bad@{v1}"


def test_a_restarted_pop_warms_what_it_restores_before_it_listens(tmp_path: Path) -> None:
    d = python_function(tmp_path, "cnt", COUNTING, extra='warmup = "/cnt"')
    with pop_thread(tmp_path / "data") as first:
        first.deploy(d)
    with pop_thread(tmp_path / "data") as again:  # the executor's, then the quiet request
        assert again.get("/cnt")[2] == b"1 1 -"


# -- a declared route that uses a KV namespace the deploy creates -------------------------
KV_WARM = """\
from edgefn import Response

def handle(request, env):
    n = env.kv("wk").increment("n")
    if request.path.endswith("/fail"):
        return Response("no", 500)
    return Response(str(n))
"""


def test_a_first_deploy_whose_warm_up_uses_its_new_namespace_goes_live(
        registry: Registry, tmp_path: Path) -> None:
    """Namespaces were created when the deploy committed, after its warm-up: a
    first deploy whose warm-up used one failed with "unknown namespace 'wk'", and
    undoing it meant it never existed, so no deploy of it could ever succeed."""
    d = python_function(tmp_path, "kw", KV_WARM, extra='warmup = "/kw"\n[bindings]\nkv = ["wk"]')
    deploy(registry, d)
    assert registry.stores.kv.get("wk", b"n") is not None  # the warm-up's write
    assert registry.stores.owners.owner("kv", "wk") is not None


EMPTY_WARM = """\
from edgefn import Response

def handle(request, env):
    env.kv("wk").get("n")
    return Response("no", 500)
"""


def test_a_failed_deploy_removes_the_empty_namespaces_it_created_for_its_warm_up(
        registry: Registry, tmp_path: Path) -> None:
    registry.stores.kv.create_namespace("kept")
    registry.stores.kv.put("kept", b"k", b"v", ttl=60)
    d = python_function(tmp_path, "kw", EMPTY_WARM,
                        extra='warmup = "/kw"\n[bindings]\nkv = ["wk", "kept"]')
    with pytest.raises(DeployError, match="answered 500"):
        deploy(registry, d)
    assert registry.stores.kv.namespaces() == ["kept"]  # its own gone, the other's kept
    assert registry.stores.kv.get("kept", b"k") == b"v"
    # a key written in it meanwhile keeps it: its writer was told it was stored
    d = python_function(tmp_path / "again", "kw", KV_WARM,
                        extra='warmup = "/kw/fail"\n[bindings]\nkv = ["wk"]')
    with pytest.raises(DeployError, match="answered 500"):
        deploy(registry, d)
    assert registry.stores.kv.get("wk", b"n") is not None


READ_WARM = """\
from edgefn import Response

def handle(request, env):
    return Response(repr(env.kv("wk").get("n")))
"""


def test_a_staged_version_warms_on_its_new_namespace_and_an_abort_removes_it(
        registry: Registry, tmp_path: Path) -> None:
    d = python_function(tmp_path, "kw", READ_WARM,
                        extra='warmup = "/kw"\n[bindings]\nkv = ["wk"]')
    staged = asyncio.run(registry.stage(deploys.pack_dir(d)))  # its warm-up read wk
    assert registry.stores.kv.namespaces() == ["wk"]
    assert asyncio.run(registry.abort("kw", staged.version))
    assert registry.stores.kv.namespaces() == []


def test_an_abort_keeps_a_new_namespace_another_staged_version_uses(
        registry: Registry, tmp_path: Path) -> None:
    first = python_function(tmp_path, "kw", KV_WARM, extra='warmup = "/kw"\n[bindings]\nkv = ["wk"]')
    second = python_function(tmp_path, "kw2", KV_WARM,
                             extra='warmup = "/kw2"\n[bindings]\nkv = ["wk"]')
    staged = asyncio.run(registry.stage(deploys.pack_dir(first)))  # makes wk
    asyncio.run(registry.stage(deploys.pack_dir(second)))  # warms up on it too
    assert asyncio.run(registry.abort("kw", staged.version))
    assert registry.stores.kv.namespaces() == ["wk"]  # kw2, still staged, uses it
