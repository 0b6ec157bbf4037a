"""What a topology's ``[[tenant]]`` pins and ``[samples]`` become in each PoP's
pop.toml: its ``region`` and a ``[residency]`` table (the pins, the tenants that
allow de-sensitised calls, the topology's shared secret, the samples: every
non-central PoP ships to central, which ingests; and the uplink: the models a PoP
forwards and the parents, with their tiers and regions, they may go to). The
secret is drawn once per run folder (RUN_DIR/secret, mode 0600)."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefn_core.secret_file import secret_file
from runtime.observe.samples import INGEST_PATH

if TYPE_CHECKING:
    from runtime.topology.plan import Network
    from runtime.topology.spec import PopSpec, Topology


def secret(run: Path) -> str:
    """The run's shared secret, drawn on first use (mode 0600)."""
    return secret_file(run / "secret", lambda: secrets.token_hex(24))


def pop_fields(run: Path, topo: Topology, p: PopSpec, ports: Network,
               forwarded: list[str]) -> dict[str, Any]:
    """``region`` and ``[residency]`` for `p`'s pop.toml; `forwarded`: the models a
    PoP with parents sends through its uplink."""
    central = next(q for q in topo.pop if q.tier == "central")
    samples: dict[str, Any] = {"rate": 0.0, "batch": topo.samples.batch,
                               "interval_s": topo.samples.interval_s}
    if p.tier == "central":
        samples["ingest"] = True
    else:
        samples["rate"] = topo.samples.rate
        samples["to"] = f"http://127.0.0.1:{ports.public[central.name]}{INGEST_PATH.decode()}"
    uplink = {"models": forwarded if p.parents else [], "pops": [
        {"pop": q.name, "tier": q.tier, "region": q.region}
        for q in map(topo.named, p.parents)]}
    return {"region": p.region, "residency": {
        "tenants": {t.name: t.residency for t in topo.tenant}, "secret": secret(run),
        "allow_desensitised": [t.name for t in topo.tenant if t.allow_desensitised],
        "samples": samples, "uplink": uplink}}
