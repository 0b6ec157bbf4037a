"""Rollouts across three real PoPs over loopback: a deploy switches every PoP or
none, a switch that fails on one PoP is undone on the others, rollback and
promote act everywhere, a canary splits a key the same way on every PoP, and
drift between PoPs is found. Each test uses functions of its own names."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from edgefn_core.errors import AdminError, RolloutError
from runtime.functions import deploys
from runtime.topology import rollout
from runtime.topology.versions import ABSENT, drift, served_versions
from tests.rollout.helpers import Poller, Topology, versions
from tests.support import function_dir, pop_process, reactor


def package(root: Path, name: str, rev: int, routes: list[str] | None = None) -> bytes:
    d = function_dir(root / f"{name}-{rev}", name, reactor(""), routes=routes or [f"/{name}"],
                     extra=f"# rev {rev}")
    return deploys.to_tar(deploys.pack_dir(d))


def everywhere(topology: Topology, path: str, key: str = "k") -> dict[str, str]:
    """The version each PoP serves `path` with, for canary key `key`."""
    return {n: versions(p, path, [key])[key] for n, p in topology.pops.items()}


def current(topology: Topology, name: str) -> dict[str, str]:
    """The version each PoP's deploy record names as current."""
    return {n: p.admin.request("GET", f"/v1/functions/{name}/versions")["current"]
            for n, p in topology.pops.items()}


def test_a_deploy_switches_every_pop(topology: Topology, tmp_path: Path) -> None:
    pops = rollout.pops_of(topology.run)
    v1 = rollout.deploy(pops, package(tmp_path, "t1", 1)).version
    assert everywhere(topology, "/t1") == dict.fromkeys(topology.pops, v1)
    with Poller(topology.pops, "/t1") as poller:
        r = rollout.deploy(pops, package(tmp_path, "t1", 2))
        done = time.monotonic()
        time.sleep(0.2)  # let the poller send requests after the switch (not for correctness)
    v2 = r.version
    assert (r.changed, r.previous) == (True, dict.fromkeys(topology.pops, v1))
    after = [(pop, v) for sent, pop, v in poller.seen if sent > done]
    assert after and all(v == v2 for _, v in after), after
    assert {v for _, _, v in poller.seen} <= {v1, v2}
    assert 0 <= r.window_ms < 500  # three PoPs switched within half a second of each other
    print(f"switch window across 3 PoPs: {r.window_ms} ms")


def test_a_pop_that_refuses_the_version_leaves_every_pop_unchanged(
        topology: Topology, tmp_path: Path) -> None:
    pops = rollout.pops_of(topology.run)
    v1 = rollout.deploy(pops, package(tmp_path, "t2", 1)).version
    topology.pops["central"].deploy(function_dir(tmp_path, "t2x", reactor(""),
                                                 routes=["/t2-extra"]))
    blob = package(tmp_path, "t2", 2, ["/t2", "/t2-extra"])
    v2 = deploys.version_of(deploys.from_tar(blob))
    with Poller(topology.pops, "/t2") as poller, pytest.raises(RolloutError) as err:
        rollout.deploy(pops, blob)
    assert str(err.value).startswith("stage failed on PoP central: ")
    assert "'/t2-extra'" in str(err.value)
    assert str(err.value).endswith("; aborted everywhere: no PoP changed")
    assert {v for _, _, v in poller.seen} == {v1}
    assert current(topology, "t2") == dict.fromkeys(topology.pops, v1)
    for p in topology.pops.values():  # the abort left nothing of v2 on any PoP
        assert not (p.data / "versions" / "t2" / v2).exists()
        with pytest.raises(AdminError, match="is not staged on this PoP"):
            p.admin.request("POST", "/v1/functions/t2/activate", f'{{"version": "{v2}"}}'.encode())


def test_a_pop_that_is_down_leaves_every_pop_unchanged(topology: Topology,
                                                       tmp_path: Path) -> None:
    with pop_process(tmp_path) as gone:  # a PoP that ran here and stopped
        assert gone.port
    pops = [*rollout.pops_of(topology.run), ("gone", tmp_path / "data")]
    v1 = rollout.deploy(pops[:3], package(tmp_path, "t3", 1)).version
    with pytest.raises(RolloutError) as err:
        rollout.deploy(pops, package(tmp_path, "t3", 2))
    assert str(err.value).startswith("stage failed on PoP gone: cannot reach the PoP's admin "
                                     "API at 127.0.0.1:")
    assert everywhere(topology, "/t3") == dict.fromkeys(topology.pops, v1)
    assert current(topology, "t3") == dict.fromkeys(topology.pops, v1)


