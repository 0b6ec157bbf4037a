"""Which chat models a topology serves, and where: central runs every model of its
worker config (the packaged ones by default); a regional PoP may run some of
central's ``llamacpp`` models itself (``models = ["smollm2-135m"]`` in its
``[[pop]]``), and forwards the others to its parents, as every edge forwards all.

A regional runs the same `ModelSpec` central declares for such a model (engine,
weights, threads, batch, context), so both tiers answer alike; LoRA adapters and
models central reaches through an ``openai`` engine stay at central.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgefn_core.errors import InvalidConfig, WorkerConfigError
from gpu_worker import config as worker

if TYPE_CHECKING:
    from runtime.topology.spec import PopSpec, Topology


def central_config(topo: Topology) -> worker.WorkerConfig:
    """Central's model worker config: its `worker_config`, else the packaged models.
    Raises `WorkerConfigError` for a file that cannot be read or is not valid."""
    central = next(p for p in topo.pop if p.tier == "central")
    return worker.load(central.worker_config or None)


def chat_models(cfg: worker.WorkerConfig) -> list[str]:
    """The ids central generates with (its llamacpp models, adapters, and the ids
    of its `openai` engines), or the packaged chat model if it declares none."""
    names = [m.name for m in cfg.models if m.engine == "llamacpp"]
    names += [lo.name for lo in cfg.loras]
    names += [n for m in cfg.models if m.engine == "openai" for n in m.models]
    return names or [worker.DEFAULT_CHAT]


def local_specs(cfg: worker.WorkerConfig, p: PopSpec) -> list[worker.ModelSpec]:
    """The worker entries `p` runs itself: central's, for the names in `p.models`."""
    by_name = {m.name: m for m in cfg.models}
    return [by_name[name] for name in p.models]


def forwarded(cfg: worker.WorkerConfig, p: PopSpec) -> list[str]:
    """The chat models `p` sends through its uplink: all but those it serves (none
    for central, which has no uplink)."""
    if not p.parents:
        return []
    return [name for name in chat_models(cfg) if name not in p.models]


def check(topo: Topology, label: str) -> None:
    """Every PoP's `models`: only on regionals, each a llamacpp model of central's
    worker config, none twice; and that central's worker config can be read. Raises
    `InvalidConfig` naming the field."""
    at = next(i for i, p in enumerate(topo.pop) if p.tier == "central")
    try:
        cfg = central_config(topo)
    except WorkerConfigError as e:
        raise InvalidConfig(label, f"central's worker config: {e}",
                            f"pop[{at}].worker_config") from None
    runnable = [m.name for m in cfg.models if m.engine == "llamacpp"]
    for i, p in enumerate(topo.pop):
        _check_pop(i, p, runnable, label)


def _check_pop(i: int, p: PopSpec, runnable: list[str], label: str) -> None:
    if p.models and p.tier != "regional":
        raise InvalidConfig(label, f"only a regional PoP serves models itself; {p.tier} PoP "
                            f"{p.name!r} cannot (edges forward to their parents, central "
                            "serves its worker config's)", f"pop[{i}].models")
    for j, name in enumerate(p.models):
        if name not in runnable:
            raise InvalidConfig(label, f"central runs no llamacpp model {name!r}; a regional "
                                f"may serve: {', '.join(runnable) or '(none)'}",
                                f"pop[{i}].models[{j}]")
        if p.models.index(name) != j:
            raise InvalidConfig(label, f"model {name!r} appears twice", f"pop[{i}].models[{j}]")
