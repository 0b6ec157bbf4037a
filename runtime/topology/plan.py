"""From a `Topology` to what `runner` starts: ports, the links between tiers, each
PoP's generated pop.toml and model-worker config. Pure: writes files, starts nothing.

Every PoP runs the same `edgefn serve`; its role is its config. The central PoP runs
the model worker (the packaged models, or `worker_config`); every other PoP's worker
embeds locally (MiniLM, for its semantic cache), runs the chat models its ``models``
names (a regional's, `runtime.topology.models`) and sends chat and completion
requests for the others central serves through its uplink, a link whose routes are
its parents in order, so each tier's ``ai_cache`` is a cache tier and a dead parent
is skipped.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import Any

import msgspec

from gpu_worker.config import DEFAULT_EMBED, ModelSpec, WorkerConfig
from runtime.topology import models, residency
from runtime.topology.links import LinksConfig, LinkSpec, Route
from runtime.topology.rundir import pop_dir
from runtime.topology.spec import PopSpec, Topology

CHAT_MODELS = models.chat_models(WorkerConfig())  # what the packaged models serve


class Network(msgspec.Struct, kw_only=True):
    """RUN_DIR/network.json: the links process, Redis servers and where clients enter."""

    links_pid: int = 0
    entries: dict[str, int] = {}  # geography -> its anycast port (home edge first)
    direct: dict[str, int] = {}  # geography -> a port straight to central (no edge)
    uplinks: dict[str, int] = {}  # PoP -> the port its worker forwards to
    redis: dict[str, int] = {}  # region -> Redis port
    redis_pids: dict[str, int] = {}
    public: dict[str, int] = {}  # PoP -> its own public port


def free_port() -> int:
    """A loopback port nothing listens on now, below the kernel's ephemeral range when
    one is free there: a port from that range may be taken, before the PoP or link
    binds it, by any process's outgoing connection (a PoP then exits while starting),
    while one below it is taken only by a listener that asks for it."""
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(50):
        port = rng.randrange(max(1024, low - 12000), low)
        if port in _GIVEN:  # not twice to one process: a plan holds none of them open
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _GIVEN.add(port)
            return port
    with socket.socket() as s:  # nothing free below the range: any port
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_GIVEN: set[int] = set()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default: 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def one_way_ms(seed: int, a: str, b: str, rtt: tuple[float, float]) -> float:
    """Half a round trip drawn once for the pair (a, b) from `rtt`."""
    return random.Random(f"{seed}:{a}:{b}").uniform(*rtt) / 2


def network(topo: Topology) -> tuple[Network, LinksConfig]:
    """Ports for every PoP and link, and the links' routes."""
    net = topo.network
    ports = Network(public={p.name: free_port() for p in topo.pop})
    links: list[LinkSpec] = []
    for p in topo.pop:
        if p.parents:
            ports.uplinks[p.name] = free_port()
            links.append(LinkSpec(name=f"{p.name}-up", port=ports.uplinks[p.name],
                                  routes=[_route(topo, p.name, q, ports) for q in p.parents]))
    central = next(p for p in topo.pop if p.tier == "central")
    for edge in topo.edges():
        ports.entries[edge.geo] = free_port()
        links.append(LinkSpec(name=f"client-{edge.geo}", port=ports.entries[edge.geo],
                              routes=_anycast(topo, edge, ports)))
        ports.direct[edge.geo] = free_port()
        links.append(LinkSpec(name=f"direct-{edge.geo}", port=ports.direct[edge.geo], routes=[
            Route(name=central.name, port=ports.public[central.name],
                  delay_ms=one_way_ms(net.seed, edge.geo, central.name, net.central_rtt_ms))]))
    return ports, LinksConfig(jitter_ms=net.jitter_ms, loss=net.loss, seed=net.seed,
                              retransmit_ms=net.retransmit_ms,
                              health_interval_s=net.health_interval_s, links=links)


def _route(topo: Topology, child: str, parent: str, ports: Network) -> Route:
    net = topo.network
    rtt = net.central_rtt_ms if topo.named(parent).tier == "central" else net.edge_regional_rtt_ms
    return Route(name=parent, port=ports.public[parent],
                 delay_ms=one_way_ms(net.seed, child, parent, rtt))


def _anycast(topo: Topology, home: PopSpec, ports: Network) -> list[Route]:
    """The geography's edge first, then the other edges of its region, then the
    rest, nearest first in each (failing over to an edge of another region sent a
    pinned tenant's requests out of their region, to a 451, while an edge of theirs
    was up)."""
    net = topo.network
    others = [(e.region != home.region,
               Route(name=e.name, port=ports.public[e.name],
                     delay_ms=one_way_ms(net.seed, home.geo, e.name, net.reroute_rtt_ms)))
              for e in topo.edges() if e.name != home.name]
    own = Route(name=home.name, port=ports.public[home.name],
                delay_ms=one_way_ms(net.seed, home.geo, home.name, net.client_edge_rtt_ms))
    return [own, *(r for _, r in sorted(others, key=lambda o: (o[0], o[1].delay_ms)))]


def pop_settings(run: Path, p: PopSpec, ports: Network) -> dict[str, Any]:
    """The pop.toml of `p`: its own `settings`, then what the topology decides."""
    data = pop_dir(run, p.name)
    raw: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v)
                           for k, v in p.settings.items()}
    raw.update(name=p.name, tier=p.tier, geo=p.geo, data=str(data))
    raw["public"] = {**raw.get("public", {}), "host": "127.0.0.1", "port": ports.public[p.name]}
    ai = {"enabled": True, "worker_config": str(data / "models.toml")}
    if p.tier == "central":
        ai = {"enabled": True, **({"worker_config": p.worker_config} if p.worker_config
                                  else {})}
    raw["ai"] = {**ai, **raw.get("ai", {})}  # [pop.settings.ai] (`fallback` ...) was dropped
    if p.region in ports.redis:
        raw["ratelimit"] = {**raw.get("ratelimit", {}),
                            "storage": f"redis://127.0.0.1:{ports.redis[p.region]}"}
    return raw


def worker_settings(p: PopSpec, ports: Network, central: WorkerConfig | None = None
                    ) -> dict[str, Any]:
    """A non-central PoP's model worker: MiniLM here, the models `p` serves itself
    (as `central`, default the packaged config, declares them), the other chat
    models through the uplink (no `openai` entry when none is left)."""
    central = central or WorkerConfig()
    entries: list[ModelSpec] = [ModelSpec(DEFAULT_EMBED, "onnx", threads=1),
                                *models.local_specs(central, p)]
    up = models.forwarded(central, p)
    if up:
        entries.append(ModelSpec("parents", "openai", models=up, timeout=120.0,
                                 url=f"http://127.0.0.1:{ports.uplinks[p.name]}/v1"))
    return {"models": msgspec.to_builtins(entries)}


def write(run: Path, topo: Topology, ports: Network) -> None:
    """Each PoP's data dir with its pop.toml (and models.toml where it forwards).
    Raises `WorkerConfigError` if central's worker config cannot be read."""
    central = models.central_config(topo)
    for p in topo.pop:
        data = pop_dir(run, p.name)
        data.mkdir(parents=True, exist_ok=True)
        settings = {**pop_settings(run, p, ports), **residency.pop_fields(
            run, topo, p, ports, models.forwarded(central, p))}
        (data / "pop.toml").write_bytes(msgspec.toml.encode(settings))
        if p.parents:
            (data / "models.toml").write_bytes(
                msgspec.toml.encode(worker_settings(p, ports, central)))
