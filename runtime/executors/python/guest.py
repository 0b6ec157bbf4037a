"""The loop each isolate runs inside its subinterpreter: stdlib and the SDK only.

It imports the function module (reporting an import that cannot load in a
subinterpreter by name), answers READY, then serves requests from its socket
one at a time until it has served `recycle_after` of them. A watchdog thread
enforces the CPU and wall limits by raising an asynchronous exception in the
handler's thread; C code that never returns to Python is the PoP's to handle
(it kills the host process).
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import functools
import importlib
import inspect
import json
import os
import re
import socket
import sys
import termios
import threading
import traceback
import types
from typing import TYPE_CHECKING, Any

from edgefn_core import hostcall
from edgefn_core.errors import FunctionError, IsolateInterrupt, IsolateStop, IsolateWedged
from runtime.executors.python import wire
from runtime.executors.python.watchdog import (
    THREAD_GRACE,
    Watchdog,
    quiet_thread_stop,
    stop_threads,
)

if TYPE_CHECKING:  # imported before READY where the function's module holds async code
    # (`awaits`), else by the first awaitable a handler returns (`Session._until`):
    # asyncio is ~50 of the ~135 ms of CPU a fresh interpreter costs its host, paid at
    # every recycle (`recycle_after`) and every isolate started
    import asyncio
    import concurrent.futures

# frames of edgefn's own code (this loop, the guest SDK), left out of user tracebacks
OURS = ("guest.py", "/edgefn/__init__.py")


def prepare(fd: int, module: str, handler_name: str) -> tuple[socket.socket, Any]:
    """Import the function on socket `fd` (duplicated: the host keeps the original).

    Raises `IsolateStop` (after telling the PoP why) if the module cannot be imported.
    """
    sock = socket.socket(fileno=os.dup(fd))
    sys.addaudithook(_threads_it_can_stop)  # this interpreter's, before the function's code
    try:
        return sock, _load(module, handler_name)
    except BaseException as e:
        sock.sendall(wire.json_frame(wire.READY, {"ok": False, **_describe(e, module)}))
        sock.close()
        raise IsolateStop from None


def serve(prepared: tuple[socket.socket, Any], cpu_ms: int, wall_ms: int, recycle_after: int,
          sdk: Any, warnings: list[str] | None = None, kv: dict[str, Any] | None = None,
          max_response: int = wire.MAX_BODY, ahead: bool = False) -> None:
    """Say READY (with `warnings` for the PoP's log), then serve requests until
    recycling; `kv`: the host's KV handles (`local_kv`), None: KV over the socket;
    `max_response`: the function's `limits.max_response_mb` in bytes (a larger
    body is refused here, never sent); `ahead`: the PoP may send requests ahead
    (`pool.pipeline`), and take them back. Raises `IsolateStop` if the PoP went away."""
    sock, handler = prepared
    ready: dict[str, Any] = {"ok": True, "warnings": warnings} if warnings else {"ok": True}
    # the session (its watchdog thread) first: if it cannot start, no READY was sent
    try:
        session = Session(sock, handler, cpu_ms, wall_ms, sdk, kv)
        session.max_response = max_response
        session.ahead = ahead
        if awaits(handler):  # made now, billed to no request (see `awaits`)
            session._event_loop()
    except BaseException:
        sock.close()
        raise
    session.loop(recycle_after, wire.json_frame(wire.READY, ready))


ASYNC_CODE = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


def awaits(handler: Any) -> bool:
    """Whether `handler`'s module holds async code, or has asyncio imported: its
    requests will run on the isolate's event loop. Async code is a coroutine or async
    generator function, or a class with `__await__`, among the module's globals and
    what they hold: their classes' attributes (static and class methods too), what a
    decorator wrapped (`__wrapped__`, or the function in its closure), a partial's
    function, and the code nested in each, at any depth. Importing asyncio and making
    that loop cost 40-120 ms of CPU; made at the first await, they were billed to that
    request, past a 50 ms `limits.cpu_ms` (a 503 ``cpu_limit``, or a stream cut after
    its head, on every fresh interpreter's first async answer). What the module only
    reaches through another module (`import helpers`, then `helpers.Later()`) is not
    looked at: that first await makes the loop, and a limit landing in it replaces
    the interpreter (`Session._until`)."""
    return "asyncio" in sys.modules or holds_async(handler)


def holds_async(handler: Any) -> bool:
    """Whether `handler`'s module holds async code, as `awaits` says."""
    while isinstance(handler, functools.partial):  # its module is its function's
        handler = handler.func
    module = sys.modules.get(getattr(handler, "__module__", None) or "")
    todo: list[Any] = list(vars(module).values()) if module is not None else [handler]
    seen: set[int] = set()
    while todo:
        value = todo.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, types.CodeType):
            if value.co_flags & ASYNC_CODE:
                return True
            todo += [c for c in value.co_consts if isinstance(c, types.CodeType)]
        elif isinstance(value, type):
            if any("__await__" in vars(c) for c in value.__mro__[:-1]):
                return True
            todo += vars(value).values()
        elif isinstance(value, types.FunctionType):
            todo.append(value.__code__)
            for cell in value.__closure__ or ():
                with contextlib.suppress(ValueError):  # an empty cell
                    todo.append(cell.cell_contents)
            if hasattr(value, "__wrapped__"):
                todo.append(value.__wrapped__)
        elif isinstance(value, (staticmethod, classmethod, types.MethodType)):
            todo.append(value.__func__)
        elif isinstance(value, functools.partial):
            todo.append(value.func)
    return False


