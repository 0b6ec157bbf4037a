"""Where a Python function call's time goes, without HTTP: CPU per request in the
PoP and in its isolate host, next to the cross-process wake-up floor.

    python bench/bench_python_call.py [-n 20000] [-c 8] [--pipeline N]

1. The wake-up floor, measured in this run: two processes trading a 160-byte
   message over a socketpair (what the isolate wire uses) and over shared memory
   with eventfd doorbells (what a shared-memory ring would use), one message per
   wake-up and 8 per wake-up. CPU microseconds per message per side; the ratio is
   eventfd to socketpair.
2. The python-hello function through `PythonFunction.handle` on uvloop with `-c`
   callers against a real isolate host (sandboxed where the machine allows, else
   run as --insecure-python): req/s, CPU per request in this process (the PoP's
   side: encoding, the socket, scheduling, decoding) and in the host (decode,
   handler, encode, its socket; its CPU clock, measured once every isolate the
   warm-up started serves), and how much of that the wake-up floor explains;
   `--pipeline N`: with the manifest's `pool.pipeline` set to N (requests sent
   ahead to busy isolates).
3. The isolate's request loop alone (`guest.serve` on a thread of this process,
   with this checkout's SDK; no subinterpreter, no PoP): CPU per request of both
   threads, the caller's side being a blocking socket send and frame read.

A shared-memory ring pays only where the floor is a large share of a request's
CPU; print it here before building one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import mmap
import os
import resource
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HELLO = ROOT / "functions" / "examples" / "python-hello"
sys.path[:0] = [str(ROOT), str(ROOT / "functions" / "sdk" / "python"), str(HELLO)]

MSG = b"x" * 160


def cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def ping_pong(n: int, parent: Callable[[], None], child: Callable[[], None]) -> tuple[float, float]:
    """CPU seconds of (parent, child) for `n` calls of each, the child forked."""
    pid = os.fork()
    if pid == 0:
        for _ in range(n):
            child()
        os._exit(0)
    c0, p0 = cpu(resource.RUSAGE_CHILDREN), cpu(resource.RUSAGE_SELF)
    for _ in range(n):
        parent()
    p1 = cpu(resource.RUSAGE_SELF)
    os.waitpid(pid, 0)
    return p1 - p0, cpu(resource.RUSAGE_CHILDREN) - c0


def socket_floor(n: int, batch: int) -> tuple[float, float]:
    a, b = socket.socketpair()
    size = len(MSG) * batch

    def recv_all(s: socket.socket) -> None:
        got = 0
        while got < size:
            got += len(s.recv(65536))

    def parent() -> None:
        a.sendall(MSG * batch)
        recv_all(a)

    def child() -> None:
        recv_all(b)
        b.sendall(MSG * batch)

    try:
        return ping_pong(n // batch, parent, child)
    finally:
        a.close()
        b.close()


def eventfd_floor(n: int, batch: int) -> tuple[float, float]:
    shared, ask, answer = mmap.mmap(-1, 1 << 16), os.eventfd(0), os.eventfd(0)
    size = len(MSG) * batch

    def parent() -> None:
        shared[0:size] = MSG * batch
        os.eventfd_write(ask, 1)
        os.eventfd_read(answer)
        bytes(shared[32768:32768 + size])

    def child() -> None:
        os.eventfd_read(ask)
        shared[32768:32768 + size] = shared[0:size]
        os.eventfd_write(answer, 1)

    try:
        return ping_pong(n // batch, parent, child)
    finally:
        os.close(ask)
        os.close(answer)
        shared.close()


def floors(n: int) -> float:
    """Print the floors; return the socketpair's CPU us per message per side (batch 1)."""
    print(f"== wake-up floor, {n} messages of {len(MSG)} bytes, CPU us per message ==")
    print(f"{'':<28}{'batch':>6}{'parent':>9}{'child':>9}{'x socket':>10}")
    per_side = 0.0
    for batch in (1, 8):
        sock = socket_floor(n, batch)
        efd = eventfd_floor(n, batch)
        for name, (p, c) in (("socketpair", sock), ("eventfd + shared memory", efd)):
            print(f"{name:<28}{batch:>6}{p / n * 1e6:>9.2f}{c / n * 1e6:>9.2f}"
                  f"{(p + c) / sum(sock):>10.2f}")
        if batch == 1:
            per_side = sum(sock) / 2 / n * 1e6
    return per_side


def host_cpu() -> float:
    """CPU seconds of this process's children (the isolate hosts), from each one's
    CPU-time clock: nanoseconds, ended threads included (`/proc/PID/stat` counts
    10 ms ticks: +-5 us a request over 5000 of them)."""
    from runtime.executors.python.thread_clock import ProcessClock

    total = 0.0
    for task in Path("/proc/self/task").iterdir():  # children are listed by the thread
        for pid in (task / "children").read_text().split():  # that started them
            total += ProcessClock(int(pid)).read() or 0.0
    return total


