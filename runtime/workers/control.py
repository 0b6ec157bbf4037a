"""The control channel from the admin worker to the others (``workers = N``).

After a change is saved (a deploy's record, DATA/keys.json) the admin worker
tells every other worker over its control socket, one JSON line, and waits for
each to answer that it switched. A worker that does not answer within
`Role.ack_timeout`, or answers that it could not switch, is killed (SIGKILL)
before the admin call returns; its parent starts it again and it restores the
saved records, so after the call no worker serves what the change replaced. A
worker that is not running (it died, or is starting) is not waited for: it
binds its control socket before it restores, so it either gets the message or
reads the record already saved.

    {"op": "sync"}                       follow the deploy store's records
    {"op": "keys"}                       re-read DATA/keys.json
    {"op": "starting", "why": W | null}  answer 503 `starting` (W) for paths no function serves
    {"op": "purge", "args": {...}, "only": [names] | null}   purge the HTTP cache
                                         ("result": how many entries went)
    {"op": "ai_purge", "model": M | null, "tenant": T | null}  purge the AI cache
                                         ("result": how many entries went)

The primary asks every worker, the admin worker too, whether its loop still runs
(`runtime.workers.primary.Primary.watch`; no answer within twice the ack timeout:
killed and started again):

    {"op": "ping"}

The admin worker also asks, without killing a worker that is slow to answer
(`Fanout.ask`: a scrape is not a change, and a missing answer loses nothing):

    {"op": "metrics"}                    [its pid, its metric families], in "result"
    {"op": "cache_stats"}                this worker's `CacheStats.snapshot()` rows
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.observe.metrics_merge import Wire, to_wire
from runtime.workers.role import Role

if TYPE_CHECKING:
    from runtime.pop import PoP

log = logging.getLogger("edgefn.workers")
MAX_LINE = 1 << 20
MAX_ANSWER = 64 << 20  # a worker's metrics: up to max_series label sets per metric


async def control_server(pop: PoP, role: Role) -> asyncio.AbstractServer:
    """Listen on this worker's control socket. Raises OSError if it is taken."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:  # bound here: uvloop takes no abstract address (leading NUL) by name
        sock.bind(role.address(role.index))
    except OSError:
        sock.close()
        raise
    return await asyncio.start_unix_server(lambda r, w: _serve(pop, r, w), sock=sock,
                                           limit=MAX_LINE)


async def _serve(pop: PoP, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                 ) -> None:
    try:
        msg = json.loads(await reader.readline())
        if msg.get("op") == "metrics":
            reply = {"ok": True, "pid": os.getpid(), "result": metrics(pop)}
        elif msg.get("op") == "ai_purge":
            reply = {"ok": True, "pid": os.getpid(), "result": ai_purge(pop, msg)}
        elif msg.get("op") == "purge":
            reply = {"ok": True, "pid": os.getpid(), "result": purge(pop, msg)}
        elif msg.get("op") == "cache_stats":
            pop.observers.flush()  # every response already sent counted (the lane's too)
            reply = {"ok": True, "pid": os.getpid(),
                     "result": pop.stores.cache_stats.snapshot()}
        else:
            errors = await apply(pop, msg)
            reply = {"ok": not errors, "pid": os.getpid(), "errors": errors}
    except Exception as e:  # a bad message or a failed change: the admin worker decides
        log.exception("worker control message failed")
        reply = {"ok": False, "pid": os.getpid(), "errors": [repr(e)]}
    writer.write(json.dumps(reply).encode() + b"\n")
    try:
        await writer.drain()
    finally:
        writer.close()


async def apply(pop: PoP, msg: dict[str, Any]) -> list[str]:
    """Carry out one control message; what could not be done (empty: all).
    Raises ValueError for an unknown op."""
    match msg.get("op"):
        case "sync":
            return await pop.registry.follow()
        case "keys":
            pop.keys.reload()
        case "starting":  # (`edgefn dev` deploying its folders: `Registry.starting`)
            why = msg.get("why")
            pop.registry.starting = why if isinstance(why, str) else None
        case "purge":
            purge(pop, msg)
        case "ping":
            pass
        case op:
            raise ValueError(f"unknown worker control op {op!r}")
    return []


def purge(pop: PoP, msg: dict[str, Any]) -> int:
    """Purge this worker's HTTP cache as `msg` says; how many entries went."""
    only = msg.get("only")
    if pop.http_cache is None:
        return 0
    return pop.http_cache.purge(**msg["args"], only=frozenset(only) if only is not None
                                else None)


