"""A function owned by a pinned tenant is deployed only on PoPs of its region: its
KV namespaces and vector indexes would otherwise be written outside it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from edgefn_core.errors import DeployError, RolloutError
from runtime import config
from runtime.functions import deploys
from runtime.pop import PoP
from tests.support import EXAMPLES


def pop(tmp_path: Path, region: str) -> PoP:
    return PoP(config.load(None, data=str(tmp_path), name="pop-a", region=region, **{
        "ai.enabled": False, "residency.tenants": {"examples": "emea"}}))


def deploy(p: PoP, folder: str) -> object:
    return asyncio.run(p.registry.deploy(deploys.pack_dir(EXAMPLES / folder)))


def test_a_pinned_owners_function_is_refused_outside_its_region(tmp_path: Path) -> None:
    p = pop(tmp_path, "americas")
    try:
        with pytest.raises(DeployError, match=r"tenant 'examples', pinned to region 'emea'; "
                                              r"PoP 'pop-a' is in region 'americas'"):
            deploy(p, "counter-py")  # owner = "examples"
        assert "counter-py" not in p.registry.functions
        deploy(p, "hello-wat")  # no owner: its own tenant, not pinned
        assert "hello" in p.registry.functions
    finally:
        p.close()


def test_in_its_region_it_deploys(tmp_path: Path) -> None:
    p = pop(tmp_path, "emea")
    try:
        deploy(p, "counter-py")
        assert "counter-py" in p.registry.functions
    finally:
        p.close()


def test_a_restart_outside_the_owners_region_does_not_serve_its_functions(
        tmp_path: Path) -> None:
    """Deployed where it was allowed, then the PoP restarted with the tenant pinned
    elsewhere: restore served it (a deploy of the same files was refused)."""
    p = PoP(config.load(None, data=str(tmp_path), name="pop-a", region="americas",
                        **{"ai.enabled": False}))
    try:
        deploy(p, "hello-wat")
        deploy(p, "counter-py")  # nobody is pinned yet
    finally:
        p.close()
    p = pop(tmp_path, "americas")

    async def restore() -> list[str]:  # on the loop, as `edgefn serve` does
        return p.registry.restore()

    try:
        errors = asyncio.run(restore())
        assert "counter-py" not in p.registry.functions and "hello" in p.registry.functions
        assert any(e.startswith("counter-py: ") and "pinned to region 'emea'" in e
                   for e in errors), errors
    finally:
        p.close()


def test_a_topology_rollout_skips_the_pops_outside_the_owners_region(tmp_path: Path) -> None:
    """`edgefn deploy --topology` of a pinned owner's function: the PoPs of its region
    take it, the others are left as they were (it aborted everywhere)."""
    from runtime.topology import rollout
    from tests.support import pop_process

    settings = 'region = "{}"\n[residency.tenants]\nexamples = "emea"\n'
    (tmp_path / "eu").mkdir()
    (tmp_path / "us").mkdir()
    with pop_process(tmp_path / "eu", settings.format("emea")) as eu, \
            pop_process(tmp_path / "us", settings.format("americas")) as us:
        assert eu.port and us.port
        pops = [("eu", tmp_path / "eu" / "data"), ("us", tmp_path / "us" / "data")]
        package = deploys.to_tar(deploys.pack_dir(EXAMPLES / "counter-py"))
        r = rollout.deploy(pops, package)
        assert r.changed and list(r.skipped) == ["us"]
        assert "pinned to region 'emea'" in r.skipped["us"]
        assert r.previous == {"eu": None}
        with pytest.raises(RolloutError, match="stage failed on PoP us: function 'counter-py' "
                                               "belongs to tenant 'examples', pinned to"):
            rollout.deploy(pops[1:], package)  # no PoP of its region: refused, named
