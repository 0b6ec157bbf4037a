"""Start, inspect and stop a topology: the links process, Redis where a region asks
for it, and one `edgefn serve` process per PoP, each in a session of its own (so a
terminal's Ctrl-C does not reach it, and `down` can end its whole process group:
model worker and isolate hosts included).

RUN_DIR is laid out as `runtime.topology.rundir` says, plus RUN_DIR/network.json
(`plan.Network`) and RUN_DIR/links.json; each process logs to a file there.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from edgefn_core.errors import EdgefnError, Failure
from runtime.topology import plan
from runtime.topology.rundir import PopEntry, RunState, pop_dir, read_state, write_state
from runtime.topology.spec import Topology

NETWORK = "network.json"
ROOT = Path(__file__).resolve().parents[2]
# what this process started: kept, so no Popen is collected (and warns) while it runs
_children: list[subprocess.Popen[bytes]] = []


def up(topo: Topology, run: Path, source: str, timeout: float = 180.0) -> RunState:
    """Start everything in `topo` under `run` and wait until every PoP is ready
    (``/readyz``) and has its functions deployed. Raises `Failure` (code
    ``topology_running``) if a topology already runs there, ``topology_failed``
    (after stopping what it started) if a PoP exits or is not ready in `timeout`."""
    run = run.resolve()  # each PoP runs in its own folder: the paths its config names are whole
    state = read_state(run)
    if state is not None and any(alive(p.pid) for p in state.pops):
        raise Failure("topology_running", 409, f"a topology already runs in {run}: "
                      f"`edgefn topology down --dir {run}` first")
    run.mkdir(parents=True, exist_ok=True)
    down(run)  # what a run whose PoPs all died left: its links, Redis, model workers
    started = len(_children)
    try:
        ports = _start_network(run, topo)
        pops = [PopEntry(name=p.name, tier=p.tier, geo=p.geo, region=p.region,
                         parents=list(p.parents),
                         public=f"http://127.0.0.1:{ports.public[p.name]}",
                         pid=_spawn(pop_dir(run, p.name) / "pop.log", "-m", "runtime.cli",
                                    "serve", "--config", str(pop_dir(run, p.name) / "pop.toml")))
                for p in topo.pop]
        state = RunState(source=source, pops=pops)
        write_state(run, state)
        _wait_ready(run, state, time.monotonic() + timeout)
        deployed = _deploy(run, topo)
    except BaseException:  # a refusal, a PoP that died, Ctrl-C: nothing is left running
        down(run)
        for proc in _children[started:]:  # started before its pid was written down
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        _reap({c.pid for c in _children[started:]})
        raise
    state.pops = [msgspec.structs.replace(p, functions=deployed[p.name]) for p in pops]
    write_state(run, state)
    return state


def restart(run: Path, name: str, timeout: float = 120.0) -> PopEntry:
    """Start PoP `name` of the topology running in `run` again, with its own config
    and data dir (so it serves what it served, on the same port the links reach),
    stopping it first if it runs; returns its entry once it is ready. Raises
    `Failure`: ``no_topology``, ``not_found`` for a PoP the run does not have,
    ``topology_failed`` if it exits or is not ready in `timeout`."""
    run = run.resolve()
    state = read_state(run)
    if state is None:
        raise Failure("no_topology", 404, f"no topology was started in {run}")
    entry = next((p for p in state.pops if p.name == name), None)
    if entry is None:
        raise Failure("not_found", 404, f"the topology in {run} has no PoP {name!r}; it has "
                      f"{', '.join(p.name for p in state.pops)}")
    _stop_groups([entry.pid] if group_alive(entry.pid) else [])
    for pid in stragglers(pop_dir(run, name)):  # its model worker, orphaned by a kill -9
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    pid = _spawn(pop_dir(run, name) / "pop.log", "-m", "runtime.cli", "serve", "--config",
                 str(pop_dir(run, name) / "pop.toml"))
    entry = msgspec.structs.replace(entry, pid=pid)
    state.pops = [entry if p.name == name else p for p in state.pops]
    write_state(run, state)
    _wait_ready(run, RunState(pops=[entry]), time.monotonic() + timeout)
    return entry


def _start_network(run: Path, topo: Topology) -> plan.Network:
    """Write every PoP's config, start the links and Redis; RUN_DIR/network.json."""
    ports, links = plan.network(topo)
    for wanted in topo.region:
        if wanted.redis:
            ports.redis[wanted.name] = plan.free_port()
    plan.write(run, topo, ports)
    (run / "links.json").write_bytes(msgspec.json.encode(links))
    ports.links_pid = _spawn(run / "links.log", "-m", "runtime.topology.links",
                             str(run / "links.json"))
    for region, port in ports.redis.items():
        ports.redis_pids[region] = _spawn_redis(run, region, port)
    _write_network(run, ports)
    return ports


