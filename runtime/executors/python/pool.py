"""The PoP's side of Python isolates: host processes, their isolates' sockets on
the event loop, and a pool that dispatches requests to idle isolates.

Lifetimes: a `Pool` lives as long as its function version (a deploy makes a new
one and retires the old, which drains and stops). A `Host` is one isolate-host
process; the pool keeps an active one and a pre-warmed standby, and promotes the
standby when the active dies. An `Isolate` is one subinterpreter's socket.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from edgefn_core.errors import DeployError, FunctionError, ProtocolError
from runtime.abi import decode_response
from runtime.executors.python import wire
from runtime.net.message import Response

log = logging.getLogger("edgefn.isolates")

READY_TIMEOUT = 30.0
WARM_ROUNDS = 20
KILL_GRACE = 1.0  # after a wall-limit timeout, how long a stuck isolate gets before its host dies
STATUS = {"cpu_limit": 503, "memory_limit": 503, "wall_limit": 504, "exception": 500}


@dataclass(frozen=True)
class HostConfig:
    name: str
    version: str
    function_dir: str
    module: str
    handler: str
    cpu_ms: int
    wall_ms: int
    memory_mb: int
    recycle_after: int
    min_isolates: int
    max_isolates: int


class Job:
    """One request in flight: a future for the response head, then a stream."""

    def __init__(self, loop: asyncio.AbstractEventLoop, payload: bytes) -> None:
        self.payload = payload
        self.future: asyncio.Future[Response] = loop.create_future()
        self.chunks: asyncio.Queue[bytes | BaseException | None] | None = None
        self.isolate: Isolate | None = None
        self.done = False
        self.on_end: Callable[[], None] | None = None

    def end(self) -> None:
        """The job reached its last frame (or failed); runs `on_end` once."""
        if not self.done:
            self.done = True
            if self.on_end is not None:
                self.on_end()

    def fail(self, err: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(err)
        elif self.chunks is not None and not self.done:
            self.chunks.put_nowait(err)
        self.end()

    def respond(self, response: Response) -> None:
        if not self.future.done():
            self.future.set_result(response)
        self.end()

    def start_stream(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.chunks = asyncio.Queue()
        if not self.future.done():
            self.future.set_result(Response(status, headers, self._stream()))

    async def _stream(self) -> AsyncIterator[bytes]:
        assert self.chunks is not None
        try:
            while True:
                item = await self.chunks.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            if not self.done and self.isolate is not None:  # the client went away
                self.isolate.send(wire.frame(wire.CANCEL))


class Isolate:
    def __init__(self, host: Host, sock: socket.socket) -> None:
        self.host = host
        self.sock = sock
        self.reader = wire.Reader()
        self.state = "starting"  # starting | idle | busy | recycling | dead
        self.job: Job | None = None
        self.stuck = False  # its job timed out; frames are dropped until it finishes
        self.recycling = False  # its interpreter is replaced after the job in flight
        self.out = bytearray()
        self.loop: asyncio.AbstractEventLoop | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.sock.setblocking(False)
        loop.add_reader(self.sock.fileno(), self._readable)

    def send(self, data: bytes) -> None:
        if self.state == "dead" or self.loop is None:
            return
        if self.out:
            self.out += data
            return
        try:
            n = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            return self.host.lost(self)
        if n < len(data):
            self.out += data[n:]
            self.loop.add_writer(self.sock.fileno(), self._writable)

    def _writable(self) -> None:
        try:
            n = self.sock.send(self.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self.host.lost(self)
        del self.out[:n]
        if not self.out and self.loop is not None:
            self.loop.remove_writer(self.sock.fileno())

    def _readable(self) -> None:
        try:
            data = self.sock.recv(1 << 18)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            return self.host.lost(self)
        try:
            frames = self.reader.feed(data)
        except ProtocolError as e:
            log.error("%s: isolate sent garbage (%s); killing its host", self.host.cfg.name, e)
            self.host.kill()
            return self.host.lost(self)
        for kind, payload in frames:
            self._frame(kind, payload)

    def _frame(self, kind: bytes, payload: bytes) -> None:
        job = self.job
        if kind == wire.READY:
            info = _json(payload)
            if info.get("ok"):
                if job is not None:  # never sent mid-job; if it is, the job still owns us
                    log.error("%s: isolate restarted during a request", self.host.cfg.name)
                    return
                self.state = "idle"
                self.host.pool.ready(self)
            elif info.get("recycling"):
                self.recycling = True  # takes effect when the job in flight ends
            else:
                log.error("%s: isolate failed to start: %s", self.host.cfg.name, info.get("error"))
                self.close()
        elif kind == wire.CALL:
            self.host.pool.host_call(self, _json(payload))
        elif job is None:
            return  # a late frame of a job that already ended
        elif kind == wire.RESPONSE:
            self._finish(lambda: job.respond(Response(*decode_response(payload))))
        elif kind == wire.HEAD:
            try:
                status, headers, _ = decode_response(payload)
            except FunctionError as e:  # answer now; drop the stream until its last frame
                job.fail(e)
                self.stuck = True
                return
            if not self.stuck:
                job.start_stream(status, headers)
        elif kind == wire.CHUNK:
            if job.chunks is not None and not self.stuck:
                job.chunks.put_nowait(payload)
        elif kind == wire.END:
            self._finish(lambda: job.chunks.put_nowait(None) if job.chunks else None)
        elif kind == wire.ERROR:
            info = _json(payload)
            if info.get("traceback"):
                log.info("%s@%s: %s", self.host.cfg.name, self.host.cfg.version,
                         str(info["traceback"]).rstrip())
            err_kind = info.get("kind", "exception")
            err_kind = err_kind if err_kind in STATUS else "exception"
            self._finish(lambda: job.fail(FunctionError(
                "trap" if err_kind == "exception" else err_kind, STATUS[err_kind],
                str(info.get("message", "failed")))))

    def _finish(self, deliver: Callable[[], object]) -> None:
        job, self.job = self.job, None
        if job is not None:
            if not self.stuck:
                try:
                    deliver()
                except FunctionError as e:  # the response itself was invalid
                    job.fail(e)
            if not job.future.done():  # e.g. END without a HEAD: never leave it hanging
                job.fail(FunctionError("bad_response", 502,
                                       "isolate ended the request without a response"))
            job.end()
        self.stuck = False
        if self.recycling:  # no requests until the new interpreter says READY
            self.recycling = False
            self.state = "recycling"
        elif self.state == "busy":
            self.state = "idle"
            self.host.pool.ready(self)

    def run(self, job: Job) -> None:
        self.state = "busy"
        self.job = job
        job.isolate = self
        self.send(wire.frame(wire.REQUEST, job.payload))

    def close(self) -> None:
        if self.state == "dead":
            return
        self.state = "dead"
        if self.loop is not None:
            self.loop.remove_reader(self.sock.fileno())
            self.loop.remove_writer(self.sock.fileno())
        self.sock.close()


def _json(payload: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(payload)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


class Host:
    """One isolate-host process and its isolates' sockets."""

    def __init__(self, pool: Pool, cfg: HostConfig) -> None:
        """Spawn the process and wait until its first isolates are ready.

        Blocks (call it off the event loop). Raises `DeployError` if the module
        cannot be imported in a subinterpreter or the host does not start.
        """
        self.pool = pool
        self.cfg = cfg
        pairs = [socket.socketpair() for _ in range(cfg.max_isolates)]
        theirs = [b.fileno() for _, b in pairs]
        config = {**cfg.__dict__, "fds": theirs, "initial": cfg.min_isolates}
        env = {**os.environ, "MALLOC_ARENA_MAX": "2", "PYTHONDONTWRITEBYTECODE": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runtime.executors.python.host", json.dumps(config)],
            stdin=subprocess.PIPE, pass_fds=theirs, env=env, cwd=cfg.function_dir)
        for _, b in pairs:
            b.close()
        self.isolates = [Isolate(self, a) for a, _ in pairs]
        self.started = cfg.min_isolates
        self.dead = False
        try:
            for isolate in self.isolates[:cfg.min_isolates]:
                self._wait_ready(isolate)
        except BaseException:
            self.kill()
            self.stop()
            raise

    def _wait_ready(self, isolate: Isolate) -> None:
        isolate.sock.settimeout(READY_TIMEOUT)
        try:
            pending: list[tuple[bytes, bytes]] = []
            f = wire.recv_frame(isolate.sock, isolate.reader, pending)
        except TimeoutError:
            raise DeployError(f"{self.cfg.name}: isolate did not start within "
                              f"{READY_TIMEOUT:.0f}s") from None
        if f is None or f[0] != wire.READY:
            raise DeployError(f"{self.cfg.name}: isolate host exited while starting "
                              f"(status {self.proc.wait(5)})")
        info = _json(f[1])
        if not info.get("ok"):
            raise DeployError(f"{self.cfg.name}: {self.cfg.module}.py "
                              f"{info.get('error', 'failed to start')}")
        for _ in range(WARM_ROUNDS):  # the request path, minus the handler, in both processes
            isolate.sock.sendall(wire.frame(wire.WARM, self.pool.warm_request))
            f = wire.recv_frame(isolate.sock, isolate.reader, pending)
            if f is None or f[0] != wire.RESPONSE:
                raise DeployError(f"{self.cfg.name}: isolate failed while warming up")
            decode_response(f[1])
        isolate.state = "idle"
        assert not pending

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        for isolate in self.isolates:
            isolate.attach(loop)

    def grow(self) -> bool:
        """Start one more isolate if the host has room; False if it is full."""
        if self.started >= len(self.isolates) or self.dead:
            return False
        self.started += 1
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b"grow\n")
            self.proc.stdin.flush()
        except OSError:
            return False
        return True

    def lost(self, isolate: Isolate) -> None:
        """An isolate's socket closed: the host died, or that isolate alone ended."""
        isolate.close()
        if self.dead:
            return
        code = self.proc.poll()
        if code is None:
            time.sleep(0.01)  # EOF can beat the exit status by a hair
            code = self.proc.poll()
        if code is not None:
            self.dead = True
            why = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            self.pool.host_died(self, why)
        elif isolate.job is not None:
            isolate.job.fail(FunctionError("crash", 502, "crashed: its isolate ended unexpectedly"))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def close_isolates(self) -> None:
        """Forget the isolates' sockets (call on the event loop's thread)."""
        self.dead = True
        for isolate in self.isolates:
            isolate.close()

    def stop(self, grace: float = 2.0) -> None:
        """Close stdin (the host exits) and kill it if it is still there after `grace`
        seconds; for a host that already died, release what it left behind. Call
        `close_isolates` first when not on the event loop's thread."""
        self.close_isolates()
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass  # its reader is gone: a broken pipe on flush
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


