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

from gpu_worker.client import WorkerError

from .ai import AIService
from .errors import EdgefnError
from .http import Server, ServerConfig
from .openai_api import OpenAIApi
from .pop import PoP

log = logging.getLogger("edgefn")
GRACE_SECONDS = 10.0


class PopInfo(msgspec.Struct):
    pid: int
    public: str
    admin: str


class DataDirBusy(EdgefnError):
    pass


def admin_token(data_dir: Path) -> str:
    """The admin token, created (mode 0600) on first use."""
    path = data_dir / "admin.token"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


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
async def running_pop(
    data_dir: str | Path, host: str = "127.0.0.1", port: int = 8080, admin_port: int = 0,
    config: ServerConfig | None = None, ai: bool = False, ai_config: str | None = None,
    ai_socket: str | None = None,
) -> AsyncIterator[tuple[PoP, Server, Server]]:
    """A started PoP (public and admin listeners); shut down gracefully on exit.

    With `ai`, the PoP also runs the model worker (or, with `ai_socket`, connects
    to one already running there) and serves the OpenAI-compatible API.

    Raises `DataDirBusy` if another PoP holds the data dir, OSError if a port is taken.
    """
    data = Path(data_dir)
    lock = _lock(data)
    pop = PoP(data)
    service: AIService | None = None
    try:
        if ai:
            service = await _start_ai(pop, data, ai_config, ai_socket)
        for err in pop.restore():
            log.error("%s", err)
        from .admin import AdminApp

        public = Server(pop, config)
        admin = Server(AdminApp(pop, admin_token(data)))
        await public.start(host, port)
        await admin.start("127.0.0.1", admin_port)
        (phost, pport), (ahost, aport) = public.address, admin.address
        info = PopInfo(os.getpid(), f"http://{phost}:{pport}", f"{ahost}:{aport}")
        (data / "pop.json").write_bytes(msgspec.json.encode(info))
        purger = asyncio.get_running_loop().create_task(_purge_expired(pop))
        try:
            yield pop, public, admin
        finally:
            purger.cancel()
            (data / "pop.json").unlink(missing_ok=True)
            await admin.shutdown(1.0)
            await public.shutdown(GRACE_SECONDS)
    finally:
        if service is not None:
            await service.close()
        pop.close()
        lock.close()


async def _start_ai(pop: PoP, data: Path, config: str | None, socket: str | None) -> AIService:
    """Start (or reach) the model worker. A worker that does not come up is
    logged, not fatal: functions still serve, AI requests get 503 until it does."""
    service = AIService(data, config, socket)
    pop.stores.ai, pop.stores.loop = service, asyncio.get_running_loop()
    pop.api = OpenAIApi(service)
    try:
        await service.start()
    except WorkerError as e:
        log.error("model worker: %s", e)
    return service


async def _purge_expired(pop: PoP, every: float = 60.0) -> None:
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
    log.info("shutting down: finishing in-flight requests (grace %.0fs)", GRACE_SECONDS)