def test_a_switch_that_fails_on_one_pop_is_undone_on_the_others(topology: Topology,
                                                                tmp_path: Path) -> None:
    pops = rollout.pops_of(topology.run)
    v1 = rollout.deploy(pops, package(tmp_path, "t4", 1)).version
    blob = package(tmp_path, "t4", 2)
    staged = rollout.stage(pops, lambda _, c: c.request("POST", "/v1/stage", blob))
    v2 = staged[0].value["version"]
    topology.pops["edge-b"].admin.request("POST", "/v1/functions/t4/abort",
                                          f'{{"version": "{v2}"}}'.encode())
    with pytest.raises(RolloutError) as err:
        rollout.activate(pops, staged)
    assert str(err.value) == (f"activate failed on PoP edge-b: t4@{v2} is not staged on this "
                              "PoP (stage it first); put back on central, edge-a")
    assert everywhere(topology, "/t4") == dict.fromkeys(topology.pops, v1)
    assert current(topology, "t4") == dict.fromkeys(topology.pops, v1)


def canaries(topology: Topology, name: str) -> dict[str, tuple[str, object]]:
    """Each PoP's live version of `name` and its canary (None, or {version, percent})."""
    return {pop: (r["current"], r.get("canary")) for pop, r in
            rollout.records(rollout.pops_of(topology.run), name).items()}


@pytest.mark.parametrize("share", [40.0, None], ids=["canary", "deploy"])
def test_a_switch_that_fails_puts_back_the_canary_that_ran(topology: Topology, tmp_path: Path,
                                                           share: float | None) -> None:
    """A new canary (or a new live version, which ends the canary) that fails to switch
    on one PoP: the others run the canary that ran before again (they dropped it,
    and served the live version alone: drift with the PoP that failed)."""
    name = f"t4c{'c' if share else 'd'}"
    pops = rollout.pops_of(topology.run)
    v1 = rollout.deploy(pops, package(tmp_path, name, 1)).version
    v2 = rollout.deploy(pops, package(tmp_path, name, 2), canary=30.0).version
    was = versions(topology.pops["edge-a"], f"/{name}", KEYS[:200])
    assert set(was.values()) == {v1, v2}
    blob = package(tmp_path, name, 3)
    staged = rollout.stage(pops, lambda _, c: c.request("POST", "/v1/stage", blob))
    v3 = staged[0].value["version"]
    topology.pops["edge-b"].admin.request("POST", f"/v1/functions/{name}/abort",
                                          f'{{"version": "{v3}"}}'.encode())
    with pytest.raises(RolloutError, match=r"; put back on central, edge-a$"):
        rollout.activate(pops, staged, share)
    assert canaries(topology, name) == dict.fromkeys(
        topology.pops, (v1, {"version": v2, "percent": 30.0}))
    for p in topology.pops.values():
        assert versions(p, f"/{name}", KEYS[:200]) == was
    assert name not in served_versions(topology.run).drift()
    for p in topology.pops.values():  # nothing stays staged: v3 was aborted everywhere
        with pytest.raises(AdminError, match="is not staged on this PoP"):
            p.admin.request("POST", f"/v1/functions/{name}/activate",
                            f'{{"version": "{v3}"}}'.encode())


def test_a_first_deploy_that_fails_to_switch_is_deleted_where_it_switched(
        topology: Topology, tmp_path: Path) -> None:
    pops = rollout.pops_of(topology.run)
    blob = package(tmp_path, "t4b", 1)
    staged = rollout.stage(pops, lambda _, c: c.request("POST", "/v1/stage", blob))
    v1 = staged[0].value["version"]
    topology.pops["central"].admin.request("POST", "/v1/functions/t4b/abort",
                                           f'{{"version": "{v1}"}}'.encode())
    with pytest.raises(RolloutError, match="put back on edge-a, edge-b"):
        rollout.activate(pops, staged)
    for p in topology.pops.values():
        assert p.status("/t4b") == 404
        assert "t4b" not in {f["name"] for f in p.admin.request("GET", "/v1/functions")["functions"]}


