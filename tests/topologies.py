"""Small topologies for tests, written once: a ``[[pop]]`` table, a ``[network]``
of fixed delays, and `running`, which starts one from its text and stops it after,
waiting for every process it started."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from runtime.topology import runner, spec
from runtime.topology.rundir import read_state
from tests.support import EXAMPLES

HELLO = EXAMPLES / "hello-wat"


def pop(name: str, tier: str, *, geo: str = "", region: str = "",
        parents: Iterable[str] = (), functions: Iterable[Path | str] = (),
        settings: str = "", models: Iterable[str] = (), worker_config: str = "") -> str:
    """One ``[[pop]]`` table; `settings`: TOML after it (``[pop.settings.x]`` tables)."""
    lines = ["[[pop]]", f'name = "{name}"', f'tier = "{tier}"']
    lines += [f"models = {json.dumps(list(models))}"] if models else []
    lines += [f'worker_config = "{worker_config}"'] if worker_config else []
    lines += [f'geo = "{geo}"'] if geo else []
    lines += [f'region = "{region}"'] if region else []
    lines += [f"parents = {json.dumps(list(parents))}"] if parents else []
    lines += [f"functions = {json.dumps([str(f) for f in functions])}"] if functions else []
    return "\n".join(lines) + "\n" + settings


def network(client_edge: float, edge_regional: float, central: float, **more: object) -> str:
    """A ``[network]`` of fixed round trips (ms) and no jitter; `more`: other keys."""
    rows = {"client_edge_rtt_ms": [client_edge] * 2, "edge_regional_rtt_ms": [edge_regional] * 2,
            "central_rtt_ms": [central] * 2, "jitter_ms": 0.0, **more}
    return "[network]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in rows.items())


# two regions, and tenant acme-eu pinned to emea
EMEA_PINNED = """[[region]]
name = "emea"
[[region]]
name = "americas"
[[tenant]]
name = "acme-eu"
residency = "emea"
"""

# central, one regional and one edge (geography eu-west): the smallest with every tier
SMALL = (pop("central", "central") + pop("reg", "regional", parents=["central"])
         + pop("edge", "edge", geo="eu-west", parents=["reg", "central"]))


@contextmanager
def running(folder: Path, text: str, timeout: float = 300) -> Iterator[Path]:
    """The topology of `text` (written to FOLDER/topology.toml) running in
    FOLDER/run; on exit it is stopped and every process it started waited for.
    Raises what `runner.up` raises."""
    (folder / "topology.toml").write_text(text)
    run = folder / "run"
    runner.up(spec.load(folder / "topology.toml"), run, "test", timeout=timeout)
    try:
        yield run
    finally:
        state, net = read_state(run), runner.read_network(run)
        pops = state.pops if state is not None else []
        ours = {net.links_pid, *net.redis_pids.values(), *(p.pid for p in pops)}
        runner.down(run)
    assert ours.isdisjoint(runner.unreaped()), "a process of the topology was not waited for"
