"""Two guards of a rollout across three real PoPs (the `topology` fixture), each
of which would otherwise leave the PoPs apart:

- staging that succeeds everywhere but with another version on some PoP is a
  failure: one `activate` would switch the PoPs to different code, so the rollout
  is refused and what was staged is aborted on every PoP;
- a PoP whose switch fails keeps no staged version behind once the rollout is
  undone: the version it staged is aborted there too (else it stays loaded and
  a later activate of it, by hand or by another rollout, switches that PoP alone).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefn_core.errors import AdminError, RolloutError
from runtime.functions import deploys
from runtime.topology import rollout
from tests.rollout.helpers import Member, Topology
from tests.rollout.test_topology import current, everywhere, package
from tests.support import function_dir, reactor


def not_staged(pop: Member, name: str, version: str) -> None:
    """Nothing of `name`@`version` is left on `pop`: no files, nothing to activate."""
    assert not (pop.data / "versions" / name / version).exists()
    with pytest.raises(AdminError, match="is not staged on this PoP"):
        pop.admin.request("POST", f"/v1/functions/{name}/activate",
                          f'{{"version": "{version}"}}'.encode())


def test_pops_that_staged_different_versions_are_all_aborted(topology: Topology,
                                                             tmp_path: Path) -> None:
    pops = rollout.pops_of(topology.run)
    v1 = rollout.deploy(pops, package(tmp_path, "g1", 1)).version
    blobs = {"edge-a": package(tmp_path, "g1", 2), "edge-b": package(tmp_path, "g1", 2),
             "central": package(tmp_path, "g1", 3)}
    v2, v3 = (deploys.version_of(deploys.from_tar(blobs[p])) for p in ("edge-a", "central"))
    assert len({v1, v2, v3}) == 3
    with pytest.raises(RolloutError) as err:
        rollout.stage(pops, lambda pop, c: c.request("POST", "/v1/stage", blobs[pop]))
    assert str(err.value).startswith("PoPs staged different versions: ")
    assert v2 in str(err.value) and v3 in str(err.value)
    assert str(err.value).endswith("; aborted everywhere: no PoP changed")
    for name, pop in topology.pops.items():
        not_staged(pop, "g1", v3 if name == "central" else v2)
    assert current(topology, "g1") == dict.fromkeys(topology.pops, v1)
    assert everywhere(topology, "/g1") == dict.fromkeys(topology.pops, v1)


def test_a_pop_whose_switch_failed_keeps_nothing_staged(topology: Topology,
                                                        tmp_path: Path) -> None:
    pops = rollout.pops_of(topology.run)
    v1 = rollout.deploy(pops, package(tmp_path, "g2", 1)).version
    blob = package(tmp_path, "g2", 2, ["/g2", "/g2-extra"])
    staged = rollout.stage(pops, lambda _, c: c.request("POST", "/v1/stage", blob))
    v2 = staged[0].value["version"]
    # meanwhile another function went live on central at a route v2 needs: its switch fails
    topology.pops["central"].deploy(function_dir(tmp_path, "g2x", reactor(""),
                                                 routes=["/g2-extra"]))
    with pytest.raises(RolloutError) as err:
        rollout.activate(pops, staged)
    assert str(err.value).startswith("activate failed on PoP central: ")
    assert str(err.value).endswith("put back on edge-a, edge-b")
    assert current(topology, "g2") == dict.fromkeys(topology.pops, v1)
    assert everywhere(topology, "/g2") == dict.fromkeys(topology.pops, v1)
    not_staged(topology.pops["central"], "g2", v2)
