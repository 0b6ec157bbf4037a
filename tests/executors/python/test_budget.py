"""An isolate host's memory budget and its decision to ask to be replaced, without
a PoP: the arithmetic (`budget`), and the host's side of it (`host.check_room`)
with the measurement stubbed."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from runtime.executors.python import budget, host, wire
from runtime.executors.python.budget import HANDOVER, MIB, RECYCLE_ROOM, Room

LEAK = 8 * MIB + MIB // 2  # what one recycle left behind, measured on CPython 3.13.0


def test_the_cap_is_the_start_size_a_share_per_isolate_and_the_recycle_room() -> None:
    assert budget.share(64) == 128 * MIB
    assert budget.cap(20 * MIB, 64, 2) == 20 * MIB + 2 * 128 * MIB + RECYCLE_ROOM


@pytest.mark.parametrize(("memory_mb", "headroom", "verdict"), [
    (64, None, Room.OK),  # no cap
    (64, 10_000 * MIB, Room.OK),
    (64, 128 * MIB + HANDOVER, Room.OK),
    (64, 128 * MIB + HANDOVER - 1, Room.REPLACE),  # a full share still fits: ask, keep serving
    (64, 128 * MIB, Room.REPLACE),
    (64, 128 * MIB - 1, Room.FULL),  # a fresh interpreter would not get its full share
    (64, -5 * MIB, Room.FULL),  # over the cap already (it can be, between two checks)
    (512, 570 * MIB, Room.FULL),
    (512, 600 * MIB, Room.REPLACE),
])
def test_room_for_the_next_interpreter(memory_mb: int, headroom: int | None,
                                       verdict: Room) -> None:
    assert budget.room(headroom, memory_mb) is verdict


@pytest.mark.parametrize(("isolates", "memory_mb"), [(1, 64), (2, 64), (4, 64), (2, 1024)])
def test_a_host_recycling_forever_asks_in_time_and_never_starts_a_short_interpreter(
        isolates: int, memory_mb: int) -> None:
    """Replays a host that recycles one interpreter after another, each leaving
    `LEAK` behind: it serves many recycles, asks to be replaced with several
    recycles of slack left for the swap, and stops before any fresh interpreter
    would have less than its share."""
    start = 30 * MIB
    limit = budget.cap(start, memory_mb, isolates)
    # measured at a recycle: glibc's thread arena (64 MiB), ~25 MiB per other (idle)
    # isolate; the recycled interpreter is gone but for what it left behind
    used = start + 64 * MIB + (isolates - 1) * 25 * MIB
    verdicts = []
    while True:
        verdict = budget.room(limit - used, memory_mb)
        verdicts.append(verdict)
        if verdict is Room.FULL:
            break
        assert limit - used >= budget.share(memory_mb)
        used += LEAK
    asked = verdicts.index(Room.REPLACE)
    assert asked >= 15, "a host should last more than a handful of recycles"
    assert verdicts.count(Room.REPLACE) >= HANDOVER // LEAK  # slack for the swap
    assert verdicts[asked:-1] == [Room.REPLACE] * (len(verdicts) - 1 - asked)


def test_headroom_is_what_rlimit_as_leaves_of_the_address_space() -> None:
    if budget.headroom() is not None:
        pytest.skip("this test process runs under an RLIMIT_AS of its own")
    code = ("import resource\nfrom runtime.executors.python import budget\n"
            "limit = budget.address_space() + (300 << 20)\n"
            "resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
            "print(budget.headroom() >> 20)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert 280 <= int(out) <= 300



def vm_size() -> int:
    """This process's VmSize in bytes, as /proc/self/status says it."""
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith("VmSize:"))
    return int(line.split()[1]) * 1024


def test_the_address_space_is_the_processs_vm_size_in_bytes() -> None:
    """What RLIMIT_AS counts: the whole address space (statm's first field, in pages),
    not what is resident (statm's second: a small part of it in this process)."""
    before = vm_size()
    size = budget.address_space()
    after = vm_size()
    assert type(size) is int
    assert min(before, after) - (1 << 20) <= size <= max(before, after) + (1 << 20)


def test_headroom_is_none_without_a_cap_and_counts_the_soft_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """In this process (the test without a cap: tested against a real RLIMIT_AS in a
    child above): the soft limit, the one the kernel enforces on this process's
    mappings, less what it maps now; the hard one is only the soft's ceiling."""
    if resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY:
        pytest.skip("this test process runs under an RLIMIT_AS of its own")
    assert budget.headroom() is None
    monkeypatch.setattr(resource, "getrlimit",
                        lambda which: (budget.address_space() + (300 << 20), resource.RLIM_INFINITY)
                        if which == resource.RLIMIT_AS else (-1, -1))
    assert 280 << 20 <= budget.headroom() <= 300 << 20  # type: ignore[operator]
    monkeypatch.setattr(resource, "getrlimit",
                        lambda which: (resource.RLIM_INFINITY, 1 << 40))
    assert budget.headroom() is None


class Room_:
    """`budget.headroom` replaced by a script of values."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, values: list[int]) -> None:
        self.values = iter(values)
        monkeypatch.setattr(budget, "headroom", lambda: next(self.values))


@pytest.fixture
def isolate_socket() -> Iterator[tuple[socket.socket, socket.socket]]:
    pop_side, host_side = socket.socketpair()
    pop_side.settimeout(5)
    yield pop_side, host_side
    pop_side.close()
    host_side.close()


def test_the_host_asks_once_keeps_serving_and_then_stops_the_isolate(
        monkeypatch: pytest.MonkeyPatch,
        isolate_socket: tuple[socket.socket, socket.socket]) -> None:
    pop_side, host_side = isolate_socket
    cfg = {"memory_mb": 64}
    share = budget.share(64)
    Room_(monkeypatch, [share + HANDOVER + MIB, share + HANDOVER - MIB, share + MIB, share - MIB])
    retirement = host.Retirement()
    fd = host_side.fileno()
    assert [host.check_room(cfg, fd, retirement) for _ in range(4)] == [True, True, True, False]
    host_side.close()
    reader, pending = wire.Reader(), []  # type: ignore[var-annotated]
    frames = []
    while (f := wire.recv_frame(pop_side, reader, pending)) is not None:
        frames.append(f)
    assert [kind for kind, _ in frames] == [wire.RETIRE]  # once, though asked twice more
    assert "MiB left under its memory cap" in json.loads(frames[0][1])["why"]


def test_without_a_cap_the_host_never_asks(
        monkeypatch: pytest.MonkeyPatch,
        isolate_socket: tuple[socket.socket, socket.socket]) -> None:
    _pop_side, host_side = isolate_socket
    monkeypatch.setattr(budget, "headroom", lambda: None)
    retirement = host.Retirement()
    assert all(host.check_room({"memory_mb": 0}, host_side.fileno(), retirement)
               for _ in range(100))
    assert not retirement.asked
