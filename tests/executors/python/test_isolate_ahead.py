"""Requests for one isolate on the PoP's loop (`Isolate.run`): the one it runs next
goes out at once; those sent ahead to it while it is busy wait for the end of the
loop's turn and go out in one write; those taken back before then (`unstarted`:
its isolate ended) are never sent."""

from __future__ import annotations

import asyncio
import socket

from runtime.executors.python import wire
from runtime.executors.python.isolate import Isolate
from runtime.executors.python.job import Job
from tests.executors.python.test_channel import available
from tests.executors.python.test_isolate_calls import Owner


def test_the_next_request_goes_at_once_those_sent_ahead_in_one_write_at_the_turns_end() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        ours, guest = socket.socketpair()
        isolate = Isolate(Owner([0]), ours, state="busy")
        isolate.attach(loop)
        jobs = [Job(loop, bytes([n]) * 30) for n in range(3)]
        frames = [wire.frame(wire.REQUEST, job.payload) for job in jobs]
        isolate.run(jobs[0])
        assert available(guest) == frames[0]  # its thread starts while the loop goes on
        isolate.run(jobs[1])
        isolate.run(jobs[2])
        assert available(guest) == b""
        await asyncio.sleep(0)
        assert guest.recv(1 << 16) == frames[1] + frames[2]  # one read: one wake-up
        isolate.close()
        guest.close()

    asyncio.run(go())


def test_requests_taken_back_before_the_turn_ends_are_never_sent() -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        ours, guest = socket.socketpair()
        isolate = Isolate(Owner([0]), ours, state="busy")
        isolate.attach(loop)
        first, ahead = Job(loop, b"first"), Job(loop, b"ahead")
        isolate.run(first)
        isolate.run(ahead)
        assert isolate.unstarted() == [ahead]  # e.g. its isolate ended: it runs elsewhere
        await asyncio.sleep(0)
        assert available(guest) == wire.frame(wire.REQUEST, b"first")
        isolate.close()
        guest.close()

    asyncio.run(go())
