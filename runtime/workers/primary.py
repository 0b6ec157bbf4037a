"""The parent of ``workers = N`` PoP processes (see `runtime.workers`).

It holds DATA/pop.lock, reserves the public and admin ports (a socket bound with
SO_REUSEPORT that never listens: the workers bind the same port beside it, and a
restarted worker finds its port still free), runs the one model worker the
workers share (they reach it on its socket), makes the table of shared memory
they count rate limits in (`native.SharedTable`), starts the workers, starts again one
that dies, and on SIGTERM/SIGINT drains them all (each finishes its in-flight
requests for `grace_seconds`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import time
from collections.abc import AsyncIterator
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import msgspec

from edgefn_core.errors import Failure, Interrupted
from runtime.admin.client import PopInfo
from runtime.ai.service import AIService
from runtime.app import StopSignals, _lock, _start_ai, admin_token
from runtime.config import AdminListener, Listener, PopConfig
from runtime.pipeline.build import wants_shared_table
from runtime.security.bots.manager import challenge_secret
from runtime.security.ratelimit.native import SharedTable, inherit_table
from runtime.workers import child, starting
from runtime.workers.control import exchange
from runtime.workers.role import Role

log = logging.getLogger("edgefn.workers")
START_TIMEOUT = 300.0  # seconds a worker has to restore its functions and listen
PR_SET_PDEATHSIG = 1  # prctl(2)
BACKOFF = (0.1, 5.0)  # restart delay: first, most (doubling while workers die young)
STOP_MARGIN = 15.0  # seconds past grace_seconds workers have to end on SIGTERM
# how often each worker that said ready is asked whether its loop still runs (a control
# "ping"); one that does not answer within twice `worker_ack_timeout` (a change it is
# told of kills it sooner) is killed (SIGKILL) and started again: a worker whose loop
# froze (a deadlock in a native call) served none of the connections the kernel gave
# it, for good, and nothing noticed
LIVENESS_EVERY = 5.0


def reserve(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` with SO_REUSEPORT, never listening: it holds
    the port (0: any free one) for the workers. Raises OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class Primary:
    """Starts, restarts and stops the workers of one PoP config."""

    def __init__(self, config: PopConfig, verbosity: int = 0, table: str | None = None
                 ) -> None:
        """`table`: the path its workers open the shared rate-limit table by."""
        self.config = config
        self.table = table
        self.count = config.worker_count()
        self.verbosity = verbosity
        self.procs: list[BaseProcess | None] = [None] * self.count
        self.started: list[float] = [0.0] * self.count
        self.delay: list[float] = [BACKOFF[0]] * self.count
        self.stopping = False
        self.restarts = 0
        self.live: list[bool] = [False] * self.count  # it said ready, and is watched
        self._ctx = multiprocessing.get_context("spawn")  # no fork of a threaded parent

    def start(self, index: int) -> Connection:
        """Start worker `index`; the connection it says ``ready`` on."""
        ours, theirs = self._ctx.Pipe(duplex=False)
        role = Role(index, self.count, self.config.data_dir, self.config.worker_ack_timeout,
                    self.table)
        proc = self._ctx.Process(target=child.main, args=(for_worker(self.config, index), role,
                                                           theirs, self.verbosity),
                                 name=f"edgefn-worker-{index}", daemon=False)
        proc.start()
        theirs.close()
        self.procs[index], self.started[index] = proc, time.monotonic()
        return ours

    async def ready(self, index: int, conn: Connection) -> None:
        """Wait for worker `index` to listen. Raises `Failure` if it exits first
        or takes longer than `START_TIMEOUT`."""
        proc = self.procs[index]
        assert proc is not None
        ok = await asyncio.to_thread(_wait_ready, conn, proc, START_TIMEOUT)
        conn.close()
        self.live[index] = ok and self.procs[index] is proc
        if not ok:
            raise Failure("worker_failed", 500, f"worker {index} did not start (exit code "
                          f"{proc.exitcode}); see its log above")

    async def supervise(self) -> None:
        """Start again each worker that exits, until `stop`."""
        loop = asyncio.get_running_loop()
        while not self.stopping:
            exited = asyncio.Event()
            for proc in self.procs:
                if proc is not None:
                    loop.add_reader(proc.sentinel, exited.set)
            try:
                await exited.wait()
            finally:
                for proc in self.procs:
                    if proc is not None:
                        loop.remove_reader(proc.sentinel)
            await self._restart_exited()

    async def watch(self, role: Role) -> None:
        """Every `LIVENESS_EVERY` seconds, ask each live worker for a "ping" over its
        control socket; kill one that does not answer within twice
        `worker_ack_timeout` (`supervise` starts it again)."""
        while not self.stopping:
            await asyncio.sleep(LIVENESS_EVERY)
            await asyncio.gather(*(self._ping(role, i) for i in range(self.count)
                                   if self.live[i]))

    async def _ping(self, role: Role, index: int) -> None:
        proc = self.procs[index]
        if proc is None or not proc.is_alive():
            return
        wait = 2 * self.config.worker_ack_timeout
        try:
            async with asyncio.timeout(wait):
                await exchange(role.address(index), {"op": "ping"})
            return
        except TimeoutError:
            why = f"no answer in {wait:g}s"
        except (OSError, ValueError) as e:
            why = repr(e)
        if self.stopping or self.procs[index] is not proc or not self.live[index]:
            return
        log.error("worker %d (pid %s) did not answer a liveness ping: %s; killing it (it "
                  "starts again)", index, proc.pid, why)
        self.live[index] = False
        proc.kill()

    async def _restart_exited(self) -> None:
        for index, proc in enumerate(self.procs):
            if self.stopping or proc is None or proc.is_alive():
                continue
            proc.join()
            young = time.monotonic() - self.started[index] < 10.0
            self.delay[index] = min(self.delay[index] * 2, BACKOFF[1]) if young else BACKOFF[0]
            log.error("worker %d (pid %s) exited with %s; starting it again in %.1fs",
                      index, proc.pid, proc.exitcode, self.delay[index])
            self.procs[index], self.live[index] = None, False
            await asyncio.sleep(self.delay[index])
            if not self.stopping:
                self.restarts += 1
                conn = self.start(index)
                asyncio.get_running_loop().create_task(self._ready_logged(index, conn))

    async def _ready_logged(self, index: int, conn: Connection) -> None:
        try:
            await self.ready(index, conn)
        except Failure as e:
            log.error("%s", e)

    async def stop(self) -> None:
        """SIGTERM every worker, wait for them to drain (`grace_seconds` and
        `STOP_MARGIN`, all together), SIGKILL any still running."""
        self.stopping = True
        live = [p for p in self.procs if p is not None and p.is_alive()]
        for proc in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid or 0, signal.SIGTERM)
        wait = self.config.grace_seconds + STOP_MARGIN
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait  # one for all (each its own: N stuck workers took N x)
        for proc in live:
            await asyncio.to_thread(proc.join, max(0.0, deadline - loop.time()))
            if proc.is_alive():
                log.error("worker pid %s still runs after %.0fs: killing it", proc.pid, wait)
                proc.kill()
                await asyncio.to_thread(proc.join)


def for_worker(config: PopConfig, index: int) -> PopConfig:
    """Worker `index`'s config: its own events file (``events.w2.jsonl`` beside the
    admin worker's ``events.jsonl``: each file rotates by its own writer's count)."""
    file = config.events.file
    if index == 0 or not file:
        return config
    path = Path(file)
    mine = str(path.with_name(f"{path.stem}.w{index}{path.suffix}"))
    return msgspec.structs.replace(config, events=msgspec.structs.replace(config.events,
                                                                          file=mine))


def _wait_ready(conn: Connection, proc: BaseProcess, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if conn.poll(0.1):
            try:
                return bool(conn.recv() == "ready")
            except EOFError:
                return False
        if not proc.is_alive():
            return False
    return False


def worker_main(config: PopConfig, role: Role, ready: Connection, verbosity: int) -> None:
    """A worker process: run its PoP until SIGTERM (then drain)."""
    import ctypes

    import uvloop

    from runtime.cli.logs import configure

    # SIGTERM (drain) if the parent dies without stopping us: no orphaned workers
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # it died before the line above
        return
    configure(verbosity)
    inherit_table(role.table, role.index, role.count)
    with contextlib.suppress(Interrupted):  # stopped while it started: what started unwound
        uvloop.run(_worker(config, role, ready))


async def _worker(config: PopConfig, role: Role, ready: Connection) -> None:
    from runtime.app import running_worker

    async with StopSignals() as stop, running_worker(config, role, freeze_heap=True):
        ready.send("ready")
        ready.close()
        await stop.wait()


MIGRATE_REQ = Path("/proc/sys/net/ipv4/tcp_migrate_req")


def migrate_requests(path: Path = MIGRATE_REQ) -> bool:
    """Turn on Linux's ``net.ipv4.tcp_migrate_req`` (5.14+) where it is off: the
    connections a dying worker's listener had queued (not yet accepted) then move
    to another worker's listener on the port instead of being reset. Without it,
    a few connections opened just after a worker was killed were reset (seen in
    tests/test_workers.py about one run in two). A sysctl of the network
    namespace: needs root; otherwise logged. Returns whether it is on."""
    try:
        if path.read_text().strip() != "1":
            path.write_text("1\n")
        return True
    except OSError as e:
        log.warning("cannot turn on %s (%s): connections queued at a worker that dies "
                    "are reset instead of moved to another worker", path, e)
        return False


@contextlib.asynccontextmanager
async def running_workers(config: PopConfig, verbosity: int = 0
                          ) -> AsyncIterator[tuple[Primary, PopInfo]]:
    """``workers = N``: the lock, the ports, the model worker and N workers,
    started; stopped (drained) on exit. Raises `DataDirBusy`, OSError for a taken
    port, `Failure` if a worker does not start."""
    data = config.data_dir
    lock = _lock(data)
    held: list[socket.socket] = []
    ai: AIService | None = None
    primary: Primary | None = None
    table: SharedTable | None = None  # what the workers count rate limits in
    try:
        migrate_requests()
        held = [reserve(config.public.host, config.public.port),
                reserve(config.admin.host, config.admin.port)]
        ai, shared = await _shared_ai(config)
        admin_token(data)  # made once here, not raced by the workers
        starting.clear(data)  # a dev session's, left by a PoP killed while it deployed
        challenge_secret(data)
        if wants_shared_table(config):  # fresh: rate limits start over with the PoP
            table = SharedTable.create(config.ratelimit.shared_keys // 8)
        (_, pport), (_, aport) = (s.getsockname()[:2] for s in held)
        fixed = msgspec.structs.replace(
            config, public=Listener(config.public.host, pport),
            admin=AdminListener(config.admin.host, aport), ai=shared)
        primary = Primary(fixed, verbosity, table.path if table is not None else None)
        conns = [primary.start(i) for i in range(primary.count)]
        await asyncio.gather(*(primary.ready(i, c) for i, c in enumerate(conns)))
        info = PopInfo(os.getpid(), f"http://{config.public.host}:{pport}",
                       f"{config.admin.host}:{aport}")
        (data / "pop.json").write_bytes(msgspec.json.encode(info))
        supervisor = asyncio.get_running_loop().create_task(primary.supervise())
        watcher = asyncio.get_running_loop().create_task(primary.watch(
            Role(0, primary.count, fixed.data_dir)))
        try:
            yield primary, info
        finally:
            supervisor.cancel()
            watcher.cancel()
            (data / "pop.json").unlink(missing_ok=True)
    finally:
        if primary is not None:
            await primary.stop()
        if ai is not None:
            await ai.close()
        for sock in held:
            sock.close()
        if table is not None:
            table.close()
        lock.close()


async def _shared_ai(config: PopConfig) -> tuple[AIService | None, Any]:
    """The model worker the workers share: started here unless [ai] is off or
    names a socket already; returns it and the [ai] settings the workers get."""
    if not config.ai.enabled or config.ai.socket is not None:
        return None, config.ai
    ai = AIService(config.data_dir, config.ai.worker_config, None)
    await _start_ai(ai)
    socket_path = str(config.data_dir / "ai" / "worker.sock")
    return ai, msgspec.structs.replace(config.ai, socket=socket_path)


async def serve(config: PopConfig, verbosity: int = 0) -> None:
    """`edgefn serve` with ``workers = N``: run until SIGTERM/SIGINT, then drain.
    Raises `Interrupted` for a signal before it serves."""
    async with StopSignals() as stop, running_workers(config, verbosity) as (primary, info):
        print(f"edgefn PoP listening on {info.public} ({primary.count} workers, "
              f"SO_REUSEPORT)", flush=True)
        print(f"  admin API on {info.admin} (token in {config.data_dir / 'admin.token'})",
              flush=True)
        from runtime.functions.deploys import DeployStore

        records = DeployStore(config.data_dir).records()
        print(f"serving {len(records)} function(s):", flush=True)
        for r in records:
            print(f"  {r.name:<16} {r.current}", flush=True)
        await stop.wait()
