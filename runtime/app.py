"""Run a PoP: restore deployed functions, listen, write DATA/pop.json, shut down
gracefully on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
import signal
import threading
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import IO, Any

import msgspec

from edgefn_core.errors import DataDirBusy, Interrupted, InvalidConfig, WorkerError
from edgefn_core.secret_file import secret_file
from runtime import boot_heap
from runtime.admin.client import PopInfo
from runtime.admin.thread import AdminThread
from runtime.ai.service import AIService
from runtime.config import PopConfig
from runtime.net import Server
from runtime.observe.metrics_continuity import Continuity
from runtime.observe.metrics_merge import Wire
from runtime.observe.metrics_pop import PeersCall
from runtime.pop import PoP
from runtime.workers import starting
from runtime.workers.control import Fanout, control_server
from runtime.workers.events import Forwarder, peer_observers, peer_raw, receive, watched
from runtime.workers.role import Role

log = logging.getLogger("edgefn")
# at least: a deploy package (64 MiB unpacked: incompressible files gzip to a little
# more; at 32 MiB such a package got a reset the CLI read as "cannot reach the PoP"),
# and a 16 MiB KV value, base64 in JSON (~21.4 MiB)
ADMIN_MAX_BODY = 72 << 20


def admin_token(data_dir: Path) -> str:
    """The admin token, created (mode 0600) on first use."""
    return secret_file(data_dir / "admin.token", lambda: secrets.token_urlsafe(32))


def _lock(data_dir: Path) -> IO[str]:
    """Hold DATA/pop.lock for the PoP's life. Raises `DataDirBusy`, `InvalidConfig`
    (``data``) for a folder that cannot be written."""
    if data_dir.exists() and not data_dir.is_dir():
        raise InvalidConfig("pop.toml", f"{data_dir} is not a directory", "data")
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        f = open(data_dir / "pop.lock", "a+")  # noqa: SIM115 - held until the PoP exits
    except OSError as e:  # read-only, not ours: one line, not a traceback
        raise InvalidConfig("pop.toml", f"data dir {data_dir} cannot be used: "
                            f"{e.strerror or e}", "data") from None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise DataDirBusy(f"data dir {data_dir} is in use by another PoP") from None
    return f


@contextlib.asynccontextmanager
async def running_pop(config: PopConfig, freeze_heap: bool = False
                      ) -> AsyncIterator[tuple[PoP, Server, AdminThread]]:
    """A PoP built from `config`, started (public and admin listeners, the model
    worker when [ai] is enabled), and shut down gracefully on exit. `freeze_heap`:
    once booted, its heap is kept out of the cyclic GC's walks (`boot_heap`), for
    a process that runs this one PoP for its life.

    Raises `DataDirBusy` if another PoP holds the data dir, OSError if a port is taken.
    """
    lock = _lock(config.data_dir)
    try:
        async with running_worker(config, None, freeze_heap) as (pop, public, admin):
            assert admin is not None  # a lone PoP has its admin API
            yield pop, public, admin
    finally:
        lock.close()


@contextlib.asynccontextmanager
async def running_worker(config: PopConfig, role: Role | None, freeze_heap: bool = False
                         ) -> AsyncIterator[tuple[PoP, Server, AdminThread | None]]:
    """A PoP started as `running_pop` does, without taking the data dir's lock; as
    one of ``workers = N`` (`role`), it listens beside the others (SO_REUSEPORT),
    follows the admin worker's changes, and only the admin worker has the admin
    API and the metrics listener (its scrapes sum every worker's series), takes
    every worker's events into its ring, purges expired keys and ships samples.

    Raises OSError if a port is taken.
    """
    data = config.data_dir
    pop = PoP(config)
    try:
        from runtime.executors.python import policy

        await asyncio.to_thread(policy.report, config.insecure_python)
        await _start_ai(pop.ai)
        # bound before the restore: a change told meanwhile waits, then is followed; the
        # admin worker's answers the primary's liveness pings only
        control = await control_server(pop, role) if role is not None else None
        if role is not None:  # started again while `edgefn dev` deploys: 503, not 404
            pop.registry.starting = starting.load(data)
        peers = await _peer_events(pop, role)
        if role is None or role.leader:  # the one that deploys: nothing of its is in flight
            for path in await asyncio.to_thread(pop.registry.store.sweep):
                log.warning("removed %s, left by a deploy that did not finish", path)
        for err in pop.registry.restore():
            log.error("%s", err)
        from runtime.functions import warmup

        restored = [*pop.registry.functions.values(),
                    *(s.fn for s in pop.registry.canaries.values())]
        await warmup.warm_all(restored)
        await pop.warm(*restored)  # the pipeline's first run, before the first client
        pop.restored = True
        public = Server(pop.pipeline, config.http, pop.lane)
        await public.start(config.public.host, config.public.port, role is not None,
                           b"x-edgefn-worker: %d\r\n" % os.getpid() if config.worker_header
                           else b"")
        if pop.metrics is not None:  # what the front refuses never reaches the pipeline
            pop.metrics.listener = lambda: public.state
        if role is not None and role.leader and pop.metrics is not None:
            pop.metrics.peers = _peer_metrics(Fanout(role))  # one scrape: every worker
            pop.metrics.continuity = Continuity(data / "metrics-continuity.json")
            _table_metrics(pop, config)
        admin = await _admin(pop, config, role)
        scrapes = await _metrics_listener(pop, config) if admin is not None else None
        if role is None and admin is not None:
            (phost, pport), (ahost, aport) = public.address, admin.address
            info = PopInfo(os.getpid(), f"http://{phost}:{pport}", f"{ahost}:{aport}")
            (data / "pop.json").write_bytes(msgspec.json.encode(info))
        purger = asyncio.get_running_loop().create_task(
            _purge_expired(pop, config.stores.purge_interval)) if admin is not None else None
        shipper = _ship_samples(pop) if admin is not None else None
        try:
            with boot_heap.frozen() if freeze_heap else contextlib.nullcontext():
                yield pop, public, admin
        finally:
            for task in (purger, shipper):
                if task is not None:
                    task.cancel()
            if purger is not None:  # a batch in flight ends before the store closes
                await asyncio.wait([purger])
            if role is None:
                (data / "pop.json").unlink(missing_ok=True)
            if control is not None:
                control.close()
            if peers is not None:
                peers.close()
            if admin is not None:
                await admin.shutdown(1.0)
            if scrapes is not None:
                await scrapes.shutdown(1.0)
            await public.shutdown(config.grace_seconds)
            await pop.registry.abort_changes()  # undone while the stores are open
            await pop.pipeline.aclose()
            if pop.stores.budgets is not None:  # shared by the OpenAI API and ai bindings
                await pop.stores.budgets.store.close()
    finally:
        if pop.ai is not None:
            await pop.ai.close()
        pop.close()


def _table_metrics(pop: PoP, config: PopConfig) -> None:
    """The workers' shared rate-limit table in the admin worker's metrics (only there:
    the others' would be summed in N times), where there is one."""
    from runtime.observe.metrics_table import TableMetrics
    from runtime.pipeline.build import shared_table
    from runtime.security.ratelimit.native import counters

    path = shared_table(config)
    if path is None or pop.metrics is None:
        return
    mapped = counters(table=path)
    if mapped.table is None:  # no native counters: the workers count alone (logged)
        return
    pop.metrics.registry.register(TableMetrics(pop.metrics.requests.base,
                                               lambda: mapped.table_stats))


async def _admin(pop: PoP, config: PopConfig, role: Role | None) -> AdminThread | None:
    """The admin API on its own thread and loop (a busy public loop cannot delay
    it), telling the other workers each change; None on a worker that is not the
    admin worker. Raises OSError if the address is unavailable."""
    if role is not None and not role.leader:
        return None
    from runtime.admin.api import AdminApp

    app = AdminApp(pop, admin_token(config.data_dir), asyncio.get_running_loop())
    if role is not None:
        app.workers = Fanout(role)
        if role.count > 1:  # restarted between saving a change and telling the others?
            # they follow the saved records now (a no-op when nothing changed)
            _background(app.workers.tell({"op": "sync"}))
    # a KV value at its 16 MiB limit arrives base64 in JSON (~21.4 MiB): the admin
    # listener takes that much even where the public one takes less
    limits = msgspec.structs.replace(
        config.http, max_body_bytes=max(config.http.max_body_bytes, ADMIN_MAX_BODY))
    admin = AdminThread(app, limits)
    await admin.start(config.admin.host, config.admin.port, role is not None)
    return admin


_tasks: set[asyncio.Task[Any]] = set()


def _background(coro: Coroutine[Any, Any, Any]) -> None:
    """Run `coro` on the loop without waiting for it (kept until it ends)."""
    task = asyncio.get_running_loop().create_task(coro)
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)


async def _peer_events(pop: PoP, role: Role | None) -> Forwarder | asyncio.AbstractServer | None:
    """``workers = N``: the admin worker takes the others' events into its ring and
    dashboard; each other worker forwards its events there. Raises OSError if the
    admin worker's address is taken."""
    if role is None or role.count == 1:
        return None
    if role.leader:
        return await receive(role, peer_observers(pop), lambda: watched(pop), peer_raw(pop))
    forwarder = Forwarder(role, pop.config.events.ring_size, pop.config.events.max_event_bytes)
    pop.observers.add(forwarder)
    forwarder.start()
    return forwarder


def _peer_metrics(fanout: Fanout) -> PeersCall:
    """The other workers' pids and metric families, asked at each scrape."""
    async def ask(timeout: float) -> list[tuple[int, Wire] | None]:
        return [None if a is None else a[0]
                for a in await fanout.ask_each({"op": "metrics"}, timeout)]

    return ask


def _ship_samples(pop: PoP) -> asyncio.Task[None] | None:
    """``[residency.samples]``: the task sending spooled batches to central."""
    if pop.samples is None:
        return None
    from runtime.observe.samples import Shipper, http_post

    res = pop.config.residency
    shipper = Shipper(pop.samples, http_post(res.samples.to, res.secret))
    return asyncio.get_running_loop().create_task(shipper.forever())


async def _metrics_listener(pop: PoP, config: PopConfig) -> AdminThread | None:
    """``[metrics] listen``: GET /metrics on a listener (and thread) of its own.
    Raises OSError if the address is unavailable."""
    address = config.metrics.address()
    if pop.metrics is None or address is None:
        return None
    endpoint = pop.metrics.endpoint(asyncio.get_running_loop(), settle=pop.observers.flush)
    scrapes = AdminThread(endpoint, config.http)
    await scrapes.start(*address)
    return scrapes


EXTERNAL_WAIT = 2.0  # seconds the start waits for a model worker it does not run ([ai] socket)


async def _start_ai(ai: AIService | None) -> None:
    """Start (or reach) the model worker. A worker that does not come up is
    logged, not fatal: functions still serve, AI requests get 503 until it does.
    A worker the PoP runs is waited for (loading its models); one it only
    reaches (``[ai] socket``) for `EXTERNAL_WAIT` seconds: the PoP listens, and
    keeps connecting, while nothing listens there (``/readyz`` says so)."""
    if ai is None:
        return
    external = ai.client.command is None
    try:
        await ai.start(wait=not external)
        if external:
            await ai.client.ready(EXTERNAL_WAIT)
    except WorkerError as e:
        if external:
            log.warning("model worker: nothing serves at %s yet; AI requests get 503 and "
                        "/readyz waits until it does (connecting in the background)",
                        ai.client.socket_path)
        else:
            log.error("model worker: %s", e)


async def _purge_expired(pop: PoP, every: float) -> None:
    """Reclaim the space of expired KV keys (reads never see them anyway), on a worker
    thread and in batches: on the loop, one tenant's million expired keys held every
    request for seconds. Cancelled, it waits for the batch in flight, so the store is
    never closed under it."""
    stop = threading.Event()
    while True:
        await asyncio.sleep(every)
        sweep = asyncio.ensure_future(asyncio.to_thread(pop.stores.purge_expired, stop.is_set))
        try:
            removed = await asyncio.shield(sweep)
        except asyncio.CancelledError:
            stop.set()
            await asyncio.wait([sweep])
            raise
        except Exception:
            log.exception("purging expired KV keys failed")
            continue
        if removed:
            log.info("purged %d expired KV keys", removed)


class StopSignals:
    """SIGTERM and SIGINT, handled from `async with StopSignals() as stop:`, the
    first thing in the task that runs a PoP, to the process's end.

    While the PoP starts (its model worker, `edgefn dev` deploying the examples),
    the first one cancels that task, as asyncio's runner does for SIGINT: what had
    started unwinds, a deploy in flight is undone, and the block raises
    `Interrupted`. Before, only SIGINT was caught then, and only when the shell had
    not ignored it (Python installs no handler for a background job's SIGINT):
    SIGTERM killed the process outright, a background job's SIGINT was lost. Once
    `wait` waits, one ends the wait: the PoP stops accepting and lets in-flight
    requests finish. `received`: the first signal's number, or None."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.waiting: asyncio.Event | None = None
        self.cancelled = False

    async def __aenter__(self) -> StopSignals:
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._signalled, sig)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None and issubclass(kind, asyncio.CancelledError) and self.cancelled:
            assert self.received is not None
            self.task.uncancel()
            raise Interrupted(self.received) from None

    def _signalled(self, sig: int) -> None:
        if self.received is None:
            self.received = sig
            if self.waiting is None:
                self.cancelled = True
                self.task.cancel()
        if self.waiting is not None:
            self.waiting.set()

    async def wait(self) -> None:
        """Until SIGTERM or SIGINT (at once if one came already)."""
        if self.received is None:
            self.waiting = asyncio.Event()
            await self.waiting.wait()
        log.info("shutting down: finishing in-flight requests")
