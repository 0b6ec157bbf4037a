"""Where a running topology keeps its PoPs: the one layout the topology runner
and the control plane share.

    RUN_DIR/
      topology.json        what `edgefn topology up` started (`RunState`)
      pops/<name>/         each PoP's data dir (pop.json, admin.token, deploys, stores)

A PoP's data dir is an ordinary one, so `AdminClient(pop_dir(run, name))` talks to it
as to any PoP started with `edgefn serve --data`.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from edgefn_core.errors import Failure

STATE = "topology.json"


class PopEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One PoP of a running topology."""

    name: str
    tier: str  # edge | regional | central
    geo: str = ""
    region: str = ""
    parents: list[str] = []
    public: str = ""  # the PoP's own listener, http://host:port
    pid: int = 0
    functions: list[str] = []  # the names of the functions `topology up` deployed on it


class RunState(msgspec.Struct, kw_only=True):
    """The topology file it came from and its PoPs, in start order."""

    source: str = ""
    pops: list[PopEntry] = []


def pop_dir(run: str | Path, name: str) -> Path:
    return Path(run) / "pops" / name


def pop_names(run: str | Path) -> list[str]:
    """The PoPs with a data dir under `run`, sorted by name (empty if none)."""
    pops = Path(run) / "pops"
    return sorted(p.name for p in pops.iterdir() if p.is_dir()) if pops.is_dir() else []


def read_state(run: str | Path) -> RunState | None:
    """The run's state, or None if nothing was started there. Raises `Failure`
    (``topology_state_unreadable``) for a file that is not one (status, down and up
    crashed with a traceback)."""
    path = Path(run) / STATE
    try:
        return msgspec.json.decode(path.read_bytes(), type=RunState)
    except FileNotFoundError:
        return None
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise Failure("topology_state_unreadable", 500,
                      f"{path} is not a topology's state ({e}); if no topology runs from "
                      f"{run}, delete it and run `edgefn topology up` again") from None


def write_state(run: str | Path, state: RunState) -> None:
    """Written to a temporary file and renamed, so a reader never sees half of it."""
    path = Path(run) / STATE
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(state)))
    tmp.replace(path)
