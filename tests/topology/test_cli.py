"""`edgefn topology` refuses what it cannot use with one clear line, and starts nothing."""

from __future__ import annotations

import json
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
