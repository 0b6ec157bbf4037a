"""An isolate's socket on the PoP's loop (`channel.Channel`): what the peer does not
take at once waits, in order, a large write (a 16 MiB KV value) as it is, uncopied."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from typing import Any

from edgefn_core.errors import ProtocolError
from runtime.executors.python import wire
from runtime.executors.python.channel import COPIED_BELOW, Channel


class Receiver:
    def frame(self, kind: bytes, payload: bytes) -> None:
        raise AssertionError("the peer sends nothing")

    def lost(self) -> None:
        raise AssertionError("lost")

    def garbage(self, err: ProtocolError) -> None:
        raise AssertionError(err)


def test_writes_the_peer_is_slow_to_take_arrive_whole_in_order_large_ones_uncopied() -> None:
    big = os.urandom(3 << 20)
    writes = [b"a" * 10, big, b"b" * 100, b"c" * 70_000, b"d", *wire.value_frame(
        wire.REPLY_VALUE, b'{"id": 1}', big), b"e" * 5]

    async def go() -> tuple[bytes, bool]:
        ours, peer = socket.socketpair()
        channel = Channel(ours, Receiver())
        channel.attach(asyncio.get_running_loop())
        for data in writes:
            channel.send(data)
        uncopied = any(isinstance(part, memoryview) and part.obj is big
                       for part in channel.out)
        got = bytearray()

        def read() -> None:  # slowly: the writes wait on the loop meanwhile
            while len(got) < sum(map(len, writes)):
                got.extend(peer.recv(1 << 14))

        reader = threading.Thread(target=read)
        reader.start()
        while reader.is_alive():
            await asyncio.sleep(0.001)
        assert not channel.out and channel.unsent == 0
        channel.close()
        peer.close()
        return bytes(got), uncopied

    got, uncopied = asyncio.run(go())
    assert got == b"".join(writes)
    assert uncopied  # queued as a view of the caller's bytes


class CountingSocket(socket.socket):
    """A real socket that counts its writes."""

    sends = 0

    def send(self, data: Any, flags: int = 0) -> int:  # type: ignore[override]
        self.sends += 1
        return super().send(data, flags)


def counting_pair() -> tuple[CountingSocket, socket.socket]:
    ours, peer = socket.socketpair()
    return CountingSocket(fileno=ours.detach()), peer


def available(peer: socket.socket) -> bytes:
    """What the peer can read now, without waiting."""
    got = bytearray()
    while True:
        try:
            chunk = peer.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return bytes(got)
        if not chunk:  # closed
            return bytes(got)
        got += chunk


def test_frames_sent_soon_in_one_turn_go_out_in_one_write_per_channel_in_order() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        pairs = [counting_pair() for _ in range(2)]
        channels = [Channel(ours, Receiver()) for ours, _ in pairs]
        for channel in channels:
            channel.attach(loop)
        frames = [wire.frame(wire.REQUEST, bytes([n]) * 40) for n in range(6)]
        for n, frame in enumerate(frames):
            channels[n % 2].send_soon(frame)
        # nothing is written during the turn
        assert [ours.sends for ours, _ in pairs] == [0, 0]
        assert [available(peer) for _, peer in pairs] == [b"", b""]
        await asyncio.sleep(0)  # the turn ends
        assert [ours.sends for ours, _ in pairs] == [1, 1]
        assert available(pairs[0][1]) == frames[0] + frames[2] + frames[4]
        assert available(pairs[1][1]) == frames[1] + frames[3] + frames[5]
        await asyncio.sleep(0)
        assert [ours.sends for ours, _ in pairs] == [1, 1]  # nothing is sent twice
        for channel in channels:
            channel.close()
        for _, peer in pairs:
            peer.close()

    asyncio.run(go())


def test_a_plain_send_sends_what_is_held_first_and_held_frames_can_be_forgotten() -> None:
    """A DROP or CANCEL goes out after the requests held before it; requests taken
    back before the turn ends (their isolate ended: `Isolate.unstarted`) are never
    sent; `unread` sends nothing (a guest cannot have answered what it was not sent)."""
    async def go() -> None:
        ours, peer = counting_pair()
        channel = Channel(ours, Receiver())
        channel.attach(asyncio.get_running_loop())
        channel.send_soon(b"request-1;")
        channel.send_soon(b"request-2;")
        channel.send(b"drop;")
        assert available(peer) == b"request-1;request-2;drop;"  # at once, in order
        channel.send_soon(b"request-3;")
        assert not channel.unread()
        assert available(peer) == b""
        await asyncio.sleep(0)
        assert available(peer) == b"request-3;" and ours.sends == 3  # held: one write each
        channel.send_soon(b"taken-back;")
        channel.forget_held()
        await asyncio.sleep(0)
        assert available(peer) == b"" and ours.sends == 3
        big = os.urandom(COPIED_BELOW)
        channel.send_soon(b"small;")
        channel.send_soon(big)  # large: not copied into a joined write, sent now, in order
        assert available(peer) == b"small;" + big
        channel.send_soon(b"late;")
        channel.close()  # what is held when it closes is dropped, as a send after it is
        await asyncio.sleep(0)
        assert available(peer) == b""
        peer.close()

    asyncio.run(go())