def test_rollback_goes_back_on_every_pop(topology: Topology, tmp_path: Path) -> None:
    pops = rollout.pops_of(topology.run)
    v1 = rollout.deploy(pops, package(tmp_path, "t5", 1)).version
    v2 = rollout.deploy(pops, package(tmp_path, "t5", 2)).version
    r = rollout.rollback(pops, "t5")
    assert (r.version, r.changed) == (v1, True)
    assert everywhere(topology, "/t5") == current(topology, "t5") == dict.fromkeys(
        topology.pops, v1)
    assert rollout.rollback(pops, "t5", v2).version == v2
    assert everywhere(topology, "/t5") == dict.fromkeys(topology.pops, v2)


def test_rollback_refuses_when_pops_disagree(topology: Topology, tmp_path: Path) -> None:
    pops = rollout.pops_of(topology.run)
    v1 = rollout.deploy(pops, package(tmp_path, "t5b", 1)).version
    d = function_dir(tmp_path / "oob", "t5b", reactor(""), extra="# out of band")
    v9 = topology.pops["edge-a"].deploy(d)["version"]
    with pytest.raises(RolloutError) as err:
        rollout.rollback(pops, "t5b")
    assert str(err.value) == (f"PoPs serve different versions of 't5b' (central: {v1}, "
                              f"edge-a: {v9}, edge-b: {v1}): name the version to go back to")


def test_rollback_removes_the_function_where_nothing_served_before(topology: Topology,
                                                                  tmp_path: Path) -> None:
    """A function deployed on one PoP, then rolled out to all: rollback goes back on
    that PoP and removes the function from the others, where nothing served before
    (it refused, naming them, and changed nothing); a VERSION that only that PoP
    holds is refused naming the PoPs that lack it."""
    pops = rollout.pops_of(topology.run)
    d = function_dir(tmp_path / "only-a", "t5c", reactor(""), extra="# edge-a's own")
    v1 = topology.pops["edge-a"].deploy(d)["version"]
    v2 = rollout.deploy(pops, package(tmp_path, "t5c", 2)).version
    with pytest.raises(RolloutError) as err:
        rollout.rollback(pops, "t5c", v1)
    assert str(err.value) == (f"t5c: version {v1} is not stored on central, edge-b (only on "
                              "edge-a); roll back without a version to go back to what served "
                              "before on each PoP, or deploy it again; no PoP changed")
    assert current(topology, "t5c") == dict.fromkeys(topology.pops, v2)
    r = rollout.rollback(pops, "t5c")
    assert (r.version, r.removed, r.previous) == (v1, ["central", "edge-b"],
                                                  dict.fromkeys(topology.pops, v2))
    assert versions(topology.pops["edge-a"], "/t5c", ["k"]) == {"k": v1}
    for name in ("central", "edge-b"):
        assert topology.pops[name].status("/t5c") == 404
        with pytest.raises(AdminError) as gone:
            topology.pops[name].admin.request("GET", "/v1/functions/t5c/versions")
        assert gone.value.status == 404
    with pytest.raises(RolloutError) as err:  # nothing served before v1 on edge-a
        rollout.rollback(pops, "t5c")
    assert str(err.value) == (f"t5c: {v1} is the oldest version that served on edge-a, none "
                              "before it to roll back to (`edgefn rollback t5c VERSION` serves "
                              "a stored one); no PoP changed")


def test_a_removal_that_fails_names_the_pop_and_how_to_finish(tmp_path: Path) -> None:
    with pop_process(tmp_path) as gone:  # a PoP that ran here and stopped
        assert gone.port
    done = rollout.Rollout("t5e", "abc", {}, True)
    with pytest.raises(RolloutError) as err:
        rollout._remove([("gone", tmp_path / "data")], "t5e", done)
    assert str(err.value).startswith("t5e went back to abc where a version served before; "
                                     "removing it failed on PoP gone: cannot reach ")
    assert str(err.value).endswith(f": it still serves there; once the PoP is back, remove "
                                   f"it with `edgefn delete t5e --data {tmp_path / 'data'}`")
    assert done.removed == []