class Pool:
    def __init__(self, cfg: HostConfig, standby: bool, warm_request: bytes,
                 bindings: Callable[[str, dict[str, Any]], Any] | None = None) -> None:
        """Start the active host (and a warm standby). Blocks; raises `DeployError`.

        `warm_request` is a sample encoded request each isolate runs through its
        request path (not the handler) before it counts as ready.
        """
        self.cfg = cfg
        self.warm_request = warm_request
        self.bindings = bindings
        self.want_standby = standby
        self.loop: asyncio.AbstractEventLoop | None = None
        self.idle: deque[Isolate] = deque()
        self.waiting: deque[Job] = deque()
        self.in_flight = 0
        self.retired = False
        self.active = Host(self, cfg)
        self.standby: Host | None = None
        if standby:
            try:
                self.standby = Host(self, cfg)
            except BaseException:
                self.active.stop()
                raise
        self.replacements = 0
        self.spawning: list[threading.Thread] = []
        self.hosts_stopped = False

    def activate(self) -> None:
        """Attach to the running loop (call on the loop's thread, before routing)."""
        if self.loop is not None:
            return
        self.loop = asyncio.get_running_loop()
        for host in (self.active, self.standby):
            if host is not None:
                host.attach(self.loop)
        self.idle.extend(i for i in self.active.isolates if i.state == "idle")

    # -- requests -----------------------------------------------------------------------------
    async def submit(self, payload: bytes) -> Response:
        """Run a request on an idle isolate (waiting for one if all are busy).

        Raises `FunctionError`: the guest's own errors, `wall_limit` (504) when no
        answer came in time, `crash` (502) when its host died.
        """
        assert self.loop is not None, "pool not activated"
        job = Job(self.loop, payload)
        self.in_flight += 1
        # The wall limit covers waiting for an isolate, the handler and a streamed body.
        timer = self.loop.call_later(self.cfg.wall_ms / 1000 + 0.05, self._timeout, job)
        job.on_end = lambda: self._done(timer)
        self._dispatch(job)
        return await job.future

    def _done(self, timer: asyncio.TimerHandle) -> None:
        timer.cancel()
        self.in_flight -= 1
        if self.retired and self.in_flight == 0:
            self._stop_hosts()

    def _dispatch(self, job: Job) -> None:
        while self.idle:
            isolate = self.idle.pop()  # LIFO: the most recently used isolate is the warmest
            if isolate.state == "idle" and isolate.host is self.active:
                isolate.run(job)
                return
        self.waiting.append(job)
        if self.active is not None:
            self.active.grow()

    def ready(self, isolate: Isolate) -> None:
        """An isolate became idle: give it the oldest waiting job."""
        if isolate.host is not self.active:
            return
        while self.waiting:
            job = self.waiting.popleft()
            if not job.done:
                isolate.run(job)
                return
        self.idle.append(isolate)

    def _timeout(self, job: Job) -> None:
        if job.done:
            return
        msg = f"exceeded its wall-time limit of {self.cfg.wall_ms} ms"
        isolate = job.isolate
        job.fail(FunctionError("wall_limit", 504, msg))
        if isolate is None:
            return
        isolate.stuck = True  # its own watchdog should stop it; if not, the host goes
        if isolate.host is self.active and self.standby is not None and not self.standby.dead:
            self._promote_standby()  # new requests go to a healthy host meanwhile
        assert self.loop is not None
        self.loop.call_later(KILL_GRACE, self._kill_if_stuck, isolate, job)

    def _promote_standby(self) -> None:
        assert self.standby is not None
        self.active, self.standby = self.standby, self.active
        self.idle = deque(i for i in self.active.isolates if i.state == "idle")
        self._drain_waiting()

    def _kill_if_stuck(self, isolate: Isolate, job: Job) -> None:
        if isolate.job is job and isolate.state != "dead":
            log.warning("%s@%s: isolate stuck in native code past its limit; restarting its "
                        "host", self.cfg.name, self.cfg.version)
            isolate.host.kill()

    # -- supervision ----------------------------------------------------------------------------
    def host_died(self, host: Host, why: str) -> None:
        """Fail its jobs, promote the standby, and start a new standby."""
        log.warning("%s@%s: isolate host %d died (%s)", self.cfg.name, self.cfg.version,
                    host.proc.pid, why)
        for isolate in host.isolates:
            if isolate.job is not None:
                isolate.job.fail(FunctionError("crash", 502,
                                               f"crashed: its isolate host died ({why})"))
                isolate.job = None
        host.stop()
        if self.retired:
            return
        if host is self.active:
            self.idle.clear()
            if self.standby is not None and not self.standby.dead:
                self._promote_standby()
                self.standby = None
            else:
                self.active = None  # type: ignore[assignment]
        elif host is self.standby:
            self.standby = None
        self._replace()

    def _drain_waiting(self) -> None:
        while self.waiting and self.idle:
            self.ready(self.idle.popleft())

    def _replace(self) -> None:
        """Start a host in the background: the new active if there is none, else a standby."""
        self.replacements += 1
        loop = self.loop
        assert loop is not None

        def spawn() -> None:
            try:
                host = Host(self, self.cfg)
            except Exception as e:
                log.error("%s: cannot restart its isolate host: %s", self.cfg.name, e)
                return
            try:
                if self.retired:
                    raise RuntimeError("retired meanwhile")
                loop.call_soon_threadsafe(self._adopt, host)
            except RuntimeError:  # the pool was retired or the loop closed meanwhile
                host.stop()

        t = threading.Thread(target=spawn, name="edgefn-host-spawn", daemon=True)
        self.spawning = [s for s in self.spawning if s.is_alive()] + [t]
        t.start()

    def _adopt(self, host: Host) -> None:
        if self.retired:
            host.close_isolates()
            threading.Thread(target=host.stop, daemon=True).start()
            return
        assert self.loop is not None
        host.attach(self.loop)
        if self.active is None:
            self.active = host
            self.idle.extend(i for i in host.isolates if i.state == "idle")
            self._drain_waiting()
            if self.want_standby:
                self._replace()
        elif self.standby is None:
            self.standby = host
        else:  # a standby arrived meanwhile: one is enough
            host.close_isolates()
            threading.Thread(target=host.stop, daemon=True).start()

    def host_call(self, isolate: Isolate, msg: dict[str, Any]) -> None:
        """A guest's call into the PoP (`env.log()`, `env.deployment()`, later bindings)."""
        name, wait = msg.get("name"), msg.get("wait")
        reply: dict[str, Any]
        if name == "log":
            args = msg.get("args") or {}
            log.info("[%s] %s", self.cfg.name, str(args.get("message", ""))[:4096])
            reply = {"result": None}
        elif name == "deployment":
            reply = {"result": {"name": self.cfg.name, "version": self.cfg.version}}
        elif self.bindings is not None and isinstance(name, str):
            try:
                result = self.bindings(name, msg.get("args") or {})
            except Exception as e:  # BindingError: denied or failed; the guest raises it
                reply = {"error": str(e)}
            else:
                if inspect.isawaitable(result):  # the AI binding: answer when it finishes
                    asyncio.get_running_loop().create_task(
                        self._reply_later(isolate, msg.get("id"), result))
                    return
                reply = {"result": result}
        else:
            reply = {"error": f"unknown host call {name!r}"}
        if wait:
            isolate.send(wire.json_frame(wire.REPLY, {"id": msg.get("id"), **reply}))

    async def _reply_later(self, isolate: Isolate, call_id: Any, pending: Awaitable[Any]
                           ) -> None:
        try:
            reply = {"result": await pending}
        except Exception as e:
            reply = {"error": str(e)}
        isolate.send(wire.json_frame(wire.REPLY, {"id": call_id, **reply}))

    # -- lifecycle -----------------------------------------------------------------------------
    def retire(self) -> None:
        """Stop taking requests; stop the hosts once in-flight requests finish."""
        self.retired = True
        for job in self.waiting:
            job.fail(FunctionError("crash", 502,
                                   "was replaced by a new version before this request ran"))
        self.waiting.clear()
        if self.in_flight == 0:
            self._stop_hosts()

    def _stop_hosts(self) -> None:
        if self.hosts_stopped:
            return
        self.hosts_stopped = True
        for host in (self.active, self.standby):
            if host is not None:
                host.close_isolates()  # loop state, on the loop's thread
                threading.Thread(target=host.stop, daemon=True).start()

    def close(self) -> None:
        """Stop everything now (PoP shutdown)."""
        self.retired = True
        for t in self.spawning:
            t.join(READY_TIMEOUT)
        for host in (self.active, self.standby):
            if host is not None:
                host.stop()