def _spawn(log: Path, *argv: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    _children.append(proc)
    return proc.pid


def _spawn_redis(run: Path, region: str, port: int) -> int:
    folder = run / f"redis-{region}"
    folder.mkdir(exist_ok=True)
    with open(folder / "redis.log", "ab") as out:
        proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(folder)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    _children.append(proc)
    return proc.pid


def read_network(run: Path) -> plan.Network:
    """Raises `Failure` (``no_topology``) if nothing was started under `run`."""
    try:
        return msgspec.json.decode((run / NETWORK).read_bytes(), type=plan.Network)
    except FileNotFoundError:
        raise Failure("no_topology", 404, f"no topology was started in {run}") from None


def _write_network(run: Path, ports: plan.Network) -> None:
    (run / NETWORK).write_bytes(msgspec.json.format(msgspec.json.encode(ports)))


def ready(url: str, timeout: float = 1.0) -> bool:
    """Whether the PoP at `url` answers 200 on ``/readyz``."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", "/readyz")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def _tail(log_file: Path, lines: int = 8) -> str:
    """The last `lines` lines of `log_file`, indented on lines of their own (the log
    may go with its run folder before anyone reads it), or "" when it is unreadable."""
    try:
        last = log_file.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "".join(f"\n    {line}" for line in last)


def _wait_ready(run: Path, state: RunState, deadline: float) -> None:
    waiting = list(state.pops)
    while waiting:
        for p in list(waiting):
            if not alive(p.pid):
                log_file = pop_dir(run, p.name) / "pop.log"
                raise Failure("topology_failed", 500, f"PoP {p.name} exited while starting; "
                              f"its log: {log_file}{_tail(log_file)}")
            if ready(p.public):
                waiting.remove(p)
        if waiting and time.monotonic() > deadline:
            raise Failure("topology_failed", 504, "not ready in time: " + ", ".join(
                p.name for p in waiting))
        time.sleep(0.1)


def _deploy(run: Path, topo: Topology) -> dict[str, list[str]]:
    """Deploy each PoP's `functions`; the names deployed, per PoP. Raises `EdgefnError`
    for a function a PoP refuses. A deploy whose pre-warm ran past a time limit (seen
    on a machine busy starting every PoP at once) is tried once more; any other
    refusal is final."""
    from runtime.admin.client import AdminClient

    deployed: dict[str, list[str]] = {}
    for p in topo.pop:
        names = deployed[p.name] = []
        for folder in p.functions:
            admin = AdminClient(pop_dir(run, p.name))
            try:
                result = admin.deploy(folder)
            except EdgefnError as e:
                if "wall-time limit" not in str(e):
                    raise
                result = admin.deploy(folder)
            names.append(str(result["name"]))
    return deployed


def alive(pid: int) -> bool:
    """Process `pid` exists and is not a zombie."""
    if pid <= 0:
        return False
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


def down(run: Path, grace: float = 15.0) -> list[str]:
    """SIGTERM every PoP, the links and Redis; SIGKILL each process group still there
    after `grace` seconds. Returns the names of what was running and is stopped; the
    run's files then name no process (pid 0), so a second `down` stops nothing and
    never signals a process group whose id has been reused since."""
    state = read_state(run)
    groups = {p.name: p.pid for p in state.pops} if state is not None else {}
    net: plan.Network | None = None
    with contextlib.suppress(Failure):
        net = read_network(run)
        groups |= {"links": net.links_pid, **{f"redis-{r}": p for r, p in net.redis_pids.items()}}
    groups = {name: pid for name, pid in groups.items() if group_alive(pid)}
    _stop_groups(list(groups.values()), grace)
    for pid in stragglers(run):  # a model worker whose PoP was killed (-9) outlives it
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if state is not None:
        state.pops = [msgspec.structs.replace(p, pid=0) for p in state.pops]
        write_state(run, state)
    if net is not None:
        # stopped, each still named (status lists "redis REGION: stopped", as links)
        net.links_pid, net.redis_pids = 0, dict.fromkeys(net.redis_pids, 0)
        _write_network(run, net)
    return list(groups)


def _stop_groups(pgids: list[int], grace: float = 15.0) -> None:
    """SIGTERM each process group, SIGKILL those still there after `grace` seconds,
    and wait for the ones this process started."""
    for pid in pgids:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(_group_alive(pid) for pid in pgids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pgids:
        _signal_group(pid, signal.SIGKILL)
    _reap(set(pgids))


def _reap(pids: set[int]) -> None:
    """Wait for those of `pids` this process started (SIGKILLed by now), and collect
    any other child that has ended (a PoP someone stopped and replaced): no zombie
    stays, and no `Popen` is collected still running (a ResourceWarning)."""
    for proc in [c for c in _children if c.pid in pids]:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
    _children[:] = [c for c in _children if c.poll() is None]


def unreaped() -> list[int]:
    """The processes this process started that no `down` has waited for."""
    return [c.pid for c in _children]


def stragglers(run: Path) -> list[int]:
    """Live processes whose command line names a path under `run`."""
    needle = str(run.resolve()).encode() + b"/"
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "cmdline").read_bytes() and alive(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _signal_group(pid: int, sig: signal.Signals) -> None:
    if pid > 0:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


def _group_alive(pgid: int) -> bool:
    """Whether any live process is in process group `pgid`."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[3]) == pgid:
                return True
    return False


def group_alive(pgid: int) -> bool:
    return pgid > 0 and _group_alive(pgid)
