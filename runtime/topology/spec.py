"""``topology.toml``: the PoPs of an emulated network and the links between them.

    [network]                          # the emulated links (see `runtime.topology.links`)
    seed = 14                          # each link's delay is drawn once from its range
    client_edge_rtt_ms = [5, 20]       # a client and its geography's edge
    edge_regional_rtt_ms = [20, 40]    # an edge and a regional PoP
    central_rtt_ms = [100, 180]        # any PoP and the central one
    reroute_rtt_ms = [30, 60]          # a client and another geography's edge (failover)
    jitter_ms = 1.0                    # each chunk: +- up to this much, order kept
    loss = 0.0                         # share of chunks that are "lost" and arrive late
    retransmit_ms = 200.0              # how late: TCP's minimum retransmission timeout
    health_interval_s = 0.2            # how often each link probes its targets' /readyz

    [[region]]
    name = "americas"
    redis = true                       # the region's PoPs share rate-limit counters in Redis

    [[pop]]
    name = "central"
    tier = "central"                   # edge | regional | central
    geo = "us-central"
    worker_config = ""                 # the model worker: default the packaged models

    [[pop]]
    name = "sa-east"
    tier = "edge"
    geo = "sa-east"                    # clients of this geography enter here
    region = "americas"
    parents = ["americas", "central"]  # tried in order: the first healthy one serves
    functions = ["hello-wat"]          # deployed once it is ready (relative to the file)
    # models = ["smollm2-135m"]        # regional only: central's llamacpp models it runs
                                       # itself (regional inference); others go to parents
    [pop.settings]                     # any pop.toml fields (waf, ai_cache, ...)

Errors are `InvalidConfig` naming the file and the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct, field

from edgefn_core import tomlconf
from edgefn_core.errors import InvalidConfig
from runtime.config import NAME_PATTERN, PopConfig
from runtime.security.principal import TENANT
from runtime.security.residency import not_a_tenant
from runtime.topology import models

Name = Annotated[str, Meta(pattern=NAME_PATTERN)]
Ms = Annotated[float, Meta(ge=0, le=60_000)]


class Network(Struct, forbid_unknown_fields=True, frozen=True):
    seed: int = 14
    client_edge_rtt_ms: tuple[Ms, Ms] = (5.0, 20.0)
    edge_regional_rtt_ms: tuple[Ms, Ms] = (20.0, 40.0)
    central_rtt_ms: tuple[Ms, Ms] = (100.0, 180.0)
    reroute_rtt_ms: tuple[Ms, Ms] = (30.0, 60.0)
    jitter_ms: Ms = 1.0
    loss: Annotated[float, Meta(ge=0, lt=1)] = 0.0
    retransmit_ms: Ms = 200.0
    health_interval_s: Annotated[float, Meta(gt=0, le=60)] = 0.2


class Region(Struct, forbid_unknown_fields=True, frozen=True):
    name: Name
    redis: bool = False


class Tenant(Struct, forbid_unknown_fields=True, frozen=True):
    name: Annotated[str, Meta(min_length=1, max_length=128)]
    residency: Name
    # its model calls that would leave the region go de-sensitised instead of refused
    allow_desensitised: bool = False


class Samples(Struct, forbid_unknown_fields=True, frozen=True):
    rate: Annotated[float, Meta(ge=0, le=1)] = 0.0
    batch: Annotated[int, Meta(ge=1, le=100_000)] = 200
    interval_s: Annotated[float, Meta(gt=0, le=3600)] = 1.0


class PopSpec(Struct, forbid_unknown_fields=True, frozen=True):
    name: Name
    tier: Literal["edge", "regional", "central"]
    geo: Annotated[str, Meta(max_length=64)] = ""
    region: str = ""
    parents: list[str] = []
    functions: list[str] = []
    worker_config: str = ""
    models: list[str] = []  # regional inference: see `runtime.topology.models`
    settings: dict[str, Any] = {}


class Topology(Struct, forbid_unknown_fields=True, frozen=True):
    network: Network = field(default_factory=Network)
    region: list[Region] = []
    pop: list[PopSpec] = []
    tenant: list[Tenant] = []
    samples: Samples = field(default_factory=Samples)

    def named(self, name: str) -> PopSpec:
        return next(p for p in self.pop if p.name == name)

    def edges(self) -> list[PopSpec]:
        return [p for p in self.pop if p.tier == "edge"]


def load(path: str | Path) -> Topology:
    """The topology in `path`, its relative paths resolved against its folder.
    Raises `InvalidConfig` naming the file and the field."""
    label = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise InvalidConfig(label, f"cannot read: {e.strerror}") from None
    topo = tomlconf.decode(raw, Topology, label)
    check(topo, label)
    topo = _resolved(topo, Path(path).resolve().parent)
    for i, p in enumerate(topo.pop):
        for j, folder in enumerate(p.functions):
            if not Path(folder).is_dir():
                raise InvalidConfig(label, f"no function folder {folder}",
                                    f"pop[{i}].functions[{j}]")
    models.check(topo, label)  # reads central's worker config: paths resolved first
    return topo


def check(topo: Topology, label: str) -> None:
    """What the schema cannot say. Raises `InvalidConfig`."""
    _check_ranges(topo.network, label)
    names = [p.name for p in topo.pop]
    for i, name in enumerate(names):
        if names.index(name) != i:
            raise InvalidConfig(label, f"PoP name {name!r} appears twice", f"pop[{i}].name")
    centrals = [i for i, p in enumerate(topo.pop) if p.tier == "central"]
    if len(centrals) != 1:
        raise InvalidConfig(label, f"a topology has exactly one central PoP, found "
                            f"{len(centrals)}", "pop")
    _once([r.name for r in topo.region], "region", label)
    _once([t.name for t in topo.tenant], "tenant", label)
    geos = [p.geo for p in topo.edges()]
    for i, p in enumerate(topo.pop):
        if p.tier == "edge" and p.geo and geos.count(p.geo) > 1:
            raise InvalidConfig(label, f"geography {p.geo!r} has two edges: its clients enter "
                                "at one edge (the others are its failover)", f"pop[{i}].geo")
    regions = {r.name for r in topo.region}
    for i, p in enumerate(topo.pop):
        _check_pop(topo, i, p, regions, label)
    _check_acyclic(topo, label)
    for i, t in enumerate(topo.tenant):
        if not TENANT.match(t.name):
            raise InvalidConfig(label, not_a_tenant(t.name), f"tenant[{i}].name")
        if t.residency not in regions:
            raise InvalidConfig(label, f"no [[region]] is named {t.residency!r}",
                                f"tenant[{i}].residency")


def _once(names: list[str], table: str, label: str) -> None:
    """Raises `InvalidConfig` for a name that appears twice in ``[[table]]``."""
    for i, name in enumerate(names):
        if names.index(name) != i:
            raise InvalidConfig(label, f"{table} name {name!r} appears twice",
                                f"{table}[{i}].name")


def _check_acyclic(topo: Topology, label: str) -> None:
    """Raises `InvalidConfig` when following parents can come back to a PoP: a call
    would go round between them until its client gave up."""
    parents = {p.name: p.parents for p in topo.pop}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = " -> ".join([*path[path.index(name):], name])
            i = next(k for k, p in enumerate(topo.pop) if p.name == path[-1])
            raise InvalidConfig(label, f"parents go round in a cycle ({cycle}); every "
                                "path must end at the central PoP", f"pop[{i}].parents")
        if name in done:
            return
        for parent in parents.get(name, []):
            visit(parent, [*path, name])
        done.add(name)

    for p in topo.pop:
        visit(p.name, [])


def _check_ranges(net: Network, label: str) -> None:
    for name in ("client_edge_rtt_ms", "edge_regional_rtt_ms", "central_rtt_ms",
                 "reroute_rtt_ms"):
        low, high = getattr(net, name)
        if low > high:
            raise InvalidConfig(label, f"range [{low}, {high}] goes down", f"network.{name}")


def _check_pop(topo: Topology, i: int, p: PopSpec, regions: set[str], label: str) -> None:
    tiers = {q.name: q.tier for q in topo.pop}
    if p.tier == "central" and p.parents:
        raise InvalidConfig(label, "the central PoP is the top tier: it has no parents",
                            f"pop[{i}].parents")
    for j, parent in enumerate(p.parents):
        if p.parents.index(parent) != j:
            raise InvalidConfig(label, f"{parent!r} is listed twice", f"pop[{i}].parents[{j}]")
        if parent not in tiers:
            raise InvalidConfig(label, f"no PoP is named {parent!r}", f"pop[{i}].parents[{j}]")
        if parent == p.name or tiers[parent] == "edge":
            raise InvalidConfig(label, f"{parent!r} cannot be a parent of {p.name!r}: a parent "
                                "is a regional or the central PoP", f"pop[{i}].parents[{j}]")
    if p.tier != "central" and not p.parents:
        raise InvalidConfig(label, f"{p.tier} PoP {p.name!r} needs at least one parent",
                            f"pop[{i}].parents")
    if p.region and topo.region and p.region not in regions:
        raise InvalidConfig(label, f"no [[region]] is named {p.region!r}", f"pop[{i}].region")
    if p.tier == "edge" and not p.geo:
        raise InvalidConfig(label, "an edge PoP names the geography its clients come from",
                            f"pop[{i}].geo")
    if p.worker_config and p.tier != "central":
        raise InvalidConfig(label, "only the central PoP runs a model worker of its own; "
                            "the others reach it through their parents", f"pop[{i}].worker_config")
    try:
        msgspec.convert(p.settings, PopConfig)
    except msgspec.ValidationError as e:
        inner = tomlconf.from_validation(label, str(e))
        where = f"pop[{i}].settings" + (f".{inner.field}" if inner.field else "")
        raise InvalidConfig(label, inner.reason, where) from None


def _resolved(topo: Topology, base: Path) -> Topology:
    pops = [msgspec.structs.replace(
        p, functions=[str(base / f) for f in p.functions],
        worker_config=str(base / p.worker_config) if p.worker_config else "")
        for p in topo.pop]
    return msgspec.structs.replace(topo, pop=pops)
