"""A guest's host calls on the PoP's loop: a flood of CALL frames is answered a
share per loop turn (in order, with the frames after it), calls sent without
waiting are dropped, and a guest that never reads its answers is cut off."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest

from runtime.executors.python import channel as channel_mod
from runtime.executors.python import wire
from runtime.executors.python.calls import HostCalls
from runtime.executors.python.config import HostConfig
from runtime.executors.python.isolate import CALLS_PER_TURN, Isolate

CFG = HostConfig(name="f", version="v1", function_dir="/nonexistent", module="main",
                 handler="handle", cpu_ms=50, wall_ms=1000, memory_mb=64, recycle_after=100,
                 min_isolates=1, max_isolates=1)


class Owner:
    """The host an isolate lives in, recording what reaches the pool."""

    def __init__(self, loop_turn: list[int]) -> None:
        self.cfg, self.generation, self.events = CFG, 0, self
        self.loop_turn = loop_turn
        self.seen: list[tuple[int, Any]] = []  # (loop turn, call id or "retire")
        self.killed = False

    # Events
    def call(self, isolate: Isolate, msg: dict[str, Any]) -> None:
        self.seen.append((self.loop_turn[0], msg["id"]))

    def retiring(self, isolate: Isolate, why: str) -> None:
        self.seen.append((self.loop_turn[0], "retire"))

    # Owner
    def lost(self, isolate: Isolate) -> None:
        isolate.close()

    def kill(self) -> None:
        self.killed = True


def test_a_flood_of_calls_is_answered_a_share_per_loop_turn_in_order() -> None:
    async def go() -> tuple[Owner, int]:
        loop = asyncio.get_running_loop()
        turn = [0]
        stop = False

        def tick() -> None:  # counts the loop's turns
            turn[0] += 1
            if not stop:
                loop.call_soon(tick)

        ours, guest = socket.socketpair()
        owner = Owner(turn)
        isolate = Isolate(owner, ours)
        isolate.attach(loop)
        n = 40 * CALLS_PER_TURN
        guest.sendall(b"".join(wire.json_frame(wire.CALL, {"id": i, "name": "kv.get",
                                                           "wait": True}) for i in range(n))
                      + wire.json_frame(wire.RETIRE, {"why": "after the calls"}))
        tick()
        for _ in range(2000):
            if len(owner.seen) == n + 1:
                break
            await asyncio.sleep(0)
        stop = True
        isolate.close()
        guest.close()
        return owner, n

    owner, n = asyncio.run(go())
    assert [what for _, what in owner.seen] == [*range(n), "retire"]  # in order, all of them
    per_turn: dict[int, int] = {}
    for t, what in owner.seen:
        if what != "retire":
            per_turn[t] = per_turn.get(t, 0) + 1
    assert max(per_turn.values()) <= CALLS_PER_TURN
    assert len(per_turn) >= n // CALLS_PER_TURN  # spread over that many turns


def test_calls_sent_without_waiting_are_dropped_except_log() -> None:
    called: list[str] = []

    def bindings(name: str, args: dict[str, Any], caller: str | None) -> Any:
        called.append(name)
        return {"ok": True}

    class Sink:
        def __init__(self) -> None:
            self.sent: list[bytes] = []

        def send(self, data: bytes) -> None:
            self.sent.append(data)

    calls, sink = HostCalls(CFG, bindings), Sink()  # type: ignore[arg-type]
    for i in range(1000):
        calls.handle(sink, {"id": i, "name": "vectors.query", "args": {}, "wait": False})
    calls.handle(sink, {"id": 1, "name": "log", "args": {"message": "hi"}, "wait": False})
    assert called == [] and sink.sent == [] and calls.dropped == 1000
    calls.handle(sink, {"id": 2, "name": "kv.get", "args": {}, "wait": True})
    assert called == ["kv.get"]
    assert json.loads(wire.Reader(wire.FRAMING).feed(sink.sent[0])[0][1]) == {
        "id": 2, "result": {"ok": True}}


def test_a_guest_that_never_reads_its_answers_is_cut_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(channel_mod, "MAX_UNREAD", 1 << 20)

    async def go() -> tuple[Owner, int]:
        ours, guest = socket.socketpair()
        owner = Owner([0])
        isolate = Isolate(owner, ours)
        isolate.attach(asyncio.get_running_loop())
        sent = 0
        while not owner.killed and sent < 64 << 20:  # the guest reads none of it
            isolate.send(wire.frame(wire.REPLY, b"x" * 65536))
            sent += 65536
        isolate.close()
        guest.close()
        return owner, sent

    owner, sent = asyncio.run(go())
    assert owner.killed and sent < 8 << 20
