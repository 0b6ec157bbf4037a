"""`edgefn topology` refuses what it cannot use with one clear line, and starts nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.cli", *argv, "--json"], cwd=ROOT,
                          text=True, capture_output=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_up_with_a_bad_file_names_the_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "topology.toml"
    bad.write_text('[[pop]]\nname = "c"\ntier = "central"\n[[pop]]\nname = "e"\n'
                   'tier = "edge"\ngeo = "x"\nparents = ["nowhere"]\n')
    out = _cli("topology", "up", str(bad), "--dir", str(tmp_path / "run"))
    assert out.returncode == 1 and out.stdout == ""
    error = json.loads(out.stderr)["error"]
    assert error["code"] == "invalid_config"
    assert error["message"] == (f"{bad}: field `pop[1].parents[0]`: no PoP is named "
                                "'nowhere'")
    assert not (tmp_path / "run").exists()


def test_status_and_load_where_nothing_runs(tmp_path: Path) -> None:
    for argv in (("status",), ("load", "--geo", "eu-west")):
        out = _cli("topology", *argv, "--dir", str(tmp_path))
        assert out.returncode == 1
        assert json.loads(out.stderr)["error"]["code"] == "no_topology", argv


def test_up_status_versions_and_down_with_a_relative_dir(tmp_path: Path) -> None:
    """`make topology` passes ``--dir .topology``: every path a PoP's config names must
    still lead to the run directory (it once led to RUN/pops/NAME/RUN/pops/NAME, so no
    model worker started and no PoP became ready). Then `edgefn versions --topology`
    flags no drift for a function the file gave one PoP only."""
    from tests.topologies import HELLO, network, pop

    (tmp_path / "topology.toml").write_text(
        network(10, 20, 40) + pop("central", "central")
        + pop("edge", "edge", geo="g", parents=["central"], functions=[HELLO]))

    def cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "runtime.cli", "topology", *argv,
                               "--dir", "run", "--json"], cwd=tmp_path, text=True,
                              capture_output=True, timeout=timeout,
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})

    try:
        up = cli("up", "topology.toml", "--timeout", "90", timeout=150)
        assert up.returncode == 0, up.stderr
        assert json.loads(up.stdout)["pops"] == 2
        status = json.loads(cli("status").stdout)
        assert [(p["name"], p["health"]) for p in status] == [("central", "ready"),
                                                              ("edge", "ready")]
        # the edge-only function the file gave is not drift (central never had it)
        out = subprocess.run([sys.executable, "-m", "runtime.cli", "versions", "--topology",
                              "run", "--json"], cwd=tmp_path, text=True, capture_output=True,
                             timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        shown = json.loads(out.stdout)
        assert (shown["declared"], shown["drift"]) == ({"central": [], "edge": ["hello"]}, {})
        assert list(shown["pops"]["edge"]) == ["hello"] and shown["pops"]["central"] == {}
        rows = {r["name"]: r for r in json.loads(cli("status").stdout)}
        assert rows["central"]["functions"] == {} and rows["central"]["drift"] == []
        assert list(rows["edge"]["functions"]) == ["hello"] and rows["edge"]["drift"] == []
        # another version of it on central, out of band: that is drift, on both
        other = tmp_path / "hello-2"
        shutil.copytree(HELLO, other)
        with open(other / "edgefn.toml", "a") as f:
            f.write('\n[env]\nV = "2"\n')
        deployed = subprocess.run([sys.executable, "-m", "runtime.cli", "deploy", str(other),
                                   "--data", "run/pops/central"], cwd=tmp_path, text=True,
                                  capture_output=True, timeout=60,
                                  env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert deployed.returncode == 0, deployed.stderr
        rows = {r["name"]: r for r in json.loads(cli("status").stdout)}
        assert rows["central"]["drift"] == rows["edge"]["drift"] == ["hello"]
        text = subprocess.run([sys.executable, "-m", "runtime.cli", "topology", "status",
                               "--dir", "run"], cwd=tmp_path, text=True, capture_output=True,
                              timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert text.stdout.splitlines()[-1] == ("drift: hello (`edgefn versions --topology` "
                                                "says where)"), text.stdout
        assert "FUNCTIONS" in text.stdout.splitlines()[0] and " DRIFT" in text.stdout
    finally:
        down = cli("down")
    assert down.returncode == 0, down.stderr
    assert not list(tmp_path.glob("run/pops/*/run"))  # nothing made under a doubled path
