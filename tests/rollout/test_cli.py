"""The rollout commands end to end: `edgefn deploy/rollback/promote/versions` with
--topology on three real PoPs and --canary on one (kept across its restart), and
the clear one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.cli.main import main
from runtime.functions import deploys
from tests.rollout.helpers import Topology, versions
from tests.support import function_dir, pop_thread, reactor


def fn(root: Path, name: str, rev: int) -> str:
    return str(function_dir(root / f"{name}-{rev}", name, reactor(""), extra=f"# rev {rev}"))


def version(d: str) -> str:
    return deploys.version_of(deploys.pack_dir(d))


def edgefn(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_deploy_canary_promote_and_rollback_across_the_topology(
        topology: Topology, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = str(topology.run)
    v1, v2 = version(fn(tmp_path, "c1", 1)), version(fn(tmp_path, "c1", 2))
    status, out, _ = edgefn(capsys, "deploy", fn(tmp_path, "c1", 1), "--topology", run)
    assert status == 0 and out.startswith(f"deployed c1 version {v1} on 3 PoPs (edge-a, "
                                          "edge-b, central); switch window ")
    status, out, _ = edgefn(capsys, "deploy", fn(tmp_path, "c1", 2), "--canary", "10%",
                            "--topology", run)
    assert status == 0 and out.startswith(f"canary c1 version {v2} at 10% on 3 PoPs")
    status, out, _ = edgefn(capsys, "versions", "c1", "--topology", run, "--json")
    shown = json.loads(out)
    assert shown["drift"] == {} and shown["pops"]["central"]["c1"] == {
        "version": v1, "canary": f"{v2}@10%"}
    out = edgefn(capsys, "ls", "--data", str(topology.pops["central"].data))[1]
    assert f"c1                   {v1}  reactor  /c1  (canary {v2} at 10%)\n" in out
    assert edgefn(capsys, "promote", "c1", "--topology", run)[1] == \
        f"promoted c1 version {v2} on 3 PoPs (edge-a, edge-b, central)\n"
    assert edgefn(capsys, "rollback", "c1", "--to", v1[:6], "--topology", run)[1] == \
        f"c1 now serves version {v1} on 3 PoPs (edge-a, edge-b, central)\n"
    status, _, err = edgefn(capsys, "rollback", "c1", "", "--topology", run)  # was a plain
    assert status == 1 and "has no version ''" in err  # rollback (to v2, here)


def test_versions_flags_drift(topology: Topology, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    run = str(topology.run)
    assert edgefn(capsys, "deploy", fn(tmp_path, "c2", 1), "--topology", run)[0] == 0
    v1 = version(fn(tmp_path, "c2", 1))
    v9 = topology.pops["edge-b"].deploy(Path(fn(tmp_path, "c2", 9)))["version"]
    status, out, _ = edgefn(capsys, "versions", "c2", "--topology", run)
    assert status == 0
    assert f"edge-b           c2                   {v9}  DRIFT\n" in out
    assert out.endswith(f"drift: c2: edge-a={v1}, edge-b={v9}, central={v1}\n")  # no "-"
    # a canary dropped over that drift: each PoP's live version (it named edge-a's for all)
    v2 = version(fn(tmp_path, "c2", 2))
    assert edgefn(capsys, "deploy", fn(tmp_path, "c2", 2), "--canary", "20%",
                  "--topology", run)[0] == 0
    status, out, _ = edgefn(capsys, "rollback", "c2", "--topology", run)
    assert (status, out) == (0, f"c2 now serves version {v1} on central, version {v1} on "
                                f"edge-a, version {v9} on edge-b\n")
    assert edgefn(capsys, "deploy", fn(tmp_path, "c2", 2), "--canary", "20%",
                  "--topology", run)[0] == 0
    status, out, _ = edgefn(capsys, "rollback", "c2", "--topology", run, "--json")
    shown = json.loads(out)
    assert (shown["version"], shown["serving"]) == ("", {"edge-a": v1, "edge-b": v9,
                                                         "central": v1})
    assert v2 not in out


def test_rollback_where_the_rollout_first_brought_the_function(
        topology: Topology, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`deploy --topology` reached PoPs that never served the function: `rollback`
    refused ("had no version before"; no PoP changed) and `rollback VERSION` of the
    version the one PoP held said the function had no such version."""
    run = str(topology.run)
    v1 = topology.pops["edge-a"].deploy(Path(fn(tmp_path, "c8", 1)))["version"]
    assert edgefn(capsys, "deploy", fn(tmp_path, "c8", 2), "--topology", run)[0] == 0
    v2 = version(fn(tmp_path, "c8", 2))
    assert edgefn(capsys, "rollback", "c8", v1[:8], "--topology", run) == (
        1, "", f"edgefn: c8: version {v1} is not stored on central, edge-b (only on edge-a); "
               "roll back without a version to go back to what served before on each PoP, "
               "or deploy it again; no PoP changed\n")
    assert edgefn(capsys, "rollback", "c8", "zz", "--topology", run) == (
        1, "", f"edgefn: function 'c8' has no version 'zz' (see `edgefn versions c8 --topology "
               f"{run}`)\n")
    assert edgefn(capsys, "rollback", "c8", "--topology", run) == (
        0, f"c8 now serves version {v1} on edge-a\nremoved c8 from central, edge-b (no version "
           f"served there before {v2})\n", "")
    out = edgefn(capsys, "versions", "c8", "--topology", run)[1]  # as before the deploy
    assert f"edge-a           c8                   {v1}" in out
    assert "central          c8" not in out and "edge-b           c8" not in out