def test_a_canary_of_the_live_version_is_refused_and_changes_nothing(
        topology: Topology, tmp_path: Path) -> None:
    pops = rollout.pops_of(topology.run)
    v1 = rollout.deploy(pops, package(tmp_path, "t5d", 1)).version
    with pytest.raises(RolloutError) as err:
        rollout.deploy(pops, package(tmp_path, "t5d", 1), canary=10.0)
    assert str(err.value) == (f"t5d@{v1} is already the live version on central, edge-a, "
                              "edge-b: a canary must differ from the live version; no PoP "
                              "changed")
    records = rollout.records(pops, "t5d")
    assert {pop: (r["current"], r.get("canary")) for pop, r in records.items()} == \
        dict.fromkeys(topology.pops, (v1, None))


KEYS = [f"user-{i}" for i in range(1000)]


def test_a_canary_splits_each_key_the_same_way_on_every_pop(topology: Topology,
                                                            tmp_path: Path) -> None:
    pops = rollout.pops_of(topology.run)
    v1 = rollout.deploy(pops, package(tmp_path, "t6", 1)).version
    r = rollout.deploy(pops, package(tmp_path, "t6", 2), canary=10.0)
    v2 = r.version
    assert (r.canary, current(topology, "t6")) == (10.0, dict.fromkeys(topology.pops, v1))
    split = versions(topology.pops["edge-a"], "/t6", KEYS)
    share = sum(v == v2 for v in split.values()) / len(KEYS) * 100
    assert abs(share - 10) <= 3, share
    assert versions(topology.pops["edge-a"], "/t6", KEYS) == split  # sticky
    assert versions(topology.pops["edge-b"], "/t6", KEYS[:300]) == {
        k: split[k] for k in KEYS[:300]}
    assert versions(topology.pops["central"], "/t6", KEYS[300:600]) == {
        k: split[k] for k in KEYS[300:600]}
    print(f"canary share of 1000 keys at 10%: {share:.1f}%")


def test_promote_makes_the_canary_live_on_every_pop(topology: Topology, tmp_path: Path) -> None:
    pops = rollout.pops_of(topology.run)
    rollout.deploy(pops, package(tmp_path, "t7", 1))
    v2 = rollout.deploy(pops, package(tmp_path, "t7", 2), canary=10.0).version
    assert rollout.promote(pops, "t7").version == v2
    assert current(topology, "t7") == dict.fromkeys(topology.pops, v2)
    for p in topology.pops.values():
        assert set(versions(p, "/t7", KEYS[:100]).values()) == {v2}
        listed = {f["name"]: f for f in p.admin.request("GET", "/v1/functions")["functions"]}
        assert "canary" not in listed["t7"]


def test_rollback_during_a_canary_drops_it_on_every_pop(topology: Topology,
                                                        tmp_path: Path) -> None:
    pops = rollout.pops_of(topology.run)
    v1 = rollout.deploy(pops, package(tmp_path, "t8", 1)).version
    rollout.deploy(pops, package(tmp_path, "t8", 2), canary=50.0)
    assert rollout.rollback(pops, "t8").version == v1
    for p in topology.pops.values():
        assert set(versions(p, "/t8", KEYS[:100]).values()) == {v1}
    assert served_versions(topology.run).pops["edge-a"]["t8"].canary is None


def test_promote_refuses_unless_every_pop_runs_the_canary(topology: Topology,
                                                          tmp_path: Path) -> None:
    pops = rollout.pops_of(topology.run)
    v1 = rollout.deploy(pops, package(tmp_path, "t9", 1)).version
    v2 = rollout.deploy(pops[:2], package(tmp_path, "t9", 2), canary=10.0).version
    with pytest.raises(RolloutError) as err:
        rollout.promote(pops, "t9")
    assert str(err.value) == (f"t9: every PoP must run the same canary to promote it (central: "
                              f"None, edge-a: {v2}, edge-b: {v2}); no PoP changed")
    assert current(topology, "t9") == dict.fromkeys(topology.pops, v1)
    with pytest.raises(RolloutError, match="no PoP of the topology serves 'nope'; no PoP "
                                           "changed"):
        rollout.promote(pops, "nope")