async def calls(n: int, callers: int, floor_us: float, pipeline: int | None = None) -> None:
    from runtime.executors.python.function import PythonFunction
    from runtime.functions.manifest import load
    from runtime.net.message import Request

    fn = PythonFunction(load(HELLO), HELLO, "bench", insecure=True)
    if pipeline is not None:
        fn.cfg = dataclasses.replace(fn.cfg, pipeline=pipeline)
    fn.prewarm()
    fn.activate()
    request = Request(b"GET", b"/py/hello", b"", [(b"host", b"bench"), (b"user-agent", b"b")],
                      b"bench", "1.1", True, "127.0.0.1")

    async def caller(k: int) -> None:
        for _ in range(k):
            if (await fn.handle(request, "/py/hello", {})).status != 200:
                raise RuntimeError("python-hello did not answer 200")

    serving = 0
    try:
        await asyncio.gather(*(caller(200) for _ in range(callers)))  # warm
        # and until the isolates the load made it start are serving: a fresh interpreter
        # costs its host ~100 ms of CPU, 20 us a request over 5000 of them
        assert fn.pool is not None
        for _ in range(100):
            if not any(i.state == "starting" for i in fn.pool.scheduler.isolates):
                break
            await asyncio.gather(*(caller(50) for _ in range(callers)))
        h0, p0, t0 = host_cpu(), cpu(resource.RUSAGE_SELF), time.perf_counter()
        await asyncio.gather(*(caller(n // callers) for _ in range(callers)))
        serving = sum(i.state in ("idle", "busy") for i in fn.pool.scheduler.isolates)
        wall, pop, host = (time.perf_counter() - t0, cpu(resource.RUSAGE_SELF) - p0,
                           host_cpu() - h0)
    finally:
        fn.close()
    done = n // callers * callers
    pop_us, host_us = pop / done * 1e6, host / done * 1e6
    ahead = f", pool.pipeline = {pipeline}" if pipeline is not None else ""
    print(f"\n== python-hello via PythonFunction.handle, {callers} callers, {done} calls{ahead}, "
          f"{serving} isolates ==")
    print(f"req/s {done / wall:.0f}; CPU per request: PoP {pop_us:.1f} us, host {host_us:.1f} us")
    print(f"wake-up floor (socketpair, one side) {floor_us:.1f} us = "
          f"{floor_us / pop_us:.2f} of the PoP's, {floor_us / host_us:.2f} of the host's")


def guest_loop(n: int) -> None:
    import threading

    import edgefn
    import main as hello  # functions/examples/python-hello/main.py

    from edgefn_core.abi import encode_request
    from edgefn_core.errors import IsolateStop
    from runtime.executors.python import guest, wire

    def serve(sock: socket.socket) -> None:
        # IsolateStop: how the loop ends when its PoP (here: this thread) closes the socket
        with contextlib.suppress(IsolateStop):
            guest.serve((sock, hello.handle), 50, 2000, n + 1, sdk=edgefn)

    ours, theirs = socket.socketpair()
    loop = threading.Thread(target=serve, args=(theirs,))
    loop.start()
    request = wire.frame(wire.REQUEST, encode_request(
        b"GET", b"/py/hello", b"", [(b"host", b"bench"), (b"user-agent", b"wrk/4.2"),
                                    (b"accept", b"*/*")], b"", b""))
    reader, pending = wire.Reader(), []  # type: ignore[var-annotated]
    wire.recv_frame(ours, reader, pending)  # READY
    c0 = cpu(resource.RUSAGE_SELF)
    for _ in range(n):
        ours.sendall(request)
        frame = wire.recv_frame(ours, reader, pending)
        if frame is None or frame[0] != wire.RESPONSE:
            raise RuntimeError(f"the isolate loop answered {frame!r}")
    spent = cpu(resource.RUSAGE_SELF) - c0
    ours.close()
    loop.join()
    print(f"\n== the isolate loop in this process, {n} requests ==")
    print(f"CPU per request, both threads: {spent / n * 1e6:.1f} us")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=20000)
    p.add_argument("-c", type=int, default=8, help="concurrent callers")
    p.add_argument("--pipeline", type=int, help="the function's pool.pipeline (default: "
                   "its manifest's)")
    args = p.parse_args()
    floor_us = floors(args.n)
    import uvloop
    uvloop.run(calls(args.n, args.c, floor_us, args.pipeline))
    guest_loop(args.n)
    print(f"(load average {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
