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
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO

import msgspec

from edgefn_core.errors import DataDirBusy, WorkerError
from edgefn_core.secret_file import secret_file
from runtime.admin.client import PopInfo
from runtime.admin.thread import AdminThread
from runtime.config import PopConfig
from runtime.net import Server
from runtime.pop import PoP

log = logging.getLogger("edgefn")


def admin_token(data_dir: Path) -> str:
    """The admin token, created (mode 0600) on first use."""
    return secret_file(data_dir / "admin.token", lambda: secrets.token_urlsafe(32))


def _lock(data_dir: Path) -> IO[str]:
    """Hold DATA/pop.lock for the PoP's life. Raises `DataDirBusy`."""
    data_dir.mkdir(parents=True, exist_ok=True)
    f = open(data_dir / "pop.lock", "a+")  # noqa: SIM115 - held until the PoP exits
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise DataDirBusy(f"data dir {data_dir} is in use by another PoP") from None
    return f


@contextlib.asynccontextmanager
async def running_pop(config: PopConfig) -> AsyncIterator[tuple[PoP, Server, AdminThread]]:
    """A PoP built from `config`, started (public and admin listeners, the model
    worker when [ai] is enabled), and shut down gracefully on exit.

    Raises `DataDirBusy` if another PoP holds the data dir, OSError if a port is taken.
    """
    data = config.data_dir
    lock = _lock(data)
    try:
        pop = PoP(config)
    except BaseException:
        lock.close()
        raise
    try:
        from runtime.executors.python import policy

        await asyncio.to_thread(policy.report, config.insecure_python)
        await _start_ai(pop)
        for err in pop.registry.restore():
            log.error("%s", err)
        from runtime.functions import warmup

        await warmup.warm_all([*pop.registry.functions.values(),
                               *(s.fn for s in pop.registry.canaries.values())])
        pop.restored = True
        from runtime.admin.api import AdminApp

        public = Server(pop.pipeline, config.http)
        # the admin API on its own thread and loop: a busy public loop cannot delay it
        admin = AdminThread(AdminApp(pop, admin_token(data), asyncio.get_running_loop()),
                            config.http)
        await public.start(config.public.host, config.public.port)
        await admin.start(config.admin.host, config.admin.port)
        scrapes = await _metrics_listener(pop, config)
        (phost, pport), (ahost, aport) = public.address, admin.address
        info = PopInfo(os.getpid(), f"http://{phost}:{pport}", f"{ahost}:{aport}")
        (data / "pop.json").write_bytes(msgspec.json.encode(info))
        purger = asyncio.get_running_loop().create_task(
            _purge_expired(pop, config.stores.purge_interval))
        shipper = _ship_samples(pop)
        try:
            yield pop, public, admin
        finally:
            purger.cancel()
            if shipper is not None:
                shipper.cancel()
            (data / "pop.json").unlink(missing_ok=True)
            await admin.shutdown(1.0)
            if scrapes is not None:
                await scrapes.shutdown(1.0)
            await public.shutdown(config.grace_seconds)
            await pop.pipeline.aclose()
            if pop.stores.budgets is not None:  # shared by the OpenAI API and ai bindings
                await pop.stores.budgets.store.close()
    finally:
        if pop.ai is not None:
            await pop.ai.close()
        pop.close()
        lock.close()


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


async def _start_ai(pop: PoP) -> None:
    """Start (or reach) the model worker. A worker that does not come up is
    logged, not fatal: functions still serve, AI requests get 503 until it does."""
    if pop.ai is None:
        return
    try:
        await pop.ai.start()
    except WorkerError as e:
        log.error("model worker: %s", e)


async def _purge_expired(pop: PoP, every: float) -> None:
    """Reclaim the space of expired KV keys (reads never see them anyway)."""
    while True:
        await asyncio.sleep(every)
        try:
            removed = pop.stores.purge_expired()
        except Exception:
            log.exception("purging expired KV keys failed")
            continue
        if removed:
            log.info("purged %d expired KV keys", removed)


async def wait_for_signal() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: finishing in-flight requests")
