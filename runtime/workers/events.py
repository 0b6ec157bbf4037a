"""Every worker's events in the admin worker's ring (``workers = N``).

The events ring (``/v1/events``, ``edgefn tail``) and the dashboard live in the
admin worker, the one with the admin API. Each other worker forwards its events
there: `Forwarder` is one of its observers; it queues events (never blocking the
worker's loop) and a task sends them in batches over a unix socket to the admin
worker's `receive` server, which hands them to its ring and, once somebody watches
the dashboard, to its aggregator. Not to its metrics (a scrape asks each worker
for its own: `runtime.observe.metrics_merge`), its events file (each worker writes
its own) or its traces (each worker exports its own).

A frame is a 4-byte big-endian length and a msgpack array of events. When the
admin worker is down or slower than the traffic, at most `max_pending` events wait;
older ones are dropped, counted, and logged once per outage.

An event `[events] sample` left out (``sampled`` false) goes to no ring, so a worker
forwards it only once the admin worker says its dashboard is watched (the one byte
`WATCHED`, within `WATCH_POLL` of the first look): before, every worker encoded and
sent each such event for the admin worker to drop.

Until then a worker's frames hold only what the ring keeps as it is (sampled events,
bounded by the worker as the ring would bound them: `ring.kept`), so the admin worker
need not decode them: it splits a frame into its events' msgpack (`msgspec.Raw`) and
the ring decodes each when read (`RawEvents`). Decoding and ringing the others' events
took ~19% of the admin worker's main thread under load with two workers.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from runtime.observe.batch import EventBatch
from runtime.observe.event import Event
from runtime.observe.ring import kept
from runtime.observe.settings import MAX_EVENT_BYTES
from runtime.workers.role import Role

if TYPE_CHECKING:
    from runtime.pop import PoP

log = logging.getLogger("edgefn.workers")
HEADER = struct.Struct(">I")
MAX_FRAME = 64 << 20
RETRY = 0.5  # seconds between attempts to reach the admin worker
# events a frame holds at most: a backlog (up to ring_size) is decoded a frame per loop
# iteration by the admin worker, never all at once while its requests wait
FRAME_EVENTS = 256
WATCHED = b"\x01"  # the admin worker to a worker: its dashboard counts every event now
WATCH_POLL = 0.5  # seconds: how soon a worker hears its admin worker's dashboard is watched


class Forwarder:
    """A worker's observer that sends its events to the admin worker. `start()`
    on the worker's loop; `close()` stops it."""

    def __init__(self, role: Role, max_pending: int,
                 max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.role = role
        self.max_event_bytes = max_event_bytes  # the ring's: events go bounded as it would
        self.pending: deque[Event] = deque()
        self.max_pending = max_pending
        self.dropped = 0
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self._encode = msgspec.msgpack.Encoder().encode
        self.everything = False  # unsampled events too: the admin worker's dashboard is watched

    def observe(self, event: Event) -> None:
        if not event.sampled and not self.everything:
            return
        if len(self.pending) >= self.max_pending:
            self.pending.popleft()  # the newest matter most to a live tail
            self.dropped += 1
        self.pending.append(event)
        self.wake.set()

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._forever())

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def _forever(self) -> None:
        while True:
            try:
                reader, writer = await self._connect()
            except OSError:
                await asyncio.sleep(RETRY)
                continue
            try:
                await self._send_all(reader, writer)
            except OSError as e:
                log.warning("forwarding events to the admin worker: %r; reconnecting", e)
            finally:
                writer.close()
            await asyncio.sleep(RETRY)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:  # connected here: uvloop takes no abstract address by name
            await asyncio.get_running_loop().sock_connect(sock, self.role.events_address())
        except BaseException:
            sock.close()
            raise
        return await asyncio.open_unix_connection(sock=sock)

    async def _send_all(self, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> None:
        """Send batches while connected. Raises OSError when the connection goes: at
        once when the admin worker closes it (it sends nothing, so a read ends only
        then), not at the next write, which went into the dead socket and lost its
        batch (the first event after the admin worker restarted)."""
        self.everything = False  # until this admin worker says otherwise
        closed = asyncio.ensure_future(self._listen(reader))
        try:
            while True:
                woken = asyncio.ensure_future(self.wake.wait())
                await asyncio.wait({woken, closed}, return_when=asyncio.FIRST_COMPLETED)
                if closed.done():
                    woken.cancel()
                    raise ConnectionResetError("the admin worker closed the connection")
                await self._send_pending(writer)
        finally:
            closed.cancel()

    async def _listen(self, reader: asyncio.StreamReader) -> None:
        """Take what the admin worker says (`WATCHED`) until it closes the connection."""
        while chunk := await reader.read(64):
            if WATCHED in chunk:
                self.everything = True

    async def _send_pending(self, writer: asyncio.StreamWriter) -> None:
        self.wake.clear()
        if self.dropped:
            log.warning("dropped %d events the admin worker could not take in time",
                        self.dropped)
            self.dropped = 0
        cap = self.max_event_bytes
        while self.pending:  # frames of at most FRAME_EVENTS: see `_read`
            batch = [kept(self.pending.popleft(), cap)
                     for _ in range(min(FRAME_EVENTS, len(self.pending)))]
            body = self._encode(batch)
            writer.write(HEADER.pack(len(body)) + body)
            await writer.drain()  # meanwhile events queue (bounded) in `pending`


class RawEvents:
    """Makes the ring's undecoded events (`runtime.observe.batch.Deferred`): each
    record is one event's msgpack. One that does not decode (no worker of this
    version sends one) is left out and logged."""

    def __init__(self) -> None:
        self.decode = msgspec.msgpack.Decoder(Event).decode

    def events(self, records: list[msgspec.Raw]) -> list[Event]:
        out = []
        for raw in records:
            try:
                out.append(self.decode(raw))
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                log.error("an event another worker sent does not decode (%s); left out", e)
        return out


RAW_EVENTS = RawEvents()


async def receive(role: Role, deliver: Callable[[Event], None],
                  watched: Callable[[], bool] = lambda: False,
                  deliver_raw: Callable[[list[msgspec.Raw]], None] | None = None
                  ) -> asyncio.AbstractServer:
    """The admin worker's end: `deliver(event)` for each event the others send; once
    `watched()` (its dashboard), each worker is told to send unsampled events too.
    With `deliver_raw`, a frame from a worker not told so goes to it undecoded, a
    `msgspec.Raw` an event. Raises OSError if the address is taken."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:  # bound here: uvloop takes no abstract address (leading NUL) by name
        sock.bind(role.events_address())
    except OSError:
        sock.close()
        raise
    return await asyncio.start_unix_server(
        lambda r, w: _read(r, w, deliver, watched, deliver_raw), sock=sock)


async def _read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                deliver: Callable[[Event], None], watched: Callable[[], bool],
                deliver_raw: Callable[[list[msgspec.Raw]], None] | None) -> None:
    decode = msgspec.msgpack.Decoder(list[Event]).decode
    split = msgspec.msgpack.Decoder(list[msgspec.Raw]).decode
    told = False
    try:
        while True:
            if not told and watched():
                writer.write(WATCHED)
                told = True
            try:  # until it is told, looked at again every WATCH_POLL (a worker sending
                # no sampled events sends no frame to answer)
                head = await asyncio.wait_for(reader.readexactly(HEADER.size),
                                              None if told else WATCH_POLL)
            except TimeoutError:  # nothing of the header was taken from the stream
                continue
            (size,) = HEADER.unpack(head)
            if size > MAX_FRAME:
                raise ValueError(f"an events frame of {size} bytes (at most {MAX_FRAME})")
            body = await reader.readexactly(size)
            if deliver_raw is not None and not told:  # sampled and bounded: kept as sent
                deliver_raw(split(body))
            else:
                for event in decode(body):
                    deliver(event)
            # a backlog arrives as many frames already read: let requests run between them
            await asyncio.sleep(0)
    except asyncio.IncompleteReadError:
        pass  # the worker went away
    except (ValueError, msgspec.DecodeError) as e:
        log.error("a worker sent events that do not decode (%s); closing its connection", e)
    finally:
        writer.close()


def peer_observers(pop: PoP) -> Callable[[Event], None]:
    """What the admin worker does with another worker's event: its ring, and the
    dashboard's aggregator while it is watched (as `PoP.watch_dashboard` added it)."""
    def deliver(event: Event) -> None:
        pop.ring.observe(event)
        if watched(pop):
            pop.dashboard.observe(event)  # type: ignore[union-attr]

    return deliver


def peer_raw(pop: PoP) -> Callable[[list[msgspec.Raw]], None]:
    """What the admin worker does with a frame of undecoded events (`receive`): its
    ring keeps them so (decoding them at once for a live follower)."""
    def deliver(raws: list[msgspec.Raw]) -> None:
        pop.ring.observe_batch(EventBatch.later(RAW_EVENTS, raws, None, None))

    return deliver


def watched(pop: PoP) -> bool:
    """Whether `pop`'s dashboard counts events (somebody opened it)."""
    return pop.dashboard is not None and pop.dashboard in pop.observers