def test_drift_names_the_pop_deployed_out_of_band(topology: Topology, tmp_path: Path) -> None:
    pops = rollout.pops_of(topology.run)
    v1 = rollout.deploy(pops, package(tmp_path, "t10", 1)).version
    assert "t10" not in drift(served_versions(topology.run).pops)
    d = function_dir(tmp_path / "oob", "t10", reactor(""), extra="# out of band")
    v9 = topology.pops["edge-b"].deploy(d)["version"]
    topology.pops["central"].deploy(function_dir(tmp_path, "t10only", reactor("")))
    found = drift(served_versions(topology.run).pops)
    assert found["t10"] == {"edge-a": v1, "edge-b": v9, "central": v1}
    assert found["t10only"] == {"edge-a": ABSENT, "edge-b": ABSENT,
                                "central": found["t10only"]["central"]}
    assert found["t10only"]["central"] != ABSENT


def test_a_canary_goes_to_the_pops_that_serve_the_function(topology: Topology,
                                                           tmp_path: Path) -> None:
    """A function only some PoPs serve (the default topology's edge-only hello-wat):
    the canary splits it there and leaves the others as they were (it failed at the
    switch on them, after the edges had switched)."""
    pops = rollout.pops_of(topology.run)
    d = function_dir(tmp_path / "only-a", "t14", reactor(""), extra="# edge-a's own")
    v1 = topology.pops["edge-a"].deploy(d)["version"]
    r = rollout.deploy(pops, package(tmp_path, "t14", 2), canary=30.0)
    assert sorted(r.skipped) == ["central", "edge-b"]
    assert all("does not serve the function" in why for why in r.skipped.values())
    record = topology.pops["edge-a"].admin.request("GET", "/v1/functions/t14/versions")
    assert (record["current"], record["canary"]["version"]) == (v1, r.version)
    for name in ("central", "edge-b"):  # nothing staged stays behind, nothing serves
        with pytest.raises(AdminError) as err:
            topology.pops[name].admin.request("GET", "/v1/functions/t14/versions")
        assert err.value.status == 404
    with pytest.raises(RolloutError, match="t15 is not live on any PoP: a canary splits"):
        rollout.deploy(pops, package(tmp_path, "t15", 1), canary=30.0)
    # promote and rollback act where it is served (they failed reading the others)
    p = rollout.promote(pops, "t14")
    assert (p.version, sorted(p.skipped)) == (r.version, ["central", "edge-b"])
    assert topology.pops["edge-a"].admin.request(
        "GET", "/v1/functions/t14/versions")["current"] == r.version
    back = rollout.rollback(pops, "t14")
    assert (back.version, sorted(back.skipped)) == (v1, ["central", "edge-b"])
    with pytest.raises(RolloutError, match="no PoP of the topology serves 'nowhere'"):
        rollout.rollback(pops, "nowhere")


def test_a_bad_package_is_reported_once_for_every_pop(topology: Topology,
                                                      tmp_path: Path) -> None:
    pops = rollout.pops_of(topology.run)
    d = function_dir(tmp_path, "t12", "(module (func (export \"_start\") (call $nope)))")
    with pytest.raises(RolloutError) as err:
        rollout.deploy(pops, deploys.to_tar(deploys.pack_dir(d)))
    message = str(err.value)
    assert message.startswith("stage failed on PoPs central, edge-a, edge-b: ")
    assert message.count("failed to find name `$nope`") == 1


def test_a_canary_is_dropped_where_pops_can_be_reached(topology: Topology,
                                                       tmp_path: Path) -> None:
    """A bad canary must go even while one PoP is down: the rollback drops it on the
    others and names the PoP it could not reach (it changed nothing before)."""
    pops = rollout.pops_of(topology.run)
    v1 = rollout.deploy(pops, package(tmp_path, "t13", 1)).version
    rollout.deploy(pops, package(tmp_path, "t13", 2), canary=50.0)
    with pop_process(tmp_path) as gone:  # a PoP that ran here and stopped
        assert gone.port
    with pytest.raises(RolloutError) as err:
        rollout.rollback([*pops, ("gone", tmp_path / "data")], "t13")
    assert str(err.value).startswith("dropped the canary of t13 on central, edge-a, edge-b; "
                                     "reaching failed on PoP gone: cannot reach")
    for p in topology.pops.values():
        assert set(versions(p, "/t13", KEYS[:100]).values()) == {v1}
