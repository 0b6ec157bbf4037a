"""A guest's host calls on the PoP's loop: a flood of CALL frames is answered a
share per loop turn (in order, with the frames after it), calls sent without
waiting are dropped, a guest that never reads its answers is cut off, and a KV
value travels raw both ways (CALL_VALUE, REPLY_VALUE), a forged value frame
refused as a forged CALL is."""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import struct
import threading
import time
from typing import Any

import pytest

from edgefn_core import hostcall
from runtime.executors.python import channel as channel_mod
from runtime.executors.python import wire
from runtime.executors.python.calls import HostCalls
from runtime.executors.python.config import HostConfig
from runtime.executors.python.isolate import CALLS_PER_TURN, MAX_VALUES_WAITING, Isolate
from runtime.executors.python.job import Job

CFG = HostConfig(name="f", version="v1", function_dir="/nonexistent", module="main",
                 handler="handle", cpu_ms=50, wall_ms=1000, memory_mb=64, recycle_after=100,
                 min_isolates=1, max_isolates=1)


class Owner:
    """The host an isolate lives in, recording what reaches the pool."""

    def __init__(self, loop_turn: list[int]) -> None:
        self.cfg, self.generation, self.events = CFG, 0, self
        self.loop_turn = loop_turn
        self.seen: list[tuple[int, Any]] = []  # (loop turn, call id or "retire")
        self.calls: list[dict[str, Any]] = []
        self.killed = False

    # Events
    def call(self, isolate: Isolate, msg: dict[str, Any]) -> None:
        self.seen.append((self.loop_turn[0], msg["id"]))
        self.calls.append(msg)

    def retiring(self, isolate: Isolate, why: str) -> None:
        self.seen.append((self.loop_turn[0], "retire"))

    # Owner
    def lost(self, isolate: Isolate) -> None:
        isolate.close()

    def kill(self) -> None:
        self.killed = True