# every thread started in this interpreter since its session began, by its handle: what
# `reap_threads` stops, whatever the function did to `threading`'s own registry
STARTED: list[Any] = []


def _threads_it_can_stop(event: str, args: tuple[Any, ...]) -> None:
    """Record each thread started (its `_thread` handle), and refuse the ones whose
    handle it cannot see: one started with `_thread` directly ran on after its
    request, outside every limit (16 of them burned the host's CPU for good).
    Raises RuntimeError."""
    if event == "_thread.start_joinable_thread" and args[2] is not None:
        STARTED.append(args[2])
    elif event in ("_thread.start_new_thread", "_thread.start_joinable_thread"):
        raise RuntimeError("a function starts threads with threading.Thread (each must end "
                           "before its request does); _thread is not available")


class _Started:
    """A started thread as `stop_threads` takes it, from its handle."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.ident: int | None = handle.ident
        known = threading._active.get(self.ident)  # type: ignore[attr-defined]
        self.name = known.name if known is not None else f"thread {self.ident}"

    def is_alive(self) -> bool:
        return not self.handle.is_done()

    def join(self, timeout: float | None = None) -> None:
        self.handle.join(timeout)


def _load(module: str, handler_name: str) -> Any:
    """The handler, checked to be callable as ``handler(request, env)`` (one that is
    not deployed and then failed every request). Raises AttributeError or TypeError."""
    mod = importlib.import_module(module)
    handler = getattr(mod, handler_name, None)
    if handler is None:
        raise AttributeError(f"module {module!r} has no function {handler_name!r}")
    want = f"define `def {handler_name}(request, env):` returning an edgefn.Response"
    if not callable(handler):
        raise TypeError(f"{module}.{handler_name} is {type(handler).__name__}, not a "
                        f"function: {want}")
    if inspect.isasyncgenfunction(handler) or inspect.isgeneratorfunction(handler):
        raise TypeError(f"{module}.{handler_name} is a generator function: {want} (a "
                        "stream is Response(a_generator()))")
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):  # no signature to read (a builtin): the first call says
        return handler
    try:
        signature.bind(None, None)
    except TypeError:
        raise TypeError(f"{module}.{handler_name}{signature} cannot be called with "
                        f"(request, env): {want}") from None
    return handler


_UNSUPPORTED = re.compile(r"module (\S+) does not support loading in subinterpreters")


_IMPORT_LINE = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))")


def _describe(e: BaseException, module: str) -> dict[str, Any]:
    """The root cause of an import failure, naming the module that cannot load
    as the function's own code imported it (``msgspec``, not ``msgspec._core``)."""
    chain: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and len(chain) < 10:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    for exc in chain:
        m = _UNSUPPORTED.search(_text(exc))
        if m:
            top = _imported_by_user(e, module) or m.group(1).split(".")[0]
            return {"error": f"imports `{top}`, which cannot load in a subinterpreter "
                             f"({m.group(1)} does not support loading in subinterpreters); "
                             "only the standard library and pure-Python packages work",
                    "module": top}
    return {"error": f"importing `{module}` failed: {_located(e, module)}",
            "module": getattr(e, "name", None)}


