"""Fixtures: the registry's of tests/test_registry.py (shared, not written twice), and
three real PoPs with the run dir of a topology made of them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from runtime.topology import rundir
from tests.rollout.helpers import TIERS, Member, Topology
from tests.support import pop_process
from tests.test_registry import registry, wasm  # noqa: F401


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    """Three real PoPs (`edgefn serve` processes) with data dirs at RUN/pops/NAME and
    RUN/topology.json,
    shared by a module's tests: each test deploys functions of its own names."""
    run = tmp_path_factory.mktemp("run")
    (run / "pops").mkdir()
    with ExitStack() as stack:
        pops = {}
        for name in TIERS:
            proc = stack.enter_context(pop_process(tmp_path_factory.mktemp(name)))
            data = Path(proc.proc.args[-1])  # type: ignore[index]  # its --data
            rundir.pop_dir(run, name).symlink_to(data)
            pops[name] = Member(proc.host, proc.port, data)
        rundir.write_state(run, rundir.RunState(pops=[
            rundir.PopEntry(name=n, tier=TIERS[n], parents=[] if n == "central" else ["central"],
                            public=f"http://{p.host}:{p.port}") for n, p in pops.items()]))
        yield Topology(run, pops)
