"""`runtime.workers.events` in one process, over a real abstract unix socket: a
worker's events reach the admin worker's side in order; while the admin worker is
away they wait, bounded (the oldest dropped and counted); a frame that does not
decode closes that connection only; the admin worker's ring takes them, and its
dashboard once watched. (Two real workers: tests/test_workers_fanout.py.)"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from runtime.observe.event import Event
from runtime.observe.ring import MAX_TEXT, Chunk, Query, Ring
from runtime.workers import events
from runtime.workers.events import HEADER, Forwarder, peer_observers, peer_raw, receive
from runtime.workers.role import Role
from tests.observe.metrics.support import event
from tests.support import Running, pop_thread


def role(tmp_path: Path, index: int) -> Role:
    return Role(index, 2, tmp_path)


async def until(check: object, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():  # type: ignore[operator]
            await asyncio.sleep(0.01)


def test_events_reach_the_admin_worker_in_order(tmp_path: Path) -> None:
    async def main() -> list[str]:
        got: list[Event] = []
        server = await receive(role(tmp_path, 0), got.append)
        forwarder = Forwarder(role(tmp_path, 1), 100)
        forwarder.start()
        try:
            for i in range(50):
                forwarder.observe(event(rid=f"r-{i}"))
                if i % 7 == 0:
                    await asyncio.sleep(0)  # several batches
            await until(lambda: len(got) == 50)
        finally:
            forwarder.close()
            server.close()
        return [e.rid for e in got]

    assert asyncio.run(main()) == [f"r-{i}" for i in range(50)]


def test_while_the_admin_worker_is_away_the_newest_events_wait_bounded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "RETRY", 0.05)

    async def main() -> tuple[int, list[str]]:
        forwarder = Forwarder(role(tmp_path, 1), 10)
        forwarder.start()
        for i in range(25):
            forwarder.observe(event(rid=f"r-{i}"))
        await asyncio.sleep(0.2)  # it tried and failed to connect meanwhile
        dropped = forwarder.dropped
        got: list[Event] = []
        server = await receive(role(tmp_path, 0), got.append)
        try:
            await until(lambda: len(got) == 10)
            await asyncio.sleep(0.1)
        finally:
            forwarder.close()
            server.close()
        return dropped, [e.rid for e in got]

    dropped, rids = asyncio.run(main())
    assert dropped == 15 and rids == [f"r-{i}" for i in range(15, 25)]


def test_no_event_is_lost_when_the_admin_worker_restarts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first event after the admin worker came back went into the dead socket of
    the old connection and was lost: the forwarder noticed only at its next write."""
    monkeypatch.setattr(events, "RETRY", 0.05)

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        old = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # the first admin worker
        old.bind(role(tmp_path, 0).events_address())
        old.listen()
        old.setblocking(False)
        forwarder = Forwarder(role(tmp_path, 1), 100)
        forwarder.start()
        got: list[Event] = []
        server = None
        try:
            conn, _ = await loop.sock_accept(old)
            forwarder.observe(event(rid="before"))
            assert await asyncio.wait_for(loop.sock_recv(conn, 1 << 16), 5)
            conn.close()  # it dies, with its connection and its address
            old.close()
            await asyncio.sleep(0.3)
            server = await receive(role(tmp_path, 0), got.append)  # and comes back
            await asyncio.sleep(0.3)
            for i in range(3):
                forwarder.observe(event(rid=f"after-{i}"))
                await asyncio.sleep(0.01)
            await until(lambda: len(got) == 3, timeout=5)
        finally:
            forwarder.close()
            if server is not None:
                server.close()
        return [e.rid for e in got]

    assert asyncio.run(main()) == ["after-0", "after-1", "after-2"]


def test_a_frame_that_does_not_decode_closes_that_connection_only(tmp_path: Path) -> None:
    async def main() -> tuple[bytes, list[str]]:
        got: list[Event] = []
        server = await receive(role(tmp_path, 0), got.append)
        loop = asyncio.get_running_loop()
        bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bad.setblocking(False)
        forwarder = Forwarder(role(tmp_path, 1), 10)
        try:
            await loop.sock_connect(bad, role(tmp_path, 0).events_address())
            await loop.sock_sendall(bad, HEADER.pack(5) + b"\xc1oops")
            closed = await asyncio.wait_for(loop.sock_recv(bad, 10), 10)
            forwarder.start()
            forwarder.observe(event(rid="after"))
            await until(lambda: len(got) == 1)
        finally:
            bad.close()
            forwarder.close()
            server.close()
        return closed, [e.rid for e in got]

    assert asyncio.run(main()) == (b"", ["after"])