def test_versions_of_a_function_no_pop_serves_is_not_found(
        topology: Topology, capsys: pytest.CaptureFixture[str]) -> None:
    """It printed the header alone and exited 0."""
    run = str(topology.run)
    assert edgefn(capsys, "versions", "nosuch", "--topology", run) == (
        1, "", f"edgefn: no PoP of the topology serves 'nosuch' (`edgefn versions --topology "
               f"{run}` lists what they serve)\n")
    status, out, err = edgefn(capsys, "versions", "nosuch", "--topology", run, "--json")
    assert (status, out, json.loads(err)["error"]["code"]) == (1, "", "not_found")


@pytest.mark.parametrize(("value", "why"), [
    ("0%", "expected a share strictly between 0% and 100% (promote the canary to serve it "
           "everywhere), got 0%"),
    ("150%", "expected a share strictly between 0% and 100% (promote the canary to serve it "
             "everywhere), got 150%"),
    ("abc", "expected a percentage such as 10%, got 'abc'"),
    ("0.001%", "expected a share of 0.01% to 99.99% (a share is kept to 0.01%), got 0.001%, "
               "which rounds to 0%: no request key would get the canary"),
])
def test_a_bad_canary_share_is_refused_before_anything_is_sent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, why: str) -> None:
    status, out, err = edgefn(capsys, "deploy", fn(tmp_path, "c3", 1), "--canary", value,
                              "--data", str(tmp_path / "no-pop"))
    assert (status, out, err) == (2, "", f"edgefn deploy: argument --canary: {why} "
                                         "(see `edgefn deploy --help`)\n")


