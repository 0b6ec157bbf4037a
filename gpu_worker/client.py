"""The client side of the worker IPC: one multiplexed Unix-socket connection,
and (optionally) a supervisor that starts the worker process and restarts it
with backoff when it dies.

Errors say whether the worker is fine (`WorkerError`: a bad request, an
unknown model, a timeout) or gone (`WorkerDead`: requests in flight when it
died, sent while it restarts and not served in time, or sent while it is down).
Nothing waits forever: every wait has a timeout, and a worker that dies fails
everything in flight.

A request waits (READY_WAIT) for a worker that is restarting after it died, but
not for one that is down: once a start has failed (the process exited before it
served), requests fail at once, and those waiting are failed too, until a later
start serves. A worker whose config no longer loads thus costs a request a
503 in about a second, not a 30 s wait per model call.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec

from edgefn_core.errors import ProtocolError, WorkerDead, WorkerError

from . import protocol as p

log = logging.getLogger("edgefn.gpu_worker.client")
# Read when used (never frozen into default arguments), so a process embedding the
# client, or a test, can change them.
START_TIMEOUT = 120.0  # loading models on a cold disk
READY_WAIT = 30.0  # how long a request waits for a restarting worker
RECONNECT_S = 2.0  # a live worker whose connection closed must take another within this
EXIT_GRACE_S = 0.5  # how long a closed connection waits to see whether its worker exits
IDLE_TIMEOUT = 120.0  # longest silence inside a stream
CALL_TIMEOUT = 120.0
BACKOFF_MAX = 30.0
STABLE_AFTER = 60.0  # a worker that ran this long before exiting restarts after the first backoff
HEARTBEAT_S = 5.0  # how often a supervised worker is pinged ...
HUNG_S = 30.0  # ... and how long a ping may go unanswered before it is killed (restarted): a
# worker stopped (SIGSTOP) or wedged left /readyz saying ready and every call waiting 120 s


class Generation:
    """A running generation: iterate for text chunks; `done` holds the usage after,
    `tokens` the tokens read so far."""

    def __init__(self, client: WorkerClient, rid: int, window: int) -> None:
        self.client, self.rid, self.window = client, rid, window
        self.queue: asyncio.Queue[p.Reply | BaseException] = asyncio.Queue()
        self.done: p.Done | None = None
        self.finished = False
        self.unacked = 0
        self.tokens = 0
        self.logprobs: list[p.TokenLogprob] = []  # of the chunks read so far (when asked)

    def __aiter__(self) -> AsyncIterator[str]:
        return self

    async def __anext__(self) -> str:
        """The next chunk. Raises `WorkerError`/`WorkerDead`; StopAsyncIteration at the end."""
        if self.finished:
            raise StopAsyncIteration
        try:
            msg = await asyncio.wait_for(self.queue.get(), IDLE_TIMEOUT)
        except TimeoutError:
            await self.aclose()
            raise WorkerError("timeout", 504,
                              f"no output from the model for {IDLE_TIMEOUT:.0f} s") from None
        match msg:
            case p.Chunk(text=text, tokens=tokens, logprobs=logprobs):
                self.tokens += tokens
                if logprobs:
                    self.logprobs += logprobs
                self.unacked += 1
                if self.unacked >= max(1, self.window // 2):
                    self.client.send(p.Credit(self.rid, self.unacked))
                    self.unacked = 0
                return text
            case p.Done():
                self._end()
                self.done = msg
                self.logprobs += msg.logprobs or []
                raise StopAsyncIteration
            case p.Error(code=code, message=message, status=status):
                self._end()
                raise WorkerError(code, status, message)
            case WorkerDead():
                self._end()
                raise msg
        raise AssertionError(f"unexpected reply {msg!r}")

    async def collect(self) -> tuple[str, p.Done]:
        """The whole output (streamed or not) and its end. Raises `WorkerError`."""
        parts = [chunk async for chunk in self]
        assert self.done is not None
        return "".join(parts) or self.done.text, self.done

    async def aclose(self) -> None:
        """Stop the generation if it is still running (the reader went away)."""
        if not self.finished:
            self._end()
            self.client.send(p.Cancel(self.rid))

    def _end(self) -> None:
        self.finished = True
        self.client.pending.pop(self.rid, None)


class WorkerClient:
    """Reach a worker on `socket_path`; with `command`, also run and supervise it."""

    def __init__(self, socket_path: str, command: list[str] | None = None) -> None:
        self.socket_path = socket_path
        self.command = command
        self.ids = itertools.count(1)
        self.pending: dict[int, Generation | asyncio.Future[Any]] = {}
        self.writer: asyncio.StreamWriter | None = None
        self.connected = asyncio.Event()
        self.lost = asyncio.Event()  # set when a connection drops (`_watch`)
        self.connects = 0  # connections made, the first included
        self.closing = False
        self.process: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.down: str | None = None  # why the last start failed, until one serves
        self.start_failed = asyncio.Event()  # wakes the requests waiting for that start
        self.tasks: list[asyncio.Task[None]] = []
        # called after every (re)connection, e.g. to register run-time state again
        self.on_connect: Callable[[], Awaitable[None]] | None = None

    @classmethod
    def spawning(cls, socket_path: str, config: str | None = None,
                 log_level: str | None = None) -> WorkerClient:
        """A client that starts (and restarts) its own worker. The worker logs at
        `log_level`, by default that of this process's ``edgefn`` logger, so a PoP
        at its default verbosity does not print the worker's INFO lines."""
        level = log_level or logging.getLevelName(logging.getLogger("edgefn")
                                                  .getEffectiveLevel()).lower()
        command = [sys.executable, "-m", "gpu_worker", "--socket", socket_path,
                   "--log-level", level]
        if config:
            command += ["--config", config]
        return cls(socket_path, command)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    async def start(self, wait: bool = True) -> None:
        """Connect (starting the worker first if this client runs it). With `wait`,
        raises `WorkerDead` if it is not serving within START_TIMEOUT."""
        loop = asyncio.get_running_loop()
        if self.command is not None:
            self.tasks.append(loop.create_task(self._supervise()))
        else:
            self.tasks.append(loop.create_task(self._reconnect_forever()))
        if wait:
            await self.ready(START_TIMEOUT)

    async def ready(self, timeout: float | None = None) -> None:
        """Raises `WorkerDead` if the worker is down (its last start failed), or
        does not serve within `timeout` (default READY_WAIT; for a worker this client
        does not run, which no restart of its will bring back, RECONNECT_S: with
        ``--ai-socket`` and nothing serving it, every model call waited 30 s for its
        503) or before a start fails."""
        if self.connected.is_set():
            return
        if self.down is not None:
            raise WorkerDead(self.down)
        if timeout is None:
            timeout = READY_WAIT if self.command is not None else RECONNECT_S
        waits = [asyncio.ensure_future(self.connected.wait()),
                 asyncio.ensure_future(self.start_failed.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if self.connected.is_set():
            return
        raise WorkerDead(self.down or f"the model worker is not running (waited "
                         f"{timeout:.0f} s; {self.restarts} restarts so far)")

    # -- requests -------------------------------------------------------------------------
    async def generate(self, model: str, *, window: int = p.WINDOW, **params: Any) -> Generation:
        """Start a generation (`params`: the `protocol.Generate` fields). Raises
        `WorkerDead`; errors from the worker come out of the iteration."""
        await self.ready()
        rid = next(self.ids)
        gen = Generation(self, rid, window)
        self.pending[rid] = gen
        self.send(p.Generate(rid, model, window=window, **params))
        return gen

    async def call(self, make: Any, timeout: float | None = None, early: bool = False) -> Any:
        """Send `make(id)` and return its Result's data within `timeout` (default
        CALL_TIMEOUT); `early`: from `on_connect`, before other requests may go.
        Raises `WorkerError`, `WorkerDead`."""
        timeout = CALL_TIMEOUT if timeout is None else timeout
        if not early:
            await self.ready()
        elif self.writer is None:
            raise WorkerDead("the model worker connection closed")
        rid = next(self.ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[rid] = fut
        self.send(make(rid))
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            self.send(p.Cancel(rid))  # nobody waits for it: the worker stops working on it
            raise WorkerError("timeout", 504,
                              f"the model worker did not answer in {timeout:.0f} s") from None
        except asyncio.CancelledError:
            self.send(p.Cancel(rid))  # the caller went away (its client did)
            raise
        finally:
            self.pending.pop(rid, None)

    async def embed(self, model: str, inputs: list[str], client: str | None = None,
                    request_id: str | None = None, signed_client: str | None = None
                    ) -> dict[str, Any]:
        """`inputs`' embeddings, computed in `client`'s fair share (see `protocol`;
        `request_id` and `signed_client` go on to an upstream). Raises `WorkerError`,
        `WorkerDead`."""
        return await self.call(lambda i: p.Embed(i, model, inputs, client, request_id,
                                                 signed_client))

    async def count_tokens(self, model: str, *, prompt: str | None = None,
                           messages: list[dict[str, Any]] | None = None,
                           inputs: list[str] | None = None, client: str | None = None,
                           request_id: str | None = None, signed_client: str | None = None
                           ) -> int:
        """The tokens `model` reads for one input (see `protocol.CountTokens`;
        `request_id` and `signed_client` go on to an upstream). Raises `WorkerError`
        (``count_unsupported`` where the engine cannot tell), `WorkerDead`."""
        return int(await self.call(
            lambda i: p.CountTokens(i, model, prompt, messages, inputs, client, request_id,
                                    signed_client)))

    async def rerank(self, model: str, query: str, documents: list[str],
                     top_n: int | None = None, client: str | None = None,
                     request_id: str | None = None, signed_client: str | None = None
                     ) -> dict[str, Any]:
        """`documents` ranked for `query` (see `protocol.Rerank`; `request_id` and
        `signed_client` go on to an upstream). Raises `WorkerError`, `WorkerDead`."""
        return await self.call(
            lambda i: p.Rerank(i, model, query, documents, top_n, client, request_id,
                               signed_client))

    async def models(self) -> list[dict[str, Any]]:
        return await self.call(p.Models)

    async def metrics(self) -> dict[str, Any]:
        return await self.call(p.GetMetrics)

    async def add_lora(self, name: str, path: str, base: str | None = None,
                       scale: float = 1.0, early: bool = False) -> dict[str, Any]:
        return await self.call(
            lambda i: p.AddLora(i, name, path, base, scale), early=early)

    async def remove_lora(self, name: str) -> dict[str, Any]:
        return await self.call(lambda i: p.RemoveLora(i, name))

    async def ping(self, payload: bytes = b"") -> bytes:
        return await self.call(lambda i: p.Ping(i, payload))

    def send(self, msg: msgspec.Struct) -> None:
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(p.frame(msg))

    # -- connection -----------------------------------------------------------------------
    async def _connect(self) -> bool:
        try:
            reader, writer = await asyncio.open_unix_connection(self.socket_path)
        except OSError:
            return False
        self.writer = writer
        loop = asyncio.get_running_loop()
        self.tasks.append(loop.create_task(self._read(reader, writer)))
        if self.on_connect is not None:
            try:
                await self.on_connect()
            except Exception:
                log.exception("re-registering state with the model worker failed")
        self.down = None
        self.start_failed.clear()
        self.lost.clear()
        self.connects += 1
        self.connected.set()
        return True

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                msg = p.reply_decoder.decode(await p.read_frame(reader))
                self._deliver(msg)
        except (asyncio.IncompleteReadError, ConnectionError, ProtocolError, msgspec.DecodeError):
            pass
        finally:
            self.connected.clear()
            self.lost.set()
            self.writer = None
            writer.close()
            self._fail_all("the model worker exited while serving this request; "
                           "it is being restarted")

    def _deliver(self, msg: p.Reply) -> None:
        target = self.pending.get(msg.id)
        if isinstance(target, Generation):
            target.queue.put_nowait(msg)
        elif target is not None and not target.done():
            if isinstance(msg, p.Result):
                target.set_result(msg.data)
            elif isinstance(msg, p.Error):
                target.set_exception(WorkerError(msg.code, msg.status, msg.message))

    def _fail_all(self, message: str) -> None:
        pending, self.pending = self.pending, {}
        for target in pending.values():
            if isinstance(target, Generation):
                target.queue.put_nowait(WorkerDead(message))
            elif not target.done():
                target.set_exception(WorkerDead(message))

    async def _reconnect_forever(self) -> None:
        """Connect to a worker this client does not run, again whenever it goes; says
        once, at the first miss, that it is waiting (a PoP's start waits for it)."""
        said = False
        while not self.closing:
            if not self.connected.is_set() and not await self._connect():
                if not said:
                    log.warning("model worker: nothing serves %s yet; waiting for it",
                                self.socket_path)
                    said = True
                await asyncio.sleep(0.2)
                continue
            said = False
            await asyncio.sleep(0.2)

    # -- supervision ----------------------------------------------------------------------
    async def _supervise(self) -> None:
        assert self.command is not None
        backoff = 0.5
        while not self.closing:
            started = time.monotonic()
            self.process = await asyncio.create_subprocess_exec(
                *self.command, stdin=asyncio.subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, "EDGEFN_PARENT_PID": str(os.getpid())})
            served = await self._wait_serving(self.process)
            rc = await self._watch(self.process) if served else await self.process.wait()
            if self.closing:
                return
            if time.monotonic() - started > STABLE_AFTER:
                backoff = 0.5  # it ran fine for a while: no longer a crash loop
            if not served:
                self._failed_start(rc, backoff)
            self.restarts += 1
            log.warning("model worker exited (status %s); restarting in %.1f s", rc, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    async def _watch(self, proc: asyncio.subprocess.Process) -> int:
        """Wait for `proc` to exit; if its connection drops while it lives (it closed
        it), connect again, or kill it when it takes no connection within
        `RECONNECT_S` (it is then restarted). A worker alive but unreachable left
        every model call waiting for a restart that never came. Returns its status."""
        while True:
            exited = asyncio.ensure_future(proc.wait())
            lost = asyncio.ensure_future(self.lost.wait())
            hung = asyncio.ensure_future(self._heartbeat())
            done, _ = await asyncio.wait({exited, lost, hung},
                                         return_when=asyncio.FIRST_COMPLETED)
            lost.cancel()
            hung.cancel()
            if exited in done:
                return exited.result()
            if hung in done and not hung.cancelled() and hung.result():
                if proc.returncode is None:
                    log.error("model worker did not answer a ping in %.0f s; killing it (it is "
                              "restarted)", HUNG_S)
                    proc.kill()
                return await exited
            self.lost.clear()
            if self.closing:
                return await exited
            # a worker that is dying closes its connections before its listener, and a
            # connect made in between is accepted by the kernel, then reset: give its
            # exit a moment to be seen before taking it for one that closed on purpose
            try:
                return await asyncio.wait_for(asyncio.shield(exited), EXIT_GRACE_S)
            except TimeoutError:
                pass
            exited.cancel()
            deadline = time.monotonic() + RECONNECT_S
            while proc.returncode is None and time.monotonic() < deadline:
                if await self._connect():
                    log.warning("model worker: its connection closed; connected again")
                    break
                await asyncio.sleep(0.05)
            else:
                if proc.returncode is None:
                    log.error("model worker: its connection closed and it takes no other; "
                              "killing it (it is restarted)")
                    proc.kill()

    async def _heartbeat(self) -> bool:
        """Ping the worker every `HEARTBEAT_S`; True once one goes unanswered for
        `HUNG_S` (False when the connection is gone: `_watch` sees that itself)."""
        while not self.closing:
            await asyncio.sleep(HEARTBEAT_S)
            if self.writer is None:
                return False
            try:
                await self.call(lambda i: p.Ping(i, b""), timeout=HUNG_S, early=True)
            except WorkerDead:
                return False
            except WorkerError as e:
                if e.code == "timeout":
                    return True
        return False

    async def _wait_serving(self, proc: asyncio.subprocess.Process) -> bool:
        """Whether `proc` served (the client connected) before it exited or
        START_TIMEOUT passed (then it is killed)."""
        deadline = time.monotonic() + START_TIMEOUT
        while proc.returncode is None and time.monotonic() < deadline:
            if await self._connect():
                return True
            await asyncio.sleep(0.05)
        if proc.returncode is None:
            log.error("model worker did not serve within %.0f s; killing it", START_TIMEOUT)
            proc.kill()
        return False

    def _failed_start(self, rc: int | None, backoff: float) -> None:
        """The worker is down: fail those waiting for it, and the next requests at
        once, until a start serves."""
        self.down = (f"the model worker is down: its last start failed (exit status {rc}); "
                     f"the next try is in {backoff:.1f} s (see the PoP's log)")
        self.start_failed.set()

    async def close(self) -> None:
        """Stop the worker this client runs (SIGTERM, then SIGKILL after 5 s)."""
        self.closing = True
        self._fail_all("the PoP is shutting down")
        proc = self.process
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self.writer is not None:
            self.writer.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