def test_the_admin_worker_rings_them_and_its_dashboard_counts_them_once_watched(
        tmp_path: Path) -> None:
    with pop_thread(tmp_path / "data") as running:
        deliver = peer_observers(running.pop)
        rolling = running.pop.dashboard
        assert rolling is not None

        def on_loop(fn: object) -> None:
            async def run() -> None:
                fn()  # type: ignore[operator]

            assert running.loop is not None
            asyncio.run_coroutine_threadsafe(run(), running.loop).result(10)

        now = _now(running)
        on_loop(lambda: deliver(event(rid="unwatched", ts=now)))
        assert rolling.total == 0
        on_loop(running.pop.watch_dashboard)  # replays the ring: 1
        on_loop(lambda: deliver(event(rid="watched", ts=now)))
        assert rolling.total == 2
        assert [e.rid for e in running.pop.ring.events] == ["unwatched", "watched"]


def _now(running: Running) -> float:
    assert running.pop.dashboard is not None
    return running.pop.dashboard.clock()


def test_a_backlog_is_sent_in_frames_of_at_most_frame_events(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "FRAME_EVENTS", 4)

    async def main() -> list[int]:
        forwarder = Forwarder(role(tmp_path, 1), 100)
        for i in range(10):  # queued before the admin worker listens: one backlog
            forwarder.observe(event(rid=f"r-{i}"))
        sizes: list[int] = []
        done = asyncio.Event()

        async def frames(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            while sum(sizes) < 10:
                (n,) = HEADER.unpack(await r.readexactly(HEADER.size))
                sizes.append(len(msgspec.msgpack.decode(await r.readexactly(n))))
            done.set()
            w.close()

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(role(tmp_path, 0).events_address())
        server = await asyncio.start_unix_server(frames, sock=sock)
        forwarder.start()
        try:
            await asyncio.wait_for(done.wait(), 10)
        finally:
            forwarder.close()
            server.close()
        return sizes

    assert asyncio.run(main()) == [4, 4, 2]


def test_unsampled_events_are_forwarded_only_once_the_admin_worker_s_dashboard_is_watched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each worker encoded and sent every event `[events] sample` left out, for the
    admin worker to drop unless its dashboard was watched."""
    monkeypatch.setattr(events, "WATCH_POLL", 0.05)

    async def main() -> tuple[list[str], list[str]]:
        got: list[Event] = []
        dashboard = [False]
        server = await receive(role(tmp_path, 0), got.append, lambda: dashboard[0])
        forwarder = Forwarder(role(tmp_path, 1), 100)
        forwarder.start()
        try:
            await until(lambda: forwarder.task is not None and forwarder.wake is not None)
            for i in range(3):
                forwarder.observe(event(rid=f"left-out-{i}", sampled=False))
            forwarder.observe(event(rid="kept"))
            await until(lambda: len(got) == 1)
            before = [e.rid for e in got]
            assert not forwarder.pending and not forwarder.everything
            dashboard[0] = True  # with no frame to answer: told within WATCH_POLL
            await until(lambda: forwarder.everything, timeout=5)
            forwarder.observe(event(rid="counted", sampled=False))
            await until(lambda: len(got) == 2)
        finally:
            forwarder.close()
            server.close()
        return before, [e.rid for e in got]

    assert asyncio.run(main()) == (["kept"], ["kept", "counted"])


def test_unwatched_frames_go_into_the_ring_undecoded_and_read_back_whole(
        tmp_path: Path) -> None:
    """Until its dashboard is watched, the admin worker keeps the others' events as
    their msgpack: nothing is decoded on arrival (no `deliver`, no Event in the ring),
    and a read makes each as the ring would have kept it; the sender bounded the long
    one as the ring bounds its own."""
    ring = Ring(100, 4096)
    long_path = "/p" + "x" * 5000
    sent = [event(rid=f"r-{i}", path=long_path if i == 3 else f"/p{i}") for i in range(20)]

    async def main() -> list[Event]:
        got: list[Event] = []
        server = await receive(role(tmp_path, 0), got.append,
                               deliver_raw=peer_raw(SimpleNamespace(ring=ring)))  # type: ignore[arg-type]
        forwarder = Forwarder(role(tmp_path, 1), 100, 4096)
        forwarder.start()
        try:
            for e in sent:
                forwarder.observe(e)
            await until(lambda: len(ring) == 20)
        finally:
            forwarder.close()
            server.close()
        return got

    assert asyncio.run(main()) == []
    assert all(isinstance(item, Chunk) for item in ring.items)  # none decoded yet
    read = list(ring.events)
    assert [e.rid for e in read] == [e.rid for e in sent]
    assert read[3].path == long_path[:MAX_TEXT // 2]
    assert read[:3] + read[4:] == sent[:3] + sent[4:]
    assert [e.rid for e in ring.query(Query(path="/p1"))] == ["r-1"] + [
        f"r-{i}" for i in range(10, 20)]


def test_a_live_follower_of_the_ring_gets_the_undecoded_events_decoded(
        tmp_path: Path) -> None:
    ring = Ring(100, 4096)

    async def main() -> list[str]:
        sub = ring.subscribe(Query(), 100)
        server = await receive(role(tmp_path, 0), lambda e: None,
                               deliver_raw=peer_raw(SimpleNamespace(ring=ring)))  # type: ignore[arg-type]
        forwarder = Forwarder(role(tmp_path, 1), 100)
        forwarder.start()
        try:
            for i in range(5):
                forwarder.observe(event(rid=f"r-{i}"))
            await until(lambda: len(sub.buffer) == 5)
        finally:
            forwarder.close()
            server.close()
        events_, _ = await sub.get(1)
        return [e.rid for e in events_]

    assert asyncio.run(main()) == [f"r-{i}" for i in range(5)]
    assert not any(isinstance(item, Chunk) for item in ring.items)


def test_once_watched_the_admin_worker_decodes_every_frame(tmp_path: Path) -> None:
    """Told `WATCHED`, a worker sends unsampled events too (for the dashboard): those
    frames are decoded and delivered one by one, none goes to the ring undecoded."""
    async def main() -> tuple[list[tuple[str, bool]], int]:
        got: list[Event] = []
        raw_frames: list[int] = []
        server = await receive(role(tmp_path, 0), got.append, watched=lambda: True,
                               deliver_raw=lambda raws: raw_frames.append(len(raws)))
        forwarder = Forwarder(role(tmp_path, 1), 100)
        forwarder.start()
        try:
            await until(lambda: forwarder.everything)
            forwarder.observe(event(rid="kept"))
            forwarder.observe(event(rid="left-out", sampled=False))
            await until(lambda: len(got) == 2)
        finally:
            forwarder.close()
            server.close()
        return [(e.rid, e.sampled) for e in got], len(raw_frames)

    assert asyncio.run(main()) == ([("kept", True), ("left-out", False)], 0)


def test_an_undecodable_event_in_a_raw_frame_is_left_out_when_read() -> None:
    good = msgspec.Raw(msgspec.msgpack.encode(event(rid="good")))
    bad = msgspec.Raw(msgspec.msgpack.encode({"rid": 3}))
    assert [e.rid for e in events.RAW_EVENTS.events([good, bad, good])] == ["good", "good"]


def test_a_frame_that_does_not_decode_closes_that_connection_on_the_raw_path_too(
        tmp_path: Path) -> None:
    async def main() -> tuple[bytes, list[int]]:
        frames: list[int] = []
        server = await receive(role(tmp_path, 0), lambda e: None,
                               deliver_raw=lambda raws: frames.append(len(raws)))
        loop = asyncio.get_running_loop()
        bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bad.setblocking(False)
        try:
            await loop.sock_connect(bad, role(tmp_path, 0).events_address())
            await loop.sock_sendall(bad, HEADER.pack(5) + b"\xc1oops")
            closed = await asyncio.wait_for(loop.sock_recv(bad, 10), 10)
        finally:
            bad.close()
            server.close()
        return closed, frames

    assert asyncio.run(main()) == (b"", [])
