"""CPU time of processes under load, split into user and kernel (system) time, for
the benchmarks' "where the time goes" columns.

``Meter(pids)`` reads ``/proc/<pid>/stat`` of each process (all its threads) when
made and at ``stop()``; ``stop()`` also reads what this process's waited-for
children (wrk, once it exits) used meanwhile. Linux only; the kernel's clock ticks
(100 a second here) bound the resolution: a 5 s run at one core is 500 ticks.
"""

from __future__ import annotations

import os
import resource
import subprocess
from dataclasses import dataclass

TICK = 1.0 / os.sysconf("SC_CLK_TCK")


def times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process `pid`, all its threads. Raises
    RuntimeError once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError as e:
        raise RuntimeError(f"process {pid} is gone") from e
    fields = stat[stat.rindex(b")") + 2:].split()  # the name may hold spaces
    return int(fields[11]) * TICK, int(fields[12]) * TICK  # utime, stime (fields 14, 15)


def descendants(pid: int) -> list[int]:
    """The processes under `pid` (children, theirs, ...)."""
    found, todo = [], [pid]
    while todo:
        out = subprocess.run(["pgrep", "-P", str(todo.pop())], capture_output=True,
                             text=True).stdout.split()
        found += [int(p) for p in out]
        todo += [int(p) for p in out]
    return found


def isolate_hosts(pop: int) -> list[int]:
    """The isolate host processes under the PoP `pop` (the active one and its
    standby; none for a PoP that runs no Python function)."""
    hosts = []
    for pid in descendants(pop):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"runtime.executors.python.host" in f.read():
                    hosts.append(pid)
        except OSError:
            continue  # (a process that ended meanwhile)
    return hosts


def _children() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime, usage.ru_stime


@dataclass
class Used:
    """CPU seconds a meter saw: of its processes (user, system) and of this
    process's children that ended meanwhile (the load generator)."""

    user: float
    system: float
    client: float

    def per_request_us(self, requests: float) -> tuple[float, float, float]:
        """(all, system, client) microseconds a request."""
        return ((self.user + self.system) / requests * 1e6, self.system / requests * 1e6,
                self.client / requests * 1e6)


class Meter:
    """What `pids` (and the children this process waits for) use from now to `stop()`."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.start = [times(p) for p in pids]
        self.children = _children()

    def stop(self) -> Used:
        """Raises RuntimeError if one of the processes is gone."""
        end = [times(p) for p in self.pids]
        user = sum(e[0] - s[0] for e, s in zip(end, self.start, strict=True))
        system = sum(e[1] - s[1] for e, s in zip(end, self.start, strict=True))
        children = _children()
        client = sum(children) - sum(self.children)
        return Used(user, system, client)
