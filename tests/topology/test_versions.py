"""Drift across a topology's PoPs: which PoPs should serve a function (those the
topology file gave it, until another PoP serves it too; then every PoP)."""

from __future__ import annotations

from runtime.topology.versions import ABSENT, Served, drift

POPS = ["central", "reg", "edge-a", "edge-b"]


def served(**per_pop: str) -> dict[str, dict[str, Served]]:
    """PoP -> {"f": version} for the PoPs given, {} for the others."""
    return {p: ({"f": Served(per_pop[p.replace("-", "_")])} if p.replace("-", "_") in per_pop
                else {}) for p in POPS}


EDGES_GIVEN = {"central": [], "reg": [], "edge-a": ["f"], "edge-b": ["f"]}


def test_a_function_the_topology_gave_only_the_edges_is_not_drift() -> None:
    assert drift(served(edge_a="v1", edge_b="v1"), EDGES_GIVEN) == {}


def test_an_edge_that_lost_its_function_or_serves_another_version_is_drift() -> None:
    assert drift(served(edge_a="v1"), EDGES_GIVEN) == {"f": {"edge-a": "v1", "edge-b": ABSENT}}
    assert drift(served(edge_a="v1", edge_b="v2"), EDGES_GIVEN) == {
        "f": {"edge-a": "v1", "edge-b": "v2"}}


def test_once_served_beyond_what_was_given_every_pop_should_serve_it() -> None:
    """A rollout (`deploy --topology`) puts it on every PoP: one it missed is drift."""
    assert drift(served(central="v2", reg="v2", edge_a="v2", edge_b="v2"), EDGES_GIVEN) == {}
    assert drift(served(central="v2", edge_a="v2", edge_b="v2"), EDGES_GIVEN) == {
        "f": {"central": "v2", "reg": ABSENT, "edge-a": "v2", "edge-b": "v2"}}


def test_without_what_was_given_every_pop_should_serve_it() -> None:
    assert drift(served(edge_a="v1", edge_b="v1")) == {
        "f": {"central": ABSENT, "reg": ABSENT, "edge-a": "v1", "edge-b": "v1"}}
    assert drift(served(central="v1", reg="v1", edge_a="v1", edge_b="v1")) == {}


def test_a_pinned_owners_function_is_expected_in_its_region_only() -> None:
    """`deploy --topology` rightly left the PoPs outside the owner's region as they
    were (they refuse it), and they were flagged as DRIFT for ever."""
    from runtime.topology.versions import Versions

    pops = {p: ({"f": Served("v1")} if p in ("reg", "edge-a") else {}) for p in POPS}
    regions = {"central": "americas", "reg": "emea", "edge-a": "emea", "edge-b": "americas"}
    v = Versions(pops, declared={}, regions=regions, pins={"acme-eu": "emea"},
                 owners={"f": "acme-eu"})
    assert v.drift() == {}
    pops["reg"] = {}  # a PoP of its region that lost it still is drift
    assert v.drift() == {"f": {"reg": ABSENT, "edge-a": "v1"}}
    unpinned = Versions(pops, declared={}, regions=regions, pins={}, owners={"f": "acme-eu"})
    assert unpinned.drift() == {"f": {p: "v1" if p == "edge-a" else ABSENT for p in POPS}}
