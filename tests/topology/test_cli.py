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


def _two_pops_with_redis(folder: Path) -> Path:
    from tests.topologies import network, pop

    (folder / "topology.toml").write_text(
        network(5, 10, 20) + '[[region]]\nname = "r"\nredis = true\n'
        + pop("central", "central", region="r")
        + pop("edge", "edge", geo="g", region="r", parents=["central"]))
    return folder / "topology.toml"


def test_up_after_a_crash_down_twice_and_status_after_down(tmp_path: Path) -> None:
    """An `up` over a run whose PoPs all died stops what that run left (links, Redis)
    instead of leaking it; `down` stops everything, and a second `down` stops nothing
    (no stale process group is signalled)."""
    from runtime.topology import runner
    from runtime.topology.rundir import read_state

    toml, run = _two_pops_with_redis(tmp_path), tmp_path / "run"
    cli = ["topology", "--dir", str(run)]
    try:
        assert _cli(*cli[:1], "up", str(toml), *cli[1:]).returncode == 0
        first = runner.read_network(run)
        state = read_state(run)
        assert state is not None
        (run / "pops" / "ghost").mkdir()  # a data dir no PoP of this run has
        edge = next(p for p in state.pops if p.name == "edge")
        runner.os.kill(edge.pid, 9)
        purge = _cli("cache", "purge", "--ai", "--topology", str(run))
        assert purge.returncode == 1
        result = json.loads(purge.stdout)
        assert result["purged"] == {"central": 0} and list(result["failed"]) == ["edge"]
        message = json.loads(purge.stderr)["error"]["message"]
        assert message.startswith("not purged on edge (") and "ghost" not in message
        nope = _cli("topology", "restart", "nope", "--dir", str(run))  # a PoP it has not
        assert nope.returncode == 1
        assert json.loads(nope.stderr)["error"]["message"].endswith("has no PoP 'nope'; it "
                                                                   "has central, edge")
        # the killed edge comes back on its own: same port, same functions
        back = json.loads(_cli("topology", "restart", "edge", "--dir", str(run)).stdout)
        assert back["pid"] != edge.pid and runner.alive(back["pid"])
        rows = json.loads(_cli("topology", "status", "--dir", str(run)).stdout)
        assert [(r["name"], r["health"]) for r in rows] == [("central", "ready"),
                                                             ("edge", "ready")]
        state = read_state(run)
        assert state is not None
        for p in state.pops:
            runner.os.kill(p.pid, 9)
        up = _cli(*cli[:1], "up", str(toml), *cli[1:])
        assert up.returncode == 0, up.stderr
        old = [first.links_pid, *first.redis_pids.values()]
        assert not any(runner.alive(pid) for pid in old)
        second = runner.read_network(run)
        new = [second.links_pid, *second.redis_pids.values()]
        down = json.loads(_cli(*cli[:1], "down", *cli[1:]).stdout)
        assert sorted(down["stopped"]) == ["central", "edge", "links", "redis-r"]
        assert not any(runner.alive(pid) for pid in new) and runner.stragglers(run) == []
        assert json.loads(_cli(*cli[:1], "down", *cli[1:]).stdout) == {"stopped": []}
        rows = json.loads(_cli(*cli[:1], "status", *cli[1:]).stdout)
        assert [r["health"] for r in rows] == ["stopped", "stopped"]
        # the table says so of links and Redis too (Redis went unnamed after `down`)
        text = subprocess.run([sys.executable, "-m", "runtime.cli", "topology", "status",
                               "--dir", str(run)], cwd=ROOT, text=True, capture_output=True,
                              timeout=60, env={"PYTHONPATH": str(ROOT),
                                               "PATH": "/usr/bin:/bin"}).stdout
        assert "links: stopped" in text and "redis r: stopped" in text, text
    finally:
        from runtime.topology import runner as r

        r.down(run)


def test_ctrl_c_during_up_stops_what_had_started(tmp_path: Path) -> None:
    import signal
    import time

    from runtime.topology import runner

    toml, run = _two_pops_with_redis(tmp_path), tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "topology", "up", str(toml),
                             "--dir", str(run)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        deadline = time.monotonic() + 60
        while not (run / "topology.json").exists():  # links, Redis and the PoPs started
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        net = runner.read_network(run)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode != 0 and "interrupted; stopped what had started" in err
        assert not any(runner.alive(pid) for pid in [net.links_pid, *net.redis_pids.values()])
        assert runner.stragglers(run) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        runner.down(run)
