"""One isolate's socket on the PoP's event loop: buffered non-blocking writes,
and incoming bytes cut into frames (`wire`) for a `Receiver`. Frames sent with
`Channel.send_soon` wait for the end of the loop's turn and go out in one write
(`Corks`): the requests sent ahead to a busy isolate in one turn wake its thread
once, not once each.

It knows nothing of what frames mean; the `Isolate` does.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import socket
import termios
import weakref
from collections import deque
from typing import Protocol

from edgefn_core.errors import ProtocolError
from edgefn_core.frames import Framing
from runtime.executors.python import wire
from runtime.executors.python.frame_budget import COUNTED_FROM, FrameBudget, budget_of

RECV_SIZE = 1 << 18  # what one read takes at most (job.py bounds a stream's queue by it)
# bytes queued for a peer that does not read them (answers to calls it never reads):
# past this it is broken or hostile, and reported as `garbage`
MAX_UNREAD = 2 * wire.MAX_FRAME
# bytes written past the socket's room are queued: smaller ones copied together, larger
# ones (a KV value) as they are, never copied (a copy of 16 MiB took ~7 ms of the loop)
COPIED_BELOW = 1 << 16


class Receiver(Protocol):
    def frame(self, kind: bytes, payload: bytes) -> None:
        """One complete frame arrived."""

    def lost(self) -> None:
        """The socket closed or failed: the peer is gone."""

    def garbage(self, err: ProtocolError) -> None:
        """The peer sent something that is not a frame; the socket is unusable."""

    def room(self) -> int:
        """The largest frame the peer may send now (at most the channel's
        `max_frame`): a larger one is `garbage` as soon as its length is read."""


class Corks:
    """A loop's channels holding frames for the end of its turn (`Channel.send_soon`):
    the first one added schedules one `flush` (``call_soon``), which runs once the
    loop has handled everything it read in this iteration; each channel then sends
    what it holds in one write, so its isolate wakes once for all of them."""

    __slots__ = ("loop", "waiting")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiting: list[Channel] = []

    def add(self, channel: Channel) -> None:
        waiting = self.waiting
        waiting.append(channel)
        if len(waiting) == 1:
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        waiting, self.waiting = self.waiting, []
        for channel in waiting:
            channel.uncork()


_corks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Corks] = weakref.WeakKeyDictionary()


def corks_of(loop: asyncio.AbstractEventLoop) -> Corks:
    corks = _corks.get(loop)
    if corks is None:
        corks = _corks[loop] = Corks(loop)
    return corks


class Channel:
    def __init__(self, sock: socket.socket, receiver: Receiver,
                 max_frame: int = wire.MAX_FRAME, owner: str = "") -> None:
        """`max_frame`: the largest frame the peer may send; `owner`: whose large
        frames count in the loop's `FrameBudget` (`frame_budget`)."""
        self.sock = sock
        self.owner = owner
        self.reader = wire.Reader(Framing("<", max_frame, min_size=1))
        self.receiver = receiver
        # what waits to be written, in order: bytearrays of small writes, views of large ones
        self.out: deque[bytearray | memoryview] = deque()
        self.unsent = 0
        # One buffer for every read: `recv(RECV_SIZE)` would allocate 256 KiB per call,
        # which glibc serves with mmap/munmap (85 us a read here, against 3 us into this).
        self.inbox = bytearray(RECV_SIZE)
        self.inbox_view = memoryview(self.inbox)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self.eof = False  # the peer closed it: everything it sent was read
        self.reading = False
        self.wanted = False  # reading, as `pause_reading`/`resume_reading` last asked
        # A large frame begun: what it counts in the budget, granted (`counting`) or
        # waited for (`asking`, its socket unread meanwhile), and where it ends in
        # the bytes read (`read`)
        self.budget: FrameBudget | None = None
        self.counting = 0
        self.asking = 0
        self.read = 0
        self.frame_end = 0
        self.held: list[bytes] | None = None  # frames for the end of the loop's turn
        self.corks: Corks | None = None  # the loop's (`attach`)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start reading on `loop` (until then the socket may be used blocking)."""
        self.loop = loop
        self.corks = corks_of(loop)
        self.budget = budget_of(loop)
        self.sock.setblocking(False)
        self.resume_reading()

    def pause_reading(self) -> None:
        """Stop reading the socket (the peer then blocks in its send). Frames already
        read in the current pass are still delivered."""
        self.wanted = False
        self._stop()

    def resume_reading(self) -> None:
        """Read the socket again (once the frame budget has room for the frame begun,
        if it waits for that)."""
        self.wanted = True
        if not self.asking:
            self._start()

    def _stop(self) -> None:
        if self.reading and not self.closed and self.loop is not None:
            self.reading = False
            self.loop.remove_reader(self.sock.fileno())

    def _start(self) -> None:
        if not self.reading and not self.closed and self.loop is not None:
            self.reading = True
            self.loop.add_reader(self.sock.fileno(), self._readable)

    def unread(self) -> bool:
        """Whether the peer may have sent bytes not read yet (False after its EOF;
        True once closed before it: nothing says)."""
        if self.eof:
            return False
        if self.closed:
            return True
        count = array.array("i", [0])
        try:
            fcntl.ioctl(self.sock.fileno(), termios.FIONREAD, count)
        except OSError:
            return True
        return count[0] > 0

    def send_soon(self, data: bytes) -> None:
        """`send` `data` at the end of the loop's turn, in one write with the other
        frames sent on this channel meanwhile (any `send` sends those held first, in
        order). Large data is sent at once."""
        if self.closed or self.corks is None:
            return
        held = self.held
        if len(data) >= COPIED_BELOW:  # not copied into one write: after those held, now
            self.send(data)
        elif held is not None:
            held.append(data)
        else:
            self.held = [data]
            self.corks.add(self)

    def uncork(self) -> None:
        """Send the frames held by `send_soon` now."""
        held, self.held = self.held, None
        if held:
            self._send(held[0] if len(held) == 1 else b"".join(held))

    def forget_held(self) -> None:
        """Drop the frames `send_soon` holds: never sent (their requests were taken
        back to run elsewhere)."""
        self.held = None

    def send(self, data: bytes) -> None:
        """Queue `data` (not copied if it is large: it must not change); a failed send
        reports `lost`. Dropped once closed or unattached."""
        if self.held is not None:
            self.uncork()
        self._send(data)

    def _send(self, data: bytes) -> None:
        if self.closed or self.loop is None:
            return
        if self.out:
            self._queue(memoryview(data))
            if self.unsent > MAX_UNREAD:
                self.receiver.garbage(ProtocolError(
                    f"{self.unsent} bytes sent to it are unread: it does not read its socket"))
            return
        try:
            n = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            return self.receiver.lost()
        if n < len(data):
            self._queue(memoryview(data)[n:])
            self.loop.add_writer(self.sock.fileno(), self._writable)

    def _queue(self, data: memoryview) -> None:
        self.unsent += len(data)
        if len(data) >= COPIED_BELOW:
            self.out.append(data)
        elif self.out and isinstance(self.out[-1], bytearray):
            self.out[-1] += data
        else:
            self.out.append(bytearray(data))

    def _writable(self) -> None:
        first = self.out[0]
        try:
            n = self.sock.send(first)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self.receiver.lost()
        self.unsent -= n
        if n == len(first):
            self.out.popleft()
        elif isinstance(first, bytearray):
            del first[:n]
        else:
            self.out[0] = first[n:]
        if not self.out and self.loop is not None:
            self.loop.remove_writer(self.sock.fileno())

    def _readable(self) -> None:
        try:
            n = self.sock.recv_into(self.inbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            n = 0
        if not n:
            self.eof = True
            return self.receiver.lost()
        self.read += n
        try:
            frames = self.reader.feed(self.inbox_view[:n])  # cut from it: kept as copies
        except ProtocolError as e:
            return self.receiver.garbage(e)
        for kind, payload in frames:
            self.receiver.frame(kind, payload)
        if self.counting and self.read >= self.frame_end:  # the large frame is whole
            self._give_back()
        if self.reader.buf and not self.closed:  # a frame begun (most reads end whole)
            self._begun()

    def _begun(self) -> None:
        """A frame is begun: one larger than the receiver expects now is not kept (a
        guest that began 256 MiB frames and never ended them held that much of the PoP
        per isolate, in a request and, from a thread of its own, between them); a
        large one counts in the budget, and waits unread until it fits there."""
        held, length = self.reader.buf, self.reader.framing.length
        if len(held) < length.size:
            return
        size = length.unpack_from(held)[0]
        if size > (room := self.receiver.room()):
            self.receiver.garbage(ProtocolError(f"a frame of {size} bytes begun where at most "
                                                f"{room} may come now"))
        elif size >= COUNTED_FROM and not (self.counting or self.asking) \
                and self.budget is not None:
            self.frame_end = self.read - len(held) + length.size + size
            n = self.budget.counted(size)
            if self.budget.ask(self.owner, n, self._granted):
                self.counting = n
            else:
                self.asking = n
                self._stop()

    def _granted(self) -> None:
        """The frame begun fits the budget now: read on (if the receiver wants)."""
        self.counting, self.asking = self.asking, 0
        if self.wanted:
            self._start()

    def _give_back(self) -> None:
        counting, self.counting = self.counting, 0
        if self.budget is not None:
            self.budget.give_back(self.owner, counting)

    def close(self) -> None:
        """Stop reading and writing; what it held, read or to write, goes at once (not
        when its isolate is collected: they reference each other)."""
        if self.closed:
            return
        self.closed = True
        if self.counting:
            self._give_back()
        elif self.asking and self.budget is not None:
            self.asking = 0
            self.budget.withdraw(self._granted)
        self.reader.buf = bytearray()
        self.out.clear()
        self.unsent = 0
        self.held = None
        if self.loop is not None:
            self.loop.remove_reader(self.sock.fileno())
            self.loop.remove_writer(self.sock.fileno())
        self.sock.close()