def _located(e: BaseException, module: str) -> str:
    """`e` in one line, at the author's file and line (``main.py:3: NameError: ...``,
    ``lib/util.py:1: SyntaxError: ...``): relative to the function's folder, never
    the PoP's copy of it under versions/ (a path a failed deploy deletes)."""
    text = traceback.format_exception_only(e)[-1].strip()  # a SyntaxError's: its last line
    frames = traceback.extract_tb(e.__traceback__)
    entry = os.sep + module.replace(".", os.sep) + ".py"
    syntax = e.filename if isinstance(e, SyntaxError) and e.filename else None
    files = [f.filename for f in frames] + ([syntax] if syntax else [])
    root = next((f[:-len(entry)] for f in files if f.endswith(entry)), None)
    if root is None:
        return text
    if syntax is not None and syntax.startswith(root + os.sep):
        return f"{syntax[len(root) + 1:]}:{e.lineno}: {text}"  # type: ignore[attr-defined]
    inside = [f for f in frames if f.filename.startswith(root + os.sep)]
    if not inside:
        return text
    return f"{inside[-1].filename[len(root) + 1:]}:{inside[-1].lineno}: {text}"


def _imported_by_user(e: BaseException, module: str) -> str | None:
    """The top-level name in the function module's import statement that failed."""
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if os.path.basename(frame.filename) == f"{module}.py" and frame.line:
            m = _IMPORT_LINE.match(frame.line)
            if m:
                return (m.group(1) or m.group(2)).split(".")[0]
    return None


def _cannot_import(e: BaseException) -> str | None:
    """For an import in a request that failed because a C extension refuses isolated
    subinterpreters, a message naming the module the function's code imported."""
    chain: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and len(chain) < 10:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    found = next((m for m in map(_UNSUPPORTED.search, map(_text, chain)) if m), None)
    if found is None:
        return None
    name, where = _user_import(e) or (found.group(1).split(".")[0], "")
    return (f"cannot import module {name!r} inside an isolate: C extensions that do not "
            "support isolated subinterpreters are unavailable ("
            + (f"{where}; " if where else "") + "README: Python functions)")


def _user_import(e: BaseException) -> tuple[str, str] | None:
    """The module named by the outermost import statement in the failure's traceback
    outside edgefn's own frames, and where it is (``main.py:4 in handle``)."""
    for f in traceback.extract_tb(e.__traceback__):
        if f.filename.endswith(OURS) or not f.line:
            continue
        m = _IMPORT_LINE.match(f.line)
        if m and (m.group(1) or m.group(2)).split(".")[0]:
            name = (m.group(1) or m.group(2)).split(".")[0]
            return name, f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}"
    return None


def _raised(e: BaseException) -> str:
    """``raised ValueError: nope (main.py:2 in handle)``: the innermost user frame.
    A message of several lines is kept whole (its last line alone named neither the
    exception nor its start); the PoP's log shows its newlines escaped."""
    where = _user_frame(e)
    lines = traceback.format_exception_only(e)
    text = (lines[-1] if isinstance(e, SyntaxError) else "".join(lines)).strip()
    return f"raised {text}" + (f" ({where})" if where else "")


def _binding_failed(e: BaseException) -> str:
    """``failed in a binding call at main.py:4 in handle: <the PoP's reason>``."""
    where = _user_frame(e)
    return "failed in a binding call" + (f" at {where}" if where else "") + f": {_text(e)}"


def _text(e: BaseException) -> str:
    """``str(e)``, or what says it has none: a function's exception whose ``__str__``
    raised crashed its isolate (a 502 and its host replaced, for a 500's worth)."""
    try:
        return str(e)
    except Exception:
        return f"<{type(e).__name__} whose str() failed>"


