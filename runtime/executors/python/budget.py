"""An isolate host's address-space budget: the `RLIMIT_AS` cap it sets at start,
and, before each interpreter it starts, whether there is still room for one.

Why a host must be replaced now and then: CPython 3.13 does not give back all of
a destroyed isolated interpreter's memory (its allocator keeps the arenas of any
object that outlives it), so every recycle leaves ~8 MiB of address space (and
~7 MiB resident) behind in the host, whatever the function does: the brand-new
interpreter importing only the SDK and the guest loop, `gc.collect()` before
destroying it and `malloc_trim` after did not change that. Recycling often would
sooner or later run the host into its own cap. So the cap holds the isolates'
shares plus `RECYCLE_ROOM` for that residue, and the host asks the PoP to be
replaced (`wire.RETIRE`) while a fresh interpreter still gets its full share,
and stops starting interpreters once it would not.

Pure arithmetic plus a read of /proc/self/statm: unit-tested without processes.
"""

from __future__ import annotations

import enum
import os
import resource

MIB = 1 << 20
# An interpreter with its imports, its thread's and its watchdog's stacks, and
# glibc's per-thread malloc arena (the host runs with MALLOC_ARENA_MAX=2).
ISOLATE_OVERHEAD = 64 * MIB
# What destroyed interpreters may leave behind (~8 MiB each) before the host is
# replaced: 15 recycles or more per host (more with more isolates or memory_mb).
RECYCLE_ROOM = 256 * MIB
# Asked to be replaced this much before it would have to stop starting interpreters:
# a few more recycles (~8 MiB each) while the PoP swaps in another host.
HANDOVER = 64 * MIB


class Room(enum.Enum):
    OK = "ok"  # start the next interpreter
    REPLACE = "replace"  # start it, and ask the PoP to replace this host
    FULL = "full"  # do not start it: its share no longer fits under the cap


def share(memory_mb: int) -> int:
    """What one isolate is entitled to under the cap: `memory_mb` plus its overhead."""
    return memory_mb * MIB + ISOLATE_OVERHEAD


def cap(size_at_start: int, memory_mb: int, isolates: int) -> int:
    """The host's address-space cap: its size before any isolate starts, a share
    per isolate, and room for what recycled interpreters leave behind."""
    return size_at_start + isolates * share(memory_mb) + RECYCLE_ROOM


def room(headroom: int | None, memory_mb: int) -> Room:
    """Whether the next interpreter may start, given the address space left under
    the cap right now (None: no cap). It needs its full share; the host asks to be
    replaced `HANDOVER` before that runs out."""
    if headroom is None:
        return Room.OK
    need = share(memory_mb)
    if headroom < need:
        return Room.FULL
    if headroom < need + HANDOVER:
        return Room.REPLACE
    return Room.OK


def address_space() -> int:
    """This process's address space now, in bytes (VmSize: what RLIMIT_AS counts)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def headroom() -> int | None:
    """Bytes left under this process's RLIMIT_AS; None when it has none."""
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    return limit - address_space()