class Sink:
    """An isolate as `HostCalls` sees it: the frames sent, the calls answered."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.answered_ids: list[Any] = []

    def send(self, data: bytes) -> None:
        self.sent.append(data)

    def answered(self, msg: dict[str, Any]) -> None:
        self.answered_ids.append(msg["id"])


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

    def bindings(name: str, args: dict[str, Any], caller: str | None, raw: bool = False) -> Any:
        called.append(name)
        return {"ok": True}

    calls, sink = HostCalls(CFG, bindings), Sink()  # type: ignore[arg-type]
    for i in range(1000):
        calls.handle(sink, {"id": i, "name": "vectors.query", "args": {}, "wait": False})
    calls.handle(sink, {"id": 1, "name": "log", "args": {"message": "hi"}, "wait": False})
    assert called == [] and sink.sent == [] and calls.dropped == 1000
    calls.handle(sink, {"id": 2, "name": "kv.get", "args": {}, "wait": True})
    assert called == ["kv.get"] and sink.answered_ids == [2]
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


def from_guest(data: bytes) -> tuple[Owner, list[tuple[bytes, bytes]]]:
    """`data` written by a guest to its isolate on the PoP's loop (from a thread: a
    large frame outgrows the socket's buffer) in a request, as its calls are: what
    reached the pool, the frames the guest got back."""
    async def go() -> tuple[Owner, list[tuple[bytes, bytes]]]:
        ours, guest = socket.socketpair()
        owner = Owner([0])
        isolate = Isolate(owner, ours)
        isolate.attach(asyncio.get_running_loop())
        isolate.run(Job(asyncio.get_running_loop(), b"req"))
        request_frame = wire.frame(wire.REQUEST, b"req")
        assert guest.recv(len(request_frame)) == request_frame  # taken: what comes is replies
        writer = threading.Thread(target=send_all, args=(guest, data))
        writer.start()
        end = time.monotonic() + 10
        while not (owner.calls or owner.killed or select.select([guest], [], [], 0)[0]) \
                and time.monotonic() < end:
            await asyncio.sleep(0.001)
        for _ in range(5):
            await asyncio.sleep(0)  # an answer sent with the garbage, or after it
        isolate.close()
        writer.join()
        guest.setblocking(False)
        reader, back = wire.Reader(), []
        try:
            while chunk := guest.recv(1 << 16):
                back.extend(reader.feed(chunk))
        except (BlockingIOError, ConnectionResetError):  # (reset: closed with bytes unread)
            pass
        guest.close()
        return owner, back

    return asyncio.run(go())


def send_all(sock: socket.socket, data: bytes) -> None:
    """`sock.sendall(data)`, until the PoP closes the socket."""
    with contextlib.suppress(OSError):  # the PoP closed it (garbage): the rest is dropped
        sock.sendall(data)


def put_head(**extra: Any) -> bytes:
    """A ``kv.put`` as the SDK writes it for a CALL_VALUE frame."""
    return json.dumps({"id": 7, "name": "kv.put", "args": {
        "namespace": "n", "key": "k", "value": "", **extra}, "wait": True}).encode()


def test_a_value_frame_s_value_reaches_the_binding_raw() -> None:
    value = bytes(range(256)) * 3
    owner, _ = from_guest(b"".join(wire.value_frame(wire.CALL_VALUE, put_head(), value)))
    assert not owner.killed
    (msg,) = owner.calls
    assert msg["name"] == "kv.put" and msg["args"]["key"] == "k"
    assert bytes(msg["args"]["value"]) == value


BIG_HEAD = put_head(pad="x" * (hostcall.MAX_BYTES - len(put_head()) + 1))


@pytest.mark.parametrize("data", [
    # its head length lies: longer than the frame, or no room for one
    wire.frame(wire.CALL_VALUE, struct.pack("<I", 1000) + put_head()),
    wire.frame(wire.CALL_VALUE, b"{}"),
    # its head is not JSON, nor an SDK call's start; is a JSON array
    b"".join(wire.value_frame(wire.CALL_VALUE, b"\xff\x00 not json", b"v")),
    b"".join(wire.value_frame(wire.CALL_VALUE, b"[1, 2]", b"v")),
    # past a bound: its head's bytes, its head and value counted as the JSON they were,
    # its head's objects
    b"".join(wire.value_frame(wire.CALL_VALUE, BIG_HEAD, b"")),
    b"".join(wire.value_frame(wire.CALL_VALUE, put_head(), b"v" * (18 << 20))),
    b"".join(wire.value_frame(wire.CALL_VALUE, put_head(pad=[{}] * 200_000), b"v")),
    # a call the SDK never sends raw, or with arguments that are no object
    b"".join(wire.value_frame(wire.CALL_VALUE, json.dumps(
        {"id": 7, "name": "kv.get", "args": {"namespace": "n", "key": "k"}}).encode(), b"v")),
    b"".join(wire.value_frame(wire.CALL_VALUE, json.dumps(
        {"id": 7, "name": "kv.put", "args": ["n", "k"]}).encode(), b"v")),
], ids=["length-past-end", "no-length", "not-json", "array", "head-over-bound",
        "value-over-bound", "head-objects", "not-a-value-call", "args-not-object"])
def test_a_forged_value_frame_ends_its_host_unparsed(data: bytes) -> None:
    owner, back = from_guest(data)
    assert owner.killed and owner.calls == [] and back == []


def test_a_value_frame_whose_head_json_the_pop_cannot_read_is_answered_by_its_id() -> None:
    """As a CALL is: the guest waits for its answer."""
    owner, back = from_guest(b"".join(wire.value_frame(
        wire.CALL_VALUE, b'{"id": 7, "name": "kv.put", "args": {"key": "\\ud800', b"v")))
    assert not owner.killed and owner.calls == []
    assert [(kind, json.loads(payload)["id"]) for kind, payload in back] == [(wire.REPLY, 7)]


def test_a_kv_read_is_answered_with_its_value_raw() -> None:
    asked: list[tuple[str, bool]] = []
    value = bytes(range(256)) * 2

    def bindings(name: str, args: dict[str, Any], caller: str | None, raw: bool = False) -> Any:
        asked.append((name, raw))
        return {"value": value if raw else "base64", "metadata": {"m": [1]}, "version": 3,
                "expires_at": None}

    calls, sink = HostCalls(CFG, bindings), Sink()
    calls.handle(sink, {"id": 4, "name": "kv.get", "args": {"key": "k"}, "wait": True})
    calls.handle(sink, {"id": 5, "name": "vectors.query", "args": {}, "wait": True})
    assert asked == [("kv.get", True), ("vectors.query", False)]
    assert sink.sent[1] is value  # queued as it is, not copied into a frame
    (kind, payload), (other, _) = wire.Reader().feed(b"".join(sink.sent))
    head, got = wire.split_value(payload)
    assert (kind, other, bytes(got)) == (wire.REPLY_VALUE, wire.REPLY, value)
    assert json.loads(head) == {"id": 4, "result": {"value": "", "metadata": {"m": [1]},
                                                    "version": 3, "expires_at": None}}


def test_a_guest_s_values_waiting_for_answers_hold_its_socket_past_a_bound() -> None:
    """Raw, 100 forged 16 MiB puts (each waiting for its answer, none read) queued 1.4 GB
    in the PoP in 6 s: past `MAX_VALUES_WAITING` its socket is not read until some of
    its calls are answered, and then read on."""
    value = b"v" * (16 << 20)
    frames = [b"".join(wire.value_frame(wire.CALL_VALUE, json.dumps(
        {"id": i, "name": "kv.put", "args": {"namespace": "n", "key": "k", "value": ""},
         "wait": True}).encode(), value)) for i in range(8)]
    held = MAX_VALUES_WAITING // len(value) + 1  # the call that passes the bound is read

    async def go() -> tuple[list[int], list[int], list[int]]:
        ours, guest = socket.socketpair()
        owner = Owner([0])
        isolate = Isolate(owner, ours)
        isolate.attach(asyncio.get_running_loop())
        isolate.run(Job(asyncio.get_running_loop(), b"req"))  # its calls come in a request
        writer = threading.Thread(target=send_all, args=(guest, b"".join(frames)))
        writer.start()

        async def until(done: Any) -> list[int]:
            end = time.monotonic() + 30
            while not done() and time.monotonic() < end:
                await asyncio.sleep(0.005)
            return [msg["id"] for msg in owner.calls]

        first = await until(lambda: not isolate.channel.reading)
        for msg in owner.calls[:2]:
            isolate.answered(msg)
        assert isolate.channel.reading
        after_two = await until(lambda: not isolate.channel.reading)
        for msg in owner.calls[2:]:
            isolate.answered(msg)
        every = await until(lambda: len(owner.calls) == len(frames))
        isolate.close()
        writer.join()
        guest.close()
        return first, after_two, every

    first, after_two, every = asyncio.run(go())
    assert first == list(range(held))
    assert after_two == list(range(held + 2))
    assert every == list(range(8))


def test_a_model_call_cut_before_its_task_ran_still_answers_the_guest() -> None:
    """A client that leaves in the same loop turn its handler's model call came in
    (the call's task made, not run yet) stops the call with the request
    (`Job.let_go`): the guest still gets its error reply. The task cancelled before its
    first step never ran its reply: the guest waited on it to its wall limit, holding
    the isolate (a 10 s timeout in `test_a_functions_model_call_stops_when_its_client_goes_away`
    on a fresh clone), and the binding's coroutine was never awaited."""
    from runtime.executors.python.job import Job

    started: list[str] = []

    async def generate() -> dict[str, Any]:
        started.append("model")
        await asyncio.sleep(30)
        return {"text": "never"}

    def bindings(name: str, args: dict[str, Any], caller: str | None, raw: bool = False) -> Any:
        return generate()

    async def go() -> tuple[Sink, Job]:
        loop = asyncio.get_running_loop()
        calls, sink = HostCalls(CFG, bindings), Sink()
        job = Job(loop, b"req")
        sink.job = job  # type: ignore[attr-defined]  # the request the call is made for
        calls.handle(sink, {"id": 7, "name": "ai.chat", "args": {}, "wait": True})  # type: ignore[arg-type]
        job.let_go()  # the client left, this same turn
        for _ in range(5):
            await asyncio.sleep(0)
        return sink, job

    sink, job = asyncio.run(go())
    assert [json.loads(f[5:]) for f in sink.sent] == [
        {"id": 7, "error": "cancelled: the request's client went away"}]
    assert sink.answered_ids == [7]
    assert started == [] and job.cleanups == []  # stopped before it began, and let go