def _user_frame(e: BaseException) -> str:
    """``main.py:2 in handle``: the innermost frame of the function's own files (its
    folder is the host's working directory), else of any code but edgefn's (a
    `json.loads` failing is reported at the user's line, not at decoder.py's)."""
    frames = traceback.extract_tb(e.__traceback__)
    user = [f for f in frames if not f.filename.endswith(OURS)]
    if not user:
        return ""
    here = os.getcwd() + os.sep
    own = [f for f in user if f.filename.startswith(here) or not os.path.isabs(f.filename)]
    f = (own or user)[-1]
    return f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}"


CHUNK_MAX = 16 << 20  # a streamed chunk larger than this goes in several frames
WHOLE = (bytes, str, bytearray, memoryview)  # a body sent whole (`Response.streaming`)


class BadResponse(Exception):
    """A Response no HTTP response can carry (the PoP answers 502 ``bad_response``)."""


class Session:
    def __init__(self, sock: socket.socket, handler: Any, cpu_ms: int, wall_ms: int,
                 sdk: Any, kv: dict[str, Any] | None = None) -> None:
        self.sock = sock
        self.max_response = wire.MAX_BODY  # `serve` sets the function's own
        self.ahead = False  # the PoP may send requests ahead, and DROP them (`serve`)
        self.kv: Any = None
        if kv is not None:  # only then: ctypes is not imported into every isolate
            from runtime.executors.python.local_kv import LocalKV
            self.kv = LocalKV(kv, self.call)
        self.handler = handler
        self.sdk = sdk
        self.reader = wire.Reader()
        self.fd = sock.fileno()
        self.count = array.array("i", [0])  # `_unread`'s answer
        self.pending: list[tuple[bytes, bytes]] = []
        # a whole response's frame in C, or None: `respond` goes on in Python
        self.framer = wire.response_framer(sdk.Response, sdk.Headers)
        self.cancel_seen = False  # a CANCEL arrived during a host call of this request
        self.dog = Watchdog(threading.get_ident(), cpu_ms, wall_ms)
        self.loop_: asyncio.AbstractEventLoop | None = None
        self.calls = 0
        self.call_lock = threading.Lock()  # one host call at a time (the handler's threads)
        self.send_lock = threading.Lock()  # one frame at a time
        self.request: Any = None  # the running request (`one`), for its traceparent
        self.executor: concurrent.futures.ThreadPoolExecutor | None = None
        # The threads there before the function ran (this one, the watchdog, and the
        # interpreter's idea of a main thread); any other was started by the function.
        self.ours = {*threading.enumerate(), self.dog.thread}
        STARTED.clear()  # the watchdog's: from here on, only the function's
        self.stuck: list[Any] = []  # told to stop, still running
        # this interpreter takes no job after the current one (the PoP was told): its
        # `recycle_after` is reached, or it ran out of memory (what it holds, a
        # module-level leak, answered memory_limit to every request after it)
        self.last = False
        threading.excepthook = quiet_thread_stop

    def loop(self, recycle_after: int, ready: bytes) -> None:
        """Send `ready`, then serve until `recycle_after` requests were served."""
        try:
            self.sock.sendall(ready)
            served = 0
            while not self.last and not self.stuck:
                kind, payload = self._next()
                if kind == wire.REQUEST:
                    served += 1
                    if served == recycle_after:  # before the response: no new job is sent here
                        self.closing()
                    self.one(payload)
                    self.reap_tasks()
                    self.reap_threads()
                elif kind == wire.WARM:
                    self.warm(payload)
            self._give_back()
            if self.stuck and stop_threads(self.stuck, THREAD_GRACE):
                names = ", ".join(repr(t.name) for t in self.stuck)
                raise IsolateWedged(f"thread {names} is still running (blocked in C code)")
        finally:
            self.dog.stop()
            if self.loop_ is not None:
                self.loop_.close()
            self.sock.close()

    def _next(self) -> tuple[bytes, bytes]:
        """The next frame between requests. Where the PoP sends requests ahead, a
        request starts only once everything the socket holds was read (`_read`
        answers a DROP in it): a DROP the PoP sent before this request's predecessor
        sent its last frame is always seen, so the PoP may run the requests it takes
        back elsewhere at once. Raises `IsolateStop` at EOF."""
        pending = self.pending
        while True:
            while not pending:
                self._read()
            if self.ahead and pending[0][0] == wire.REQUEST:
                while self._unread():
                    self._read()
                if not pending:  # it was taken back
                    continue
            return pending.pop(0)

    def _unread(self) -> bool:
        """Whether the socket holds bytes not read yet (FIONREAD: one syscall, without
        the exception a `recv` that fails with EAGAIN raises, which this look before
        each request sent ahead almost always was)."""
        fcntl.ioctl(self.fd, termios.FIONREAD, self.count, True)
        return self.count[0] > 0

    def _read(self, blocking: bool = True) -> bool:
        """Read what the socket holds into `pending` (without `blocking`: only what is
        there now; False if nothing was), answering any DROP in it. Raises
        `IsolateStop` at EOF."""
        reader = self.reader
        try:
            n = self.sock.recv_into(reader.inbox, 0, 0 if blocking else socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        if not n:
            raise IsolateStop
        frames = reader.feed(reader.inbox_view[:n])
        self.pending.extend(frames)
        for kind, _ in frames:
            if kind == wire.DROP:
                self._absorb()
                break
        return True

    def _absorb(self) -> None:
        """Answer each DROP in `pending`: the requests read before it, none of them
        started (the running one left `pending` when it started), are handed back
        (DROPPED with their count) and forgotten."""
        kept: list[tuple[bytes, bytes]] = []
        for f in self.pending:
            if f[0] != wire.DROP:
                kept.append(f)
                continue
            n = sum(1 for kind, _ in kept if kind == wire.REQUEST)
            kept = [g for g in kept if g[0] != wire.REQUEST]
            self._send(wire.json_frame(wire.DROPPED, {"n": n}))
        self.pending[:] = kept

    def _give_back(self) -> None:
        """This interpreter ends (recycling, or a thread it could not stop): hand back
        the requests it read and will not run (DROPPED, ``ended``), so that the PoP
        sends them elsewhere. A request partly read is read whole first (the PoP
        writes whole frames): the next interpreter on this socket starts at a frame."""
        while self.reader.buf:
            self._read()
        while self._read(blocking=False):
            pass
        n = sum(1 for kind, _ in self.pending if kind == wire.REQUEST)
        if n:
            self._send(wire.json_frame(wire.DROPPED, {"n": n, "ended": True}))

    def closing(self) -> None:
        """Tell the PoP this interpreter takes no job after the current one (once)."""
        if not self.last:
            self.last = True
            self._send(wire.json_frame(wire.READY, {"ok": False, "recycling": True}))

    def one(self, payload: bytes) -> None:
        self.cancel_seen = False
        request, env_vars = self.sdk.Request._decode(payload)
        self.request = request  # its traceparent goes with its fetch and model calls
        env = self.sdk.Env(env_vars, self.call, self.kv)
        try:
            self.dog.arm()
            try:
                result = self.handler(request, env)
                # a Response first: `isawaitable` asks an ABC, ~2 us a request
                if type(result) is not self.sdk.Response and inspect.isawaitable(result):
                    result = self._until(result)
                self.respond(result)
            finally:
                self.dog.disarm()
        except IsolateInterrupt as e:
            self.send_error(e.code, self.dog.exceeded(e.code))
        except BadResponse as e:
            self.send_error("bad_response", str(e))
        except MemoryError:
            self.out_of_memory("MemoryError")
        except self.sdk.BindingError as e:
            self.send_error("binding", _binding_failed(e), "".join(traceback.format_exception(e)))
        except BaseException as e:  # sys.exit(), asyncio.CancelledError, any BaseException:
            # the handler's (it crashed the isolate, with no traceback, file or line)
            if isinstance(e, OSError) and e.errno == errno.ENOMEM:  # mmap, past RLIMIT_AS
                return self.out_of_memory("OSError ENOMEM")
            self.send_error("exception", _cannot_import(e) or _raised(e),
                            "".join(traceback.format_exception(e)))

    def out_of_memory(self, what: str) -> None:
        """The memory_limit answer; the interpreter is recycled (what its module kept,
        a leak, would fail every request after)."""
        self.closing()  # before the answer: no job is sent here again
        self.send_error("memory_limit", f"ran out of memory ({what}); its interpreter "
                        "is recycled")

    def reap_tasks(self) -> None:
        """Cancel the asyncio tasks the function left pending on the isolate's loop
        when its request ended: they ran on during the next request's awaits, billed
        to its cpu_ms (a 503 `cpu_limit` for a request that spun nothing) and seeing
        what it held. One that does not end within `THREAD_GRACE` of its cancel (or
        runs past the CPU limit meanwhile) costs a recycle."""
        loop = self.loop_
        if loop is None:  # no handler of this interpreter awaited anything
            return
        import asyncio

        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        if not pending:
            return
        for task in pending:
            task.cancel()
        try:
            self.dog.arm()
            try:  # their `finally` blocks run, within the function's limits
                loop.run_until_complete(asyncio.wait(pending, timeout=THREAD_GRACE))
            finally:
                self.dog.disarm()
        except BaseException:  # (its limit's interrupt): a fresh interpreter serves next
            self.closing()
        ran_on = any(not t.done() for t in pending)
        if ran_on:
            self.closing()
        self.call("log", {"message": f"edgefn: cancelled {len(pending)} asyncio task(s) "
                                     "the request left pending (tasks must end before the "
                                     "handler returns)" + ("; one ran on, so the isolate "
                                                           "recycles" if ran_on else "")})

    def reap_threads(self) -> None:
        """Stop the threads the function started that outlived its request: work after
        the response runs outside every limit. Those still running after
        `THREAD_GRACE` (blocked in C code) end the isolate's loop, so that it recycles."""
        if not STARTED:
            return
        STARTED[:] = [h for h in STARTED if not h.is_done()]
        if not STARTED:
            return
        if self.executor is not None:  # its idle threads wait for work: tell them to end
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.executor = None
            if self.loop_ is not None:
                self.loop_.set_default_executor(self._new_executor())
        # by handle: a thread the function took out of `threading`'s registry, or whose
        # Thread subclass never entered it, still counts
        strays = [_Started(h) for h in STARTED]
        STARTED.clear()
        self.stuck = stop_threads(strays, THREAD_GRACE)
        names = ", ".join(repr(t.name) for t in strays)
        self.call("log", {"message": f"edgefn: stopped thread {names}: it outlived its request "
                                     "(threads must end before the handler returns)"
                                     + ("; it is blocked, so the isolate recycles"
                                        if self.stuck else "")})

    def warm(self, payload: bytes) -> None:
        """Everything `one` does around the handler, so the first real request is warm."""
        request, env_vars = self.sdk.Request._decode(payload)
        self.sdk.Env(env_vars, self.call, self.kv)
        self.dog.arm()
        self.dog.disarm()
        self.respond(self.sdk.Response(b"", 204, {"x-warm": request.method}))

    def respond(self, result: Any) -> None:
        """Send `result`. Raises `TypeError` for a handler that returned something else
        and `BadResponse` for a status or body no HTTP response can carry (checked
        before anything is sent, so the client gets a 502 and not a broken 200)."""
        frame = self.framer(result, self.max_response)  # most responses: one C call
        if frame is None:
            self._respond(result)
        else:
            self._send(frame)

    def _respond(self, result: Any) -> None:
        """`respond` in Python: the reference for the frames `framer` makes, and what
        sends every response it leaves (streams, other types, the wrong ones)."""
        if not isinstance(result, self.sdk.Response):
            raise BadResponse(f"handler returned {type(result).__name__}, expected "
                              "edgefn.Response (Response.json(...) for JSON)")
        status, body = result.status, result.body
        if type(status) is not int or not 200 <= status <= 599:
            raise BadResponse(f"invalid HTTP status {status!r} (expected an int 200..599: a "
                              "final status)")
        # (`Response.streaming`, its property's call once: a whole body is most responses)
        streaming = type(body) not in WHOLE and not isinstance(body, WHOLE)
        if streaming and (isinstance(body, (dict, set, frozenset)) or not (
                hasattr(body, "__iter__") or hasattr(body, "__anext__"))):
            # a dict streamed its keys as the body, after a 200 (Response.json sends JSON)
            raise BadResponse(f"response body is {type(body).__name__}: expected bytes, "
                              "str or a (async) generator of them (JSON: Response.json)")
        try:  # values as UTF-8, as the SDK decodes a request's: a reflected header round-trips
            headers = [(k.encode("latin-1"), v.encode()) for k, v in result.headers.items()]
        except (AttributeError, UnicodeEncodeError):
            raise BadResponse(_bad_header(result.headers.items())) from None
        if not streaming:
            data = body.encode() if isinstance(body, str) else bytes(body)
            if len(data) > self.max_response:  # the PoP would refuse the frame: never sent
                raise BadResponse(f"response body of {len(data)} bytes exceeds the limit of "
                                  f"{self.max_response} bytes (limits.max_response_mb = "
                                  f"{self.max_response >> 20})")
            self._send(wire.frame(wire.RESPONSE, wire.encode_response(status, headers, data),
                                  wire.RESPONSE_FRAMING))
            return
        self._send(wire.frame(wire.HEAD, wire.encode_response(status, headers, b"")))
        # A failure mid-stream propagates to `one`, which ends the request with ERROR
        # instead of END: exactly one terminal frame per request.
        for chunk in self._chunks(body):
            if isinstance(chunk, str):
                data = chunk.encode()
            elif isinstance(chunk, bytes | bytearray | memoryview):
                data = bytes(chunk)
            else:  # bytes(42) would be 42 NUL bytes
                raise BadResponse(f"a streamed chunk is {type(chunk).__name__}: expected bytes "
                                  "or str; the stream was cut")
            for at in range(0, len(data), CHUNK_MAX):  # one frame never outgrows the wire's
                self._send(wire.frame(wire.CHUNK, data[at:at + CHUNK_MAX]))
            if self._cancelled():
                break
        self._send(wire.frame(wire.END))

    def _chunks(self, body: Any) -> Any:
        if hasattr(body, "__anext__"):
            while True:
                try:
                    yield self._until(body.__anext__())
                except StopAsyncIteration:
                    return
        else:
            yield from body

    def _cancelled(self) -> bool:
        """A CANCEL frame (the client went away) waiting on the socket, or seen while a
        host call waited for its reply?"""
        if self.cancel_seen:
            return True
        self._read(blocking=False)
        for kind, _ in self.pending:
            if kind == wire.REQUEST:  # what follows a request sent ahead is that request's
                return False
            if kind == wire.CANCEL:
                return True
        return False

    def send_error(self, kind: str, message: str, tb: str = "") -> None:
        """The request's error: its message cut as `FunctionError` keeps it, its
        traceback to its last `wire.MAX_TRACEBACK` (the PoP refuses a bigger ERROR
        frame as forged)."""
        self.pending = [f for f in self.pending if f[0] != wire.CANCEL]
        self._send(wire.json_frame(wire.ERROR, {
            "kind": kind, "message": message[:FunctionError.MAX_MESSAGE],
            "traceback": tb[-wire.MAX_TRACEBACK:]}))

    def _send(self, *frame: bytes) -> None:
        """One whole frame, in its parts: the handler's threads send too (a frame cut
        by another's would corrupt the stream)."""
        with self.send_lock:
            for part in frame:
                self.sock.sendall(part)

    def call(self, name: str, args: dict[str, Any], wait: bool = False) -> Any:
        """A host call over the same socket; with `wait`, block for its REPLY. Calls
        from the handler's threads take turns: two at once read each other's
        replies, dropped one as stale, and waited forever. A value given as bytes
        (``kv.put``, ``kv.cas``: `wire.VALUE_CALLS`) is sent raw after the call's JSON,
        where ``"value": ""`` holds its place (a CALL_VALUE frame); a value read comes
        back as bytes (a REPLY_VALUE frame)."""
        if name == "fetch" or name.startswith("ai."):
            traceparent = self.request.headers.get("traceparent") if self.request else None
            if traceparent:
                args = {**args, "traceparent": traceparent}
        with self.call_lock:
            self.calls += 1
            call_id = self.calls
            value = args.get("value") if isinstance(args, dict) else None
            raw = value if name in wire.VALUE_CALLS and isinstance(value, bytes) else None
            if raw is not None:  # sent after the JSON, which keeps its place
                args = {**args, "value": ""}
            try:
                payload = json.dumps({"id": call_id, "name": name, "args": args,
                                      "wait": wait}, allow_nan=False).encode()
            except ValueError:  # NaN or Infinity: no JSON the PoP reads
                raise self.sdk.BindingError(f"{name}: its arguments hold NaN or Infinity, "
                                            "which JSON cannot carry") from None
            # the PoP would end this host; a raw value counts as its base64 (as before)
            if (why := hostcall.refused(payload, 0 if raw is None else len(raw))) is not None:
                raise self.sdk.BindingError(f"{name}: {why}")
            if raw is not None:
                self._send(*wire.value_frame(wire.CALL_VALUE, payload, raw))
            else:
                self._send(wire.frame(wire.CALL, payload))
            if not wait:
                return None
            reply = self._reply(call_id)
            if "error" in reply:
                raise self.sdk.BindingError(reply["error"])
            return reply.get("result")

    def _reply(self, call_id: int) -> dict[str, Any]:
        """Block for the reply to call `call_id`. Requests sent ahead (and what follows
        them) stay in `pending` for later; a CANCEL before them is this request's.
        Raises `IsolateStop` at EOF, ValueError or `ProtocolError` for a broken reply."""
        pending = self.pending
        while True:
            i, ahead = 0, False
            while i < len(pending):
                kind = pending[i][0]
                if kind in (wire.REPLY, wire.REPLY_VALUE):
                    reply = _answer(*pending.pop(i))
                    if reply.get("id") == call_id:
                        return reply
                    continue  # the late answer to a call of a request that was cut short
                if kind in (wire.REQUEST, wire.WARM) or ahead:
                    ahead = True  # kept, in order, for the loop
                    i += 1
                    continue
                if kind == wire.CANCEL:  # the client left while this call waited: its reply
                    self.cancel_seen = True  # (an error, the PoP stopped the call) comes
                del pending[i]  # next; a stream then ends at its next chunk (`_cancelled`)
            self._read()

    def _until(self, awaitable: Any) -> Any:
        """`awaitable` run on the isolate's event loop, cancelled when the watchdog
        trips (then its interrupt is raised): an await past the limit sat in
        select(), out of the interrupt's reach, until the host was killed as "stuck
        in native code" a second later (every isolate of the host lost)."""
        try:
            import asyncio

            loop = self._event_loop()
        except BaseException:  # its limit's interrupt landed in asyncio's import, which
            # stays half made in this interpreter: every later await raised NameError
            # (`base_events`) for good. A fresh one serves after this request
            self.closing()
            raise
        task = asyncio.ensure_future(awaitable, loop=loop)
        def wake() -> None:  # from the watchdog's thread
            loop.call_soon_threadsafe(task.cancel)

        self.dog.waker = wake
        try:
            return loop.run_until_complete(task)
        except asyncio.CancelledError:
            tripped = self.dog.tripped
            if tripped is not None:
                raise tripped() from None
            raise
        finally:
            self.dog.waker = None

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self.loop_ is None:
            import asyncio

            self.loop_ = asyncio.new_event_loop()
            self.loop_.set_default_executor(self._new_executor())
        return self.loop_

    def _new_executor(self) -> concurrent.futures.ThreadPoolExecutor:
        """The event loop's executor (`asyncio.to_thread`): one per request that used
        it, since `reap_threads` ends its threads with the request."""
        import concurrent.futures

        self.executor = concurrent.futures.ThreadPoolExecutor()
        return self.executor


def _answer(kind: bytes, payload: bytes) -> dict[str, Any]:
    """A REPLY's answer; a REPLY_VALUE's with its value, as bytes, in its result's
    "value" (its head holds ""). Raises ValueError, `ProtocolError` (the PoP's frame
    is broken)."""
    if kind == wire.REPLY:
        return json.loads(payload)
    head, value = wire.split_value(payload)
    reply: dict[str, Any] = json.loads(head)
    if isinstance(reply.get("result"), dict):
        reply["result"]["value"] = bytes(value)
    return reply


def _bad_header(items: Any) -> str:
    """What is wrong with the first header that does not encode."""
    for k, v in items:
        if not isinstance(k, str) or not isinstance(v, str):
            return (f"response header {k!r}: name and value must be str, got "
                    f"{type(k).__name__} and {type(v).__name__}")
        try:
            k.encode("latin-1")
        except UnicodeEncodeError:
            return f"response header name {k!r} is not ASCII"
    return "a response header does not encode"
