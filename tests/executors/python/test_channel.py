"""An isolate's socket on the PoP's loop (`channel.Channel`): what the peer does not
take at once waits, in order, a large write (a 16 MiB KV value) as it is, uncopied."""

from __future__ import annotations

import asyncio
import os
import socket
import threading

from edgefn_core.errors import ProtocolError
from runtime.executors.python import wire
from runtime.executors.python.channel import Channel


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
