"""The floor of a request that crosses to another process: a raw uvloop+httptools
hello whose every request makes one round trip over a socketpair to peer threads
in a second process (a 160-byte message each way, the peers doing nothing else),
against the raw server in the same run.

    python bench/bench_hop_floor.py [--rounds 2] [--seconds 5] [--peers 1,2,4]

A Python function's request makes that round trip to its isolate host, and so pays
at least this. `--peers N`: requests go to an idle peer if there is one, else
queue on the peer with the fewest (as the PoP sends requests ahead), so with more
peers more of them sleep between requests and are woken for the next one; with one,
it takes them in batches. Prints req/s under `wrk -t1 -c32` and each variant's ratio
to raw.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _baseline
import _wrk

MSG = 160


def echo(sock: socket.socket) -> None:
    """A peer: answer each whole message read with one of the same size."""
    buf = bytearray(1 << 16)
    have = 0
    while True:
        n = sock.recv_into(buf)
        if not n:
            return
        have += n
        k, have = divmod(have, MSG)
        sock.sendall(b"r" * (MSG * k))


class Peer:
    """The server's side of one peer: the clients waiting for its answers, in order."""

    def __init__(self, sock: socket.socket, idle: list[Peer]) -> None:
        self.sock = sock
        self.idle = idle
        self.waiting: deque[asyncio.Transport] = deque()
        self.buf = bytearray(1 << 16)
        self.have = 0
        sock.setblocking(False)
        asyncio.get_running_loop().add_reader(sock.fileno(), self.readable)

    def readable(self) -> None:
        self.have += self.sock.recv_into(self.buf)
        while self.have >= MSG:
            self.have -= MSG
            transport = self.waiting.popleft()
            if not transport.is_closing():
                transport.write(_baseline.RESPONSE)
        if not self.waiting:
            self.idle.append(self)


def serve(port: int, peers: int) -> None:
    """Run the server and its peer process until SIGTERM."""
    pairs = [socket.socketpair() for _ in range(peers)]
    if os.fork() == 0:  # the peers: one thread each, in one process
        for ours, _ in pairs:
            ours.close()
        threads = [threading.Thread(target=echo, args=(theirs,)) for _, theirs in pairs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        os._exit(0)
    for _, theirs in pairs:
        theirs.close()
    request = b"q" * MSG

    class Hop(_baseline.HelloProtocol):
        def on_message_complete(self) -> None:
            peer = idle.pop() if idle else min(all_peers, key=lambda p: len(p.waiting))
            assert self._transport is not None
            peer.waiting.append(self._transport)
            peer.sock.send(request)

    idle: list[Peer] = []
    all_peers: list[Peer] = []

    async def main() -> None:
        all_peers.extend(Peer(ours, idle) for ours, _ in pairs)
        idle.extend(all_peers)
        loop = asyncio.get_running_loop()
        await loop.create_server(Hop, _baseline.HOST, port, backlog=1024)
        print(f"listening on {_baseline.HOST}:{port}", flush=True)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()

    import uvloop
    uvloop.run(main())


def free_port() -> int:
    with socket.socket() as s:
        s.bind((_baseline.HOST, 0))
        return int(s.getsockname()[1])


def measure(cmd: list[str], port: int, seconds: int) -> float:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        _baseline.wait_until_listening(proc, _baseline.HOST, port, 10)
        url = f"http://{_baseline.HOST}:{port}/"
        _wrk.run(url, seconds=1)
        r = _wrk.run(url, seconds=seconds)
        if r["errors"]:
            raise RuntimeError(f"{r['errors']} errors under load")
        return float(r["rps"])
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the server and its peer process
        proc.wait()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--peers", default="1,2,4")
    p.add_argument("--serve", nargs=2, type=int, metavar=("PORT", "PEERS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(*args.serve)
        return 0
    variants = {"raw uvloop+httptools": None} | {
        f"one round trip, {n} peer{'s' * (n > 1)}": n for n in map(int, args.peers.split(","))}
    found: dict[str, list[float]] = {name: [] for name in variants}
    for n in range(args.rounds):
        for name, peers in variants.items() if n % 2 == 0 else reversed(variants.items()):
            port = free_port()
            cmd = ([sys.executable, str(Path(_baseline.__file__)), str(port)] if peers is None
                   else [sys.executable, __file__, "--serve", str(port), str(peers)])
            found[name].append(measure(cmd, port, args.seconds))
            print(f"round {n + 1} {name}: {found[name][-1]:.0f} req/s", flush=True)
            time.sleep(1)
    raw = max(found["raw uvloop+httptools"])
    print(f"\n== wrk -t1 -c32 -d{args.seconds}s, best of {args.rounds} rounds ==")
    print(f"{'server':<34}{'req/s':>9}{'x raw':>8}")
    for name, rps in found.items():
        print(f"{name:<34}{max(rps):>9.0f}{max(rps) / raw:>8.2f}")
    print(f"(load average {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
