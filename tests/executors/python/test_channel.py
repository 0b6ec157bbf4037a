"""An isolate's socket on the PoP's loop (`channel.Channel`): what the peer does not
take at once waits, in order, a large write (a 16 MiB KV value) as it is, uncopied."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from typing import Any

import pytest

from edgefn_core.errors import ProtocolError
from runtime.executors.python import channel as channel_mod
from runtime.executors.python import wire
from runtime.executors.python.channel import COPIED_BELOW, Channel


class Receiver:
    def frame(self, kind: bytes, payload: bytes) -> None:
        raise AssertionError("the peer sends nothing")

    def lost(self) -> None:
        raise AssertionError("lost")

    def garbage(self, err: ProtocolError) -> None:
        raise AssertionError(err)

    def room(self) -> int:
        return wire.MAX_FRAME


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


class Recorder:
    """A receiver that records what its channel reports, and closes it when the peer
    is lost (as the isolate's owner does)."""

    def __init__(self) -> None:
        self.frames: list[tuple[bytes, bytes]] = []
        self.lost_count = 0
        self.errors: list[ProtocolError] = []
        self.channel: Channel | None = None
        self.most = wire.MAX_FRAME  # `room`

    def frame(self, kind: bytes, payload: bytes) -> None:
        self.frames.append((kind, payload))

    def lost(self) -> None:
        self.lost_count += 1
        if self.channel is not None:
            self.channel.close()

    def garbage(self, err: ProtocolError) -> None:
        self.errors.append(err)

    def room(self) -> int:
        return self.most


def recorded(max_frame: int = wire.MAX_FRAME) -> tuple[Channel, Recorder, socket.socket]:
    """A channel on the running loop, its receiver recording (and closing it once the
    peer is lost), and the peer's end of its socket."""
    ours, peer = socket.socketpair()
    receiver = Recorder()
    channel = receiver.channel = Channel(ours, receiver, max_frame)
    channel.attach(asyncio.get_running_loop())
    return channel, receiver, peer


async def settle() -> None:
    """Let the loop read what is readable (a few turns)."""
    for _ in range(5):
        await asyncio.sleep(0.002)


def test_unread_says_whether_the_peer_may_have_sent_what_was_not_read() -> None:
    """What `Isolate.drop` bets on: a byte waiting is unread (one is enough); none is
    not; after the peer's EOF, nothing is; a channel closed before its EOF, or a
    socket that cannot be asked, may hold anything."""

    async def go() -> None:
        ours, peer = socket.socketpair()
        receiver = Recorder()
        channel = receiver.channel = Channel(ours, receiver)
        assert not channel.unread()
        peer.send(b"x")
        assert channel.unread()  # one byte
        channel.attach(asyncio.get_running_loop())
        await settle()  # read (not a whole frame yet): nothing waits now
        assert not channel.unread() and receiver.frames == []
        peer.close()
        await settle()
        assert channel.eof and receiver.lost_count == 1 and channel.closed
        assert not channel.unread()  # its EOF came first: everything was read

        ours2, peer2 = socket.socketpair()
        closed = Channel(ours2, Recorder())
        closed.close()
        assert closed.unread()  # closed before its EOF: nothing says
        peer2.close()

        listener = socket.socket()  # a socket FIONREAD cannot be asked of (EINVAL)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert Channel(listener, Recorder()).unread()
        listener.close()

    asyncio.run(go())


def test_a_peer_that_resets_the_socket_is_lost_once_and_sends_no_frame() -> None:
    """A read that fails (ECONNRESET: the peer closed with what it was sent unread)
    is the peer's end, as an EOF is."""

    async def go() -> None:
        channel, receiver, peer = recorded()
        channel.send(b"never read by the peer")
        peer.close()  # with our bytes unread: our next read fails
        await settle()
        assert receiver.lost_count == 1 and receiver.frames == [] and receiver.errors == []
        assert channel.eof and channel.closed

    asyncio.run(go())


def test_a_failed_read_ends_the_channel_in_that_read() -> None:
    """The read that fails is the end: nothing of the inbox (what an earlier read
    left in it) is taken as sent."""

    async def go() -> None:
        channel, receiver, peer = recorded()
        peer.send(wire.frame(wire.RESPONSE, b"earlier"))
        await settle()
        assert receiver.frames == [(wire.RESPONSE, b"earlier")]
        channel.pause_reading()  # the read below is this test's
        channel.send(b"never read by the peer")
        peer.close()  # with our bytes unread: our next read fails
        channel._readable()
        assert receiver.lost_count == 1 and channel.eof
        assert receiver.frames == [(wire.RESPONSE, b"earlier")] and receiver.errors == []

    asyncio.run(go())


def fill(sock: socket.socket) -> int:
    """Fill `sock`'s send buffer (non-blocking) until it takes no more; the bytes sent."""
    sent = 0
    try:
        while True:
            sent += sock.send(b"f" * 4096)
    except BlockingIOError:
        return sent


def drain(peer: socket.socket, size: int) -> bytes:
    """`size` bytes from `peer` (from a thread, as the channel writes them)."""
    got = bytearray()
    while len(got) < size:
        got += peer.recv(1 << 16)
    return bytes(got)


def test_a_send_to_a_full_socket_waits_whole_and_goes_out_in_order() -> None:
    """A write the socket takes none of (it is full) is kept whole, and goes out
    after what filled it once the peer reads."""

    async def go() -> None:
        channel, receiver, peer = recorded()
        filled = fill(channel.sock)
        frame = wire.frame(wire.REPLY, b"0123456789")
        channel.send(frame)
        assert channel.unsent == len(frame) and receiver.errors == []
        reader = asyncio.get_running_loop().run_in_executor(
            None, drain, peer, filled + len(frame))
        got = await asyncio.wait_for(reader, 10)
        assert got == b"f" * filled + frame and channel.unsent == 0
        channel.close()
        peer.close()

    asyncio.run(go())


@pytest.mark.parametrize("over", [0, 1])
def test_a_peer_that_leaves_more_than_max_unread_unread_is_garbage(
        monkeypatch: pytest.MonkeyPatch, over: int) -> None:
    """Writes queue while the peer reads nothing; past `MAX_UNREAD` bytes queued the
    peer is reported (its host is killed: it does not read its socket), at it not."""

    async def go() -> None:
        channel, receiver, peer = recorded()
        fill(channel.sock)
        monkeypatch.setattr(channel_mod, "MAX_UNREAD", 3000 - over)
        channel.send(b"a" * 1000)  # the socket takes none: queued
        channel.send(b"b" * 2000)  # queued behind it: 3000 unread
        assert channel.unsent == 3000
        if over:
            assert [str(e) for e in receiver.errors] == [
                "3000 bytes sent to it are unread: it does not read its socket"]
        else:
            assert receiver.errors == []
        channel.close()
        peer.close()

    asyncio.run(go())


def test_a_frame_over_the_bound_is_reported_as_garbage_with_why() -> None:
    async def go() -> None:
        channel, receiver, peer = recorded(max_frame=100)
        peer.send(wire.frame(wire.RESPONSE, b"x" * 200))
        await settle()
        assert len(receiver.errors) == 1 and isinstance(receiver.errors[0], ProtocolError)
        assert receiver.frames == []
        channel.close()
        peer.close()

    asyncio.run(go())


def test_a_frame_larger_than_the_receiver_expects_now_is_garbage_once_its_length_is_read(
        ) -> None:
    """Before its bytes come: a guest that began a 256 MiB frame and never ended it
    held that much of the PoP. Whole frames within the room pass; the room is asked
    only while a frame is begun."""
    async def go() -> None:
        channel, receiver, peer = recorded()
        receiver.most = 1000
        at_most = wire.frame(wire.RESPONSE, b"x" * 999)  # its length says 1000: it may come
        peer.send(at_most[:500])
        await settle()
        peer.send(at_most[500:] + wire.frame(wire.RESPONSE, b"y")[:3])
        await settle()
        assert [len(p) for _, p in receiver.frames] == [999] and receiver.errors == []
        peer.send(wire.frame(wire.RESPONSE, b"y")[3:] + wire.frame(wire.RESPONSE, b"z" * 1000)[:4])
        await settle()  # one byte more than may come: its length alone, 4 bytes, refuses it
        assert [len(p) for _, p in receiver.frames] == [999, 1]
        assert [str(e) for e in receiver.errors] == [
            "a frame of 1001 bytes begun where at most 1000 may come now"]
        channel.close()
        peer.close()

    asyncio.run(go())


def test_a_closed_channel_lets_go_of_what_it_held_at_once() -> None:
    """A partial frame and unsent writes go when it closes, not when the isolate that
    references it (and it the isolate) is collected: 64 MiB a killed host's isolate."""
    async def go() -> None:
        channel, _, peer = recorded()
        peer.send(wire.frame(wire.RESPONSE, b"x" * 100_000)[:60_000])
        await settle()
        assert len(channel.reader.buf) == 60_000
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        channel.send(b"w" * (4 << 20))  # more than the socket takes: the rest waits
        assert channel.out and channel.unsent > 0
        channel.send_soon(b"held")
        channel.close()
        assert (len(channel.reader.buf), channel.held, len(channel.out), channel.unsent) == (
            0, None, 0, 0)
        peer.close()

    asyncio.run(go())


def test_a_paused_channel_reads_nothing_until_resumed() -> None:
    """Backpressure (`Isolate.pause`): frames the peer sends meanwhile wait in the
    socket, then arrive in order; pausing or resuming a closed channel does nothing."""

    async def go() -> None:
        channel, receiver, peer = recorded()
        channel.pause_reading()
        assert not channel.reading
        peer.send(wire.frame(wire.RESPONSE, b"1") + wire.frame(wire.RESPONSE, b"2"))
        await settle()
        assert receiver.frames == [] and channel.unread()
        channel.pause_reading()  # twice: still paused
        channel.resume_reading()
        await settle()
        assert receiver.frames == [(wire.RESPONSE, b"1"), (wire.RESPONSE, b"2")]
        channel.close()
        channel.pause_reading()  # (its socket is closed: nothing to remove or add)
        channel.resume_reading()
        peer.close()

    asyncio.run(go())


def test_a_frame_of_its_kind_alone_is_read_and_one_without_a_kind_is_garbage() -> None:
    async def go() -> None:
        channel, receiver, peer = recorded()
        peer.send(wire.frame(wire.END))
        await settle()
        assert receiver.frames == [(wire.END, b"")] and receiver.errors == []
        peer.send((0).to_bytes(wire.FRAME_HEAD - 1, "little"))  # a length of 0
        await settle()
        assert [str(e) for e in receiver.errors] == [
            "frame of 0 bytes is shorter than the 1 byte minimum"]
        channel.close()
        peer.close()

    asyncio.run(go())


def test_a_channel_not_attached_or_closed_while_paused_neither_reads_nor_holds() -> None:
    async def go() -> None:
        ours, peer = socket.socketpair()
        channel = Channel(ours, Recorder())
        channel.resume_reading()  # no loop yet
        channel.send_soon(b"before attach")  # no loop's turn to hold it for: dropped
        assert not channel.reading and channel.held is None
        channel.attach(asyncio.get_running_loop())
        channel.pause_reading()
        channel.close()
        channel.resume_reading()  # its socket is gone: nothing to read
        assert not channel.reading
        peer.close()

    asyncio.run(go())


def test_one_loop_holds_one_set_of_corks() -> None:
    """Every channel of a loop holds its frames in the loop's one `Corks`, flushed in
    one pass at the turn's end (one callback, not one a channel)."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        assert channel_mod.corks_of(loop) is channel_mod.corks_of(loop)

    asyncio.run(go())


def test_a_closed_channel_sends_nothing_and_reports_nothing() -> None:
    async def go() -> None:
        channel, receiver, peer = recorded()
        channel.close()
        assert channel.closed and channel.sock.fileno() == -1
        channel.send(b"after")
        channel.send_soon(b"after, soon")
        await settle()
        assert receiver.lost_count == 0 and channel.held is None
        assert available(peer) == b""
        channel.close()  # twice: nothing more
        peer.close()

    asyncio.run(go())


def test_one_channel_holding_frames_is_flushed_at_the_turns_end() -> None:
    """The first channel a turn holds frames for schedules the flush (and a frame
    held after `forget_held` is held and sent as any)."""

    async def go() -> None:
        ours, peer = counting_pair()
        channel = Channel(ours, Receiver())
        channel.attach(asyncio.get_running_loop())
        channel.send_soon(b"one;")
        await asyncio.sleep(0)
        assert available(peer) == b"one;" and ours.sends == 1
        channel.send_soon(b"dropped;")
        channel.forget_held()
        channel.send_soon(b"two;")
        channel.send_soon(b"three;")
        await asyncio.sleep(0)
        assert available(peer) == b"two;three;" and ours.sends == 2
        channel.close()
        peer.close()

    asyncio.run(go())


def test_a_write_of_exactly_the_copy_bound_waits_uncopied() -> None:
    """`COPIED_BELOW` bytes or more wait as a view of the caller's bytes; fewer are
    copied together. Once all is written, the channel stops waiting to write (a
    writer left on the loop fired on an empty queue: an error each time)."""

    async def go() -> None:
        loop = asyncio.get_running_loop()
        errors: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, context: errors.append(context))
        ours, peer = socket.socketpair()
        channel = Channel(ours, Receiver())
        channel.attach(loop)
        filler = b"f" * (8 << 20)  # more than the socket holds: the rest waits
        channel.send(filler)
        assert channel.out
        exact = os.urandom(COPIED_BELOW)
        channel.send(exact)
        assert isinstance(channel.out[-1], memoryview) and channel.out[-1].obj is exact
        small = b"s" * (COPIED_BELOW - 1)
        channel.send(small)
        assert isinstance(channel.out[-1], bytearray)
        got = bytearray()

        def read() -> None:
            while len(got) < len(filler) + len(exact) + len(small):
                got.extend(peer.recv(1 << 16))

        reader = threading.Thread(target=read)
        reader.start()
        while reader.is_alive():
            await asyncio.sleep(0.001)
        assert bytes(got) == filler + exact + small and not channel.out
        await settle()
        assert errors == []
        channel.close()
        peer.close()

    asyncio.run(go())