def test_promote_of_an_unknown_function_or_without_a_canary(
        topology: Topology, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = str(topology.run)
    status, _, err = edgefn(capsys, "promote", "nope", "--topology", run)
    assert status == 1
    assert err == "edgefn: no PoP of the topology serves 'nope'; no PoP changed\n"
    edgefn(capsys, "deploy", fn(tmp_path, "c4", 1), "--topology", run)
    v1 = version(fn(tmp_path, "c4", 1))
    status, _, err = edgefn(capsys, "promote", "c4", "--topology", run, "--json")
    assert status == 1 and json.loads(err) == {"error": {"code": "rollout_failed", "message": (
        "c4 has no canary on any PoP to promote (start one with `edgefn deploy DIR --canary "
        "10%`); no PoP changed")}}
    status, _, err = edgefn(capsys, "promote", "c4", "--data", str(topology.pops["edge-a"].data))
    assert status == 1 and "c4 has no canary on this PoP to promote" in err
    assert topology.pops["edge-a"].admin.request("GET", "/v1/functions/c4/versions")[
        "current"] == v1


def test_a_run_dir_without_a_topology_is_refused(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["deploy", fn(tmp_path, "c5", 1)], ["promote", "c5"], ["rollback", "c5"],
                 ["versions"]):
        status, _, err = edgefn(capsys, *argv, "--topology", str(tmp_path))
        assert (status, err) == (1, f"edgefn: {tmp_path}/topology.json: no such file: no "
                                    "topology runs in this folder (start one with `edgefn "
                                    "topology up`, or pass its run dir)\n")
    (tmp_path / "topology.json").write_text("{not json")
    status, _, err = edgefn(capsys, "versions", "--topology", str(tmp_path))
    assert status == 1 and err.startswith(f"edgefn: {tmp_path}/topology.json is not a "
                                          "topology's state (")
    (tmp_path / "topology.json").write_text('{"pops": []}')
    status, _, err = edgefn(capsys, "versions", "--topology", str(tmp_path))
    assert err == f"edgefn: {tmp_path}/topology.json: field `pops`: names no PoP\n"


def test_a_canary_on_one_pop_survives_its_restart(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    keys = [f"user-{i}" for i in range(400)]
    with pop_thread(data) as pop:
        assert edgefn(capsys, "deploy", fn(tmp_path, "c6", 1), "--data", str(data))[0] == 0
        status, out, _ = edgefn(capsys, "deploy", fn(tmp_path, "c6", 2), "--canary", "20%",
                                "--data", str(data))
        assert status == 0 and out.startswith(f"canary c6 version {version(fn(tmp_path, 'c6', 2))}"
                                              f" at 20% on {data}")
        before = versions(pop, "/c6", keys)
    assert abs(list(before.values()).count(version(fn(tmp_path, "c6", 2))) / 4 - 20) <= 3
    with pop_thread(data) as pop:
        assert versions(pop, "/c6", keys) == before
        assert edgefn(capsys, "rollback", "c6", "--data", str(data))[0] == 0  # drops it
        assert set(versions(pop, "/c6", keys).values()) == {
            version(fn(tmp_path, "c6", 1))}


def test_versions_needs_a_name_without_a_topology(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert edgefn(capsys, "versions", "--data", str(tmp_path)) == (  # a usage error: 2
        2, "", "edgefn versions: give a function NAME, or --topology RUN_DIR\n")


def test_versions_marks_a_live_canary(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pop_thread(tmp_path / "data") as pop:
        data = str(pop.data)
        assert edgefn(capsys, "deploy", fn(tmp_path, "c7", 1), "--data", data)[0] == 0
        assert edgefn(capsys, "deploy", fn(tmp_path, "c7", 2), "--canary", "25%",
                      "--data", data)[0] == 0
        status, out, _ = edgefn(capsys, "versions", "c7", "--data", data)
    v1, v2 = version(fn(tmp_path, "c7", 1)), version(fn(tmp_path, "c7", 2))
    lines = out.splitlines()
    assert status == 0 and len(lines) == 2
    assert lines[0].startswith(f"~ {v2}  ") and lines[0].endswith("  (canary, 25% of requests)")
    assert lines[1].startswith(f"* {v1}  ") and "canary" not in lines[1]


def test_versions_exits_1_when_a_pop_does_not_answer(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """It listed the PoP as unreachable and exited 0: a script took the listing as
    complete."""
    from runtime.topology.rundir import PopEntry, RunState, pop_dir, write_state

    write_state(tmp_path, RunState(pops=[PopEntry(name="ghost", tier="edge")]))
    pop_dir(tmp_path, "ghost").mkdir(parents=True)  # no PoP runs on it
    status, out, err = edgefn(capsys, "versions", "--topology", str(tmp_path))
    assert status == 1 and "ghost" in out and "(unreachable)" in out
    assert err == "edgefn: not checked on ghost (not answering)\n"