def ai_purge(pop: PoP, msg: dict[str, Any]) -> int:
    """Purge this worker's AI cache as `msg` says; how many entries went. A model
    named is listed again (the admin worker purges an adapter added or removed
    under that name on every worker: its fingerprint changed)."""
    if msg.get("model") is not None and pop.ai is not None:
        pop.ai.models_changed()
    cache = pop.stores.ai_cache
    return 0 if cache is None else cache.purge(model=msg.get("model"), tenant=msg.get("tenant"))


def metrics(pop: PoP) -> tuple[int, Wire]:
    """This worker's pid and metric families (empty without [metrics]), with every
    response already sent counted (the events are delivered in batches)."""
    pop.observers.flush()
    if pop.metrics is None:
        return os.getpid(), []
    return os.getpid(), to_wire(pop.metrics.registry.collect())


class Fanout:
    """The admin worker's side: `tell` every other worker and wait for them."""

    def __init__(self, role: Role) -> None:
        self.role = role

    async def tell(self, msg: dict[str, Any]) -> list[Any]:
        """Send `msg` to every other worker and wait until each switched or was
        killed (a message is never lost: see the module's docstring); the
        "result" each that switched answered (None: it has none, or was killed
        or not running)."""
        return await asyncio.gather(*(self._tell(i, msg) for i in range(1, self.role.count)))

    async def ask(self, msg: dict[str, Any], timeout: float) -> tuple[list[Any], int]:
        """Send `msg` to every other worker; the "result" of each that answered
        within `timeout` seconds, and how many did not (not running, slow, or a
        bad answer). Nobody is killed: an answer is asked for, nothing changed."""
        answers = await self.ask_each(msg, timeout)
        got = [a for a in answers if a is not None]
        return [a[0] for a in got], len(answers) - len(got)

    async def ask_each(self, msg: dict[str, Any], timeout: float) -> list[tuple[Any] | None]:
        """`ask`, answer by answer: for workers 1, 2, ... the 1-tuple of its
        "result", or None where it did not answer."""
        return list(await asyncio.gather(*(self._ask(i, msg, timeout)
                                           for i in range(1, self.role.count))))

    async def _ask(self, index: int, msg: dict[str, Any], timeout: float
                   ) -> tuple[Any] | None:
        try:
            async with asyncio.timeout(timeout):
                reply = await exchange(self.role.address(index), msg, MAX_ANSWER)
            return (reply["result"],)
        except (OSError, ValueError, KeyError, TypeError, TimeoutError) as e:
            log.warning("worker %d did not answer %s: %r", index, msg.get("op"), e)
            return None

    async def _connect(self, index: int, limit: int
                       ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await connect(self.role.address(index), limit)

    async def _tell(self, index: int, msg: dict[str, Any]) -> Any:
        try:
            reader, writer = await self._connect(index, MAX_LINE)
        except (ConnectionRefusedError, FileNotFoundError):
            return None  # not running: when it starts it restores what was saved
        pid = peer_pid(writer.get_extra_info("socket"))
        try:
            writer.write(json.dumps(msg).encode() + b"\n")
            line = await asyncio.wait_for(reader.readline(), self.role.ack_timeout)
            reply = json.loads(line) if line else {"errors": ["closed without an answer"]}
            if reply.get("ok"):
                return reply.get("result")
            why = "; ".join(reply.get("errors") or ["no answer"])
        except TimeoutError:
            why = f"no answer in {self.role.ack_timeout:g}s"
        except (OSError, ValueError) as e:
            why = repr(e)
        finally:
            writer.close()
        log.error("worker %d (pid %d) did not follow %s: %s; killing it (it restarts from "
                  "the saved records)", index, pid, msg.get("op"), why)
        await asyncio.to_thread(kill_and_wait, pid)
        return None


async def connect(address: str, limit: int
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to a worker's control socket (`Role.address`). Raises OSError
    (ConnectionRefusedError: it is not running)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:  # connected here: uvloop takes no abstract address by name
        await asyncio.get_running_loop().sock_connect(sock, address)
    except BaseException:
        sock.close()
        raise
    return await asyncio.open_unix_connection(sock=sock, limit=limit)


async def exchange(address: str, msg: dict[str, Any], limit: int = MAX_LINE) -> Any:
    """Send `msg` to the control socket at `address` and read its one-line answer.
    Raises OSError, ValueError (no answer, or not JSON)."""
    reader, writer = await connect(address, limit)
    try:
        writer.write(json.dumps(msg).encode() + b"\n")
        return json.loads(await reader.readline())
    finally:
        writer.close()


def peer_pid(sock: socket.socket) -> int:
    """The pid of the process at the other end of a unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[0])


def kill_and_wait(pid: int, timeout: float = 10.0) -> None:
    """SIGKILL `pid` and wait until it is gone or a zombie (its sockets are closed
    then: it serves nothing). Blocking."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)
    log.error("pid %d still runs %.0fs after SIGKILL", pid, timeout)
