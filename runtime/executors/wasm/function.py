"""WASM executor: a fresh instance per request from a pre-linked module.

Two guest ABIs (see README "Guest ABI"):
- reactor: exports ``memory``, ``edgefn_alloc``, ``edgefn_handle``; runs inline
  on the event loop through the raw call path (`wasm_ffi`), for at most
  `INLINE_SLICE_MS`. A reactor whose budget is longer and that overruns the
  slice is stopped there (epoch deadline) and the request runs again on a
  worker thread with its full budget; if that run takes `SLICE_CPU_S` of CPU
  the function moves to the threads for good (less: the cut was the loop's
  thread being preempted). That is safe because an inline reactor has no host
  imports: it is a pure function of the request. Reactors with host imports
  (bindings) always run on the threads.
- wasi: a WASI command (``_start``), WAGI-style: request in the environment and
  stdin, CGI response on stdout (`wasi_stdio`). Without host imports it runs
  inline as a reactor does (the same slice, the same move to the threads), and
  also moves for good the first time it sleeps (``poll_oneoff``: a sleep never
  runs on the loop's thread; the request runs again on a thread). With host
  imports (or a `limits.max_response_mb` past `INLINE_RESPONSE_MB`) it runs on a
  worker thread, so a guest that blocks in a host call cannot stall the loop.
  Its sleeps end at the wall-time deadline (`wasi_poll`), so a timed-out request
  frees its thread. Without host imports a run is a pure function of the request
  (no files, no network: README "Guest ABI"), which is what makes a run cut
  inline safe to run again.

A function holds at most `THREAD_SHARE` (or `limits.concurrency`, if smaller)
worker threads at once, and the functions of one owner `TENANT_SHARE` together,
and `THREAD_RESERVE` threads more only for owners holding none, and the requests
on threads count at most `[wasm] max_thread_memory_mb` of guest memory (`shares`);
further requests wait for one within their wall time.
A thread counts as held until its job really ends, not when the request gives up.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import math
import re
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from pathlib import Path

import wasmtime
from wasmtime import _func as wasmtime_func

from edgefn_core.abi import (
    decode_response,
    encode_pairs,
    encode_params,
    encode_request,
)
from edgefn_core.errors import BindingError, DeployError, FunctionError
from runtime.bindings import Bindings
from runtime.bindings.fetch import Lineage
from runtime.bindings.stop import Stop, stopping
from runtime.executors.base import NO_PRINCIPAL, principal_blob
from runtime.executors.output import GuestLines
from runtime.executors.wasm import host as wasm_host
from runtime.executors.wasm import native as wasm_native
from runtime.executors.wasm import native_wasi, wasi_poll, wasi_random, wasi_stdio
from runtime.executors.wasm import wasi as cgi
from runtime.executors.wasm.engine import THREAD_SHARE, TICK_SECONDS, WasmEngine, ptr_value
from runtime.executors.wasm.ffi import Outcome, ReactorCall, binding_error, trap_error
from runtime.executors.wasm.host import NO_ORIGIN, Origin
from runtime.executors.wasm.native import NativeReactorCall
from runtime.executors.wasm.timing import InstantiateTimes
from runtime.functions.manifest import Manifest, wasi_cgi_name
from runtime.net.message import Request, Response, cdn_loop

log = logging.getLogger("edgefn.wasm")

WASI_MODULE = "wasi_snapshot_preview1"
INLINE_SLICE_MS = 5  # the longest one request runs on the event loop
INLINE_RESPONSE_MB = 16  # a reactor whose responses may be larger runs on worker threads
# CPU time (s) a run cut at the slice must take again on a thread for the function to
# leave the loop for good; less means the cut was the thread's preemption, not the guest
SLICE_CPU_S = INLINE_SLICE_MS / 1000 / 2
PREWARM_WINDOW_S = 0.5  # how long warm-up runs cut at the time slice are tried again
SLICE_EXPIRED = "inline_slice"  # the Outcome kind of a reactor stopped at the slice
POOL_LIMITS = "does not fit in pooling allocator requirements"  # wasmtime's words
STARTING = "starting an instance (its start function, then edgefn_alloc) failed"
REACTOR_EXPORTS = {
    "memory": "memory",
    "edgefn_alloc": "func (i32) -> (i32)",
    "edgefn_handle": "func (i32, i32) -> (i64)",
}


class WasmFunction:
    def __init__(self, wasm: WasmEngine, manifest: Manifest, directory: Path,
                 bindings: Bindings | None = None, version: str = "") -> None:
        """Compile, check exports and imports, and pre-link. Raises `DeployError`."""
        self.wasm = wasm
        self.manifest = manifest
        self.name = manifest.name
        # a WASI guest's stderr, in the log as a Python host's output is (bounded, escaped)
        self.stderr = GuestLines(logging.getLogger("edgefn.functions"),
                                 f"{self.name}@{version}" if version else self.name, "stderr")
        limits = manifest.limits
        self.memory_limit = limits.memory_mb << 20
        self.max_response = limits.max_response_mb << 20
        tick_ms = TICK_SECONDS * 1000
        budget_ms = min(limits.cpu_ms, limits.wall_ms)
        if manifest.bindings.ai:
            # epochs count time, and an AI call blocks for seconds: with the AI binding
            # the deadline is the wall-time limit (time in host calls included)
            budget_ms = limits.wall_ms
        # +1: the first tick may come right after the deadline is set.
        self.deadline_ticks = math.ceil(budget_ms / tick_ms) + 1
        self.slice_ticks = min(self.deadline_ticks, math.ceil(INLINE_SLICE_MS / tick_ms) + 1)
        self.thread_share = min(THREAD_SHARE, limits.concurrency)
        self.slow_start = False  # starting an instance takes the inline slice (`prewarm`)
        # set by the native lane when its inline run failed (the slice, a trap): the
        # request comes to `handle` next, which then runs it inline once, not twice
        self.lane_cut = False
        # a request cut at the slice twice runs again on a thread, whose CPU time says
        # whether the function needs the threads for good; until that run ends, its other
        # requests go there too rather than take the loop for two slices each (40 at
        # once held it 0.5-1.1 s)
        self.verdict_pending = False
        # the share as a semaphore of the loop serving it (a test may run several loops)
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        kind = "wall_limit" if manifest.bindings.ai or limits.cpu_ms > limits.wall_ms \
            else "cpu_limit"
        self.outcome = Outcome(kind, budget_ms, self.memory_limit)
        self.module = self._compile(directory / manifest.entry)
        self.abi = self._detect_abi()
        uses_wasi, host_funcs = self._check_imports()
        self.native_wasi: native_wasi.NativeWasi | None = None  # a command's run in C
        linker = wasmtime.Linker(wasm.engine)
        if uses_wasi:
            linker.define_wasi()
            wasi_poll.define(linker, wasm.deadlines, wasm.stopping)
            wasi_random.define(linker, wasm.deadlines, wasm.stopping)
            # (a reactor may not import WASI: refused below) the engine's switch too
            # (`WasmEngine(native=False)`: the Python paths)
            self.native_wasi = native_wasi.enabled() if wasm.native is not None else None
            if self.native_wasi is not None:
                self.native_wasi.define(linker)
            else:
                wasi_stdio.define(linker)
        self.host_functions: wasm_host.HostFunctions | None = None
        if host_funcs:
            if bindings is None:
                raise DeployError(f"{manifest.entry}: imports edgefn host functions, but no "
                                  "bindings are available")
            try:
                self.host_functions = wasm_host.HostFunctions(linker, host_funcs, bindings)
            except BindingError as e:
                raise DeployError(f"{manifest.entry}: {e}") from None
        try:
            self.pre = linker.instantiate_pre(self.module)
        except wasmtime.WasmtimeError as e:
            raise DeployError(f"{manifest.entry}: cannot link module: {_link_error(str(e))}") \
                from None
        # the engine's and the pre-linked module's C pointers, for the native run
        self.raw_pre = (ptr_value(wasm.engine), ptr_value(self.pre))
        b = manifest.bindings
        # a host call may block (a model call, a synced KV write, a fetch): off the event
        # loop; and so is a response larger than the default limit, copied out of guest
        # memory in one piece (250 MB held every request on the loop for a second)
        self.threaded = bool(b.ai or b.kv or b.vectors or b.fetch or host_funcs
                             or limits.max_response_mb > INLINE_RESPONSE_MB)
        self.env = dict(manifest.env)
        if self.abi == "wasi":  # a name the PoP sets per request is never the manifest's:
            # where a request did not set it (REMOTE_USER for an anonymous caller), an
            # `abi = "auto"` command got the manifest's (a deploy with abi = "wasi" is
            # refused such a name; "auto" learns it is a command only here)
            for name in [k for k, v in self.env.items() if wasi_cgi_name(k)]:
                log.warning("%s: env %s is named like a CGI variable the PoP sets for each "
                            "request: a WASI command never gets the manifest's (choose "
                            "another name)", manifest.name, name)
                del self.env[name]
        self.env_blob = encode_pairs([(k.encode(), v.encode()) for k, v in self.env.items()])
        if self.abi == "reactor":
            if uses_wasi:
                raise DeployError(f"{manifest.entry}: a reactor module may not import "
                                  f"`{WASI_MODULE}`; build it as a WASI command (abi = \"wasi\")")
            call_type = ReactorCall if wasm.native is None else partial(NativeReactorCall,
                                                                        wasm.native)
            self.instantiate_times = InstantiateTimes()  # edgefn_wasm_instantiate_seconds
            self.new_call = partial(call_type, wasm.engine, self.pre, self.memory_limit,
                                    self.deadline_ticks, self.outcome, self.max_response,
                                    self.instantiate_times)
            # inline: stopped at the slice, reported as SLICE_EXPIRED if the budget is longer
            sliced = self.slice_ticks < self.deadline_ticks
            self.call = call_type(wasm.engine, self.pre, self.memory_limit, self.slice_ticks,
                                  Outcome(SLICE_EXPIRED, INLINE_SLICE_MS, self.memory_limit)
                                  if sliced else self.outcome, self.max_response,
                                  self.instantiate_times)
            self.per_thread = threading.local()  # call objects hold per-call buffers

    # -- deploy time ------------------------------------------------------------------------
    def _compile(self, entry: Path) -> wasmtime.Module:
        try:
            source = entry.read_bytes()
            wasm = wasmtime.wat2wasm(source.decode()) if entry.suffix == ".wat" else source
            return self.wasm.compile(bytes(wasm))
        except (wasmtime.WasmtimeError, UnicodeDecodeError) as e:
            if entry.suffix != ".wat" and not source.startswith(b"\0asm"):  # wasmtime's error
                raise DeployError(f"{entry.name}: not a WebAssembly binary (its first bytes "
                                  f"are {source[:4]!r}, not b'\\x00asm'; a text module goes "
                                  "in a `.wat` file)") from None  # was its WAT parser's
            if POOL_LIMITS in str(e):  # valid, but past what an instance slot holds
                cause = str(e).partition("Caused by:")[2] or str(e)
                raise DeployError(f"{entry.name}: a module edgefn's instances cannot host: "
                                  f"{_short(cause, entry.name)} (each instance has one memory, "
                                  "not shared: no wasm threads, of at most 1 GiB, and one "
                                  "table of at most 20,000 elements)") from None
            raise DeployError(f"{entry.name}: not a valid WebAssembly module: "
                              f"{_short(str(e), entry.name)}") from None

    def _detect_abi(self) -> str:
        exports = {e.name: e.type for e in self.module.exports}
        entry = self.manifest.entry
        abi: str = self.manifest.abi
        if abi == "auto":
            abi = "reactor" if "edgefn_handle" in exports else "wasi" if "_start" in exports else ""
        if not abi:
            raise DeployError(f"{entry}: module exports neither `edgefn_handle` "
                              "(reactor ABI) nor `_start` (WASI command)")
        if abi == "wasi" and not isinstance(exports.get("_start"), wasmtime.FuncType):
            raise DeployError(f"{entry}: edgefn.toml says abi = \"wasi\", which needs a "
                              "function export `_start`; this module has none (a reactor "
                              "exporting `edgefn_handle` wants abi = \"reactor\" or \"auto\")")
        if abi == "reactor":
            for name, want in REACTOR_EXPORTS.items():
                got = _describe(exports.get(name))
                if got != want:
                    raise DeployError(f"{entry}: reactor ABI needs an export `{name}` of type "
                                      f"{want}, found {got}")
        return abi

    def _check_imports(self) -> tuple[bool, set[str]]:
        uses_wasi = False
        host: set[str] = set()
        for imp in self.module.imports:
            if imp.module == WASI_MODULE:
                uses_wasi = True
            elif imp.module == "edgefn" and imp.name is not None:
                host.add(imp.name)
            else:
                raise DeployError(f"{self.manifest.entry}: module imports "
                                  f"`{imp.module}.{imp.name}`, which edgefn does not provide")
        return uses_wasi, host

    def prewarm(self) -> None:
        """Instantiate once so code pages and pool slots are hot. Raises `DeployError`
        if the module cannot be instantiated within its limits."""
        store = wasmtime.Store(self.wasm.engine)
        store.set_limits(memory_size=self.memory_limit)
        store.set_epoch_deadline(self.deadline_ticks)
        if self.abi == "wasi":
            store.set_wasi(wasmtime.WasiConfig())
        wasm_native.guest_begin()  # its start function runs
        try:
            self.pre.instantiate(store)
        except (wasmtime.WasmtimeError, wasmtime.Trap) as e:
            if "wasm trap: interrupt" in str(e):  # the epoch deadline: a start function looping
                raise DeployError(f"{self.manifest.entry}: its start function did not finish "
                                  f"within {self.outcome.limit_ms} ms (limits.cpu_ms / "
                                  "wall_ms)") from None
            if isinstance(e, wasmtime.Trap) or "wasm trap" in str(e):  # not the memory's
                raise DeployError(f"{self.manifest.entry}: instantiating it trapped (in "
                                  "its start function, or at a data or element segment "
                                  "past its memory or table): "
                                  f"{_short(str(e))}") from None
            raise DeployError(f"{self.manifest.entry}: cannot instantiate within "
                              f"limits.memory_mb = {self.manifest.limits.memory_mb}: "
                              f"{_short(str(e))}") from None
        finally:
            wasm_native.guest_end()
        if self.abi == "reactor" and not self.slow_start:
            sample = encode_request(b"GET", b"/", b"", [(b"host", b"prewarm")], self.env_blob, b"")
            warm = 0  # runs that finished: the second reuses the slot the first one warmed
            give_up = time.monotonic() + PREWARM_WINDOW_S
            while warm < 2:
                try:
                    self.call.prewarm(sample)
                    warm += 1
                except FunctionError as e:
                    # cut at the inline slice: on a busy machine (PoPs compiling side
                    # by side) a cold run can be; one that is cut every time is refused
                    if e.code != SLICE_EXPIRED or time.monotonic() > give_up:
                        raise DeployError(f"{self.manifest.entry}: {STARTING}: {e}") from None
                    if self._starts_slowly(sample):
                        return

    def _starts_slowly(self, sample: bytes) -> bool:
        """Whether an instance takes the inline slice's CPU just to start (its start
        function, ``edgefn_alloc``): run with the full budget and timed, as a request
        cut at the slice is (`_timed`). Such a function runs on worker threads
        from now on (every inline run would be cut); a start that does not fit the
        full budget raises `DeployError`."""
        cpu = time.thread_time()
        try:
            self.new_call().prewarm(sample)
        except FunctionError as e:
            raise DeployError(f"{self.manifest.entry}: {STARTING}: {e}") from None
        if time.thread_time() - cpu < SLICE_CPU_S:
            return False  # cut by a busy machine, not by its own work
        self.slow_start = self.threaded = True
        log.info("%s: an instance takes more than the %d ms inline slice to start; runs on "
                 "worker threads", self.name, INLINE_SLICE_MS)
        return True

    @property
    def pure(self) -> bool:
        """A reactor without host imports: its response is a function of the request
        alone, so a warm-up may run it (`runtime.functions.warmup`)."""
        return self.abi == "reactor" and self.host_functions is None

    def dry_run(self, request: Request, params: Mapping[str, str]) -> Response:
        """`request` on a pure reactor, inline only: a run past the inline slice is cut
        there (`FunctionError` with code `SLICE_EXPIRED`), never moved to a thread with
        the full budget, so a warm-up costs a deploy at most the slice. Raises
        `FunctionError`."""
        return Response(*self.call.serve(request.method, request.path, request.query,
                                         request.headers, self.env_blob, request.body,
                                         encode_params(params), principal_blob(NO_PRINCIPAL)))

    def activate(self) -> None:
        self.prewarm()  # again, on the loop's thread: its caches are the ones that count

    def retire(self) -> None:
        """Nothing to release: instances never outlive their request."""

    def close(self) -> None:
        """Nothing to release: the engine is the PoP's."""

    # -- request time -----------------------------------------------------------------------
    def handle(self, request: Request, route: str, params: Mapping[str, str],
               principal: Mapping[str, str] = NO_PRINCIPAL) -> Response | Awaitable[Response]:
        """Raises `FunctionError` for a run made inline; the future of one made on a
        worker thread raises it when awaited.
        A reactor gets `params` and `principal` in the request's params and principal
        sections, a WASI command as ``EDGEFN_PARAM_<NAME>`` and
        ``EDGEFN_PRINCIPAL_<FIELD>`` variables (see `edgefn_core.abi`, `wasi.environ`)."""
        if self.abi == "reactor":
            params_blob, who = encode_params(params), principal_blob(principal)
            lane_ran, self.lane_cut = self.lane_cut, False
            if self.threaded:
                return self._handle_threaded(self._encode(request, params_blob, who),
                                             _origin(request, principal))
            if not self.verdict_pending:
                done = self._inline(request, params_blob, who, 1 if lane_ran else 2)
                if done is not None:
                    return done
                self.verdict_pending = True
            return self._rerun_threaded(self._encode(request, params_blob, who),
                                        _origin(request, principal))
        env = cgi.environ(request, route, self.env, params, principal)
        lane_ran, self.lane_cut = self.lane_cut, False
        if self.threaded:  # its bindings (a host call may block), or moved there
            return self._wasi_threaded(env, request.body, _origin(request, principal))
        if not self.verdict_pending:  # (inline: no host imports, so no origin to carry)
            done = self._wasi_inline(env, request.body, 1 if lane_ran else 2)
            if done is not None:
                return done
            self.verdict_pending = True
        return self._rerun_wasi_threaded(env, request.body, _origin(request, principal))

    def handle_quiet(self, request: Request, route: str, params: Mapping[str, str],
                     principal: Mapping[str, str] = NO_PRINCIPAL
                     ) -> Response | Awaitable[Response]:
        """A quiet warm-up request (`runtime.pipeline.warm`): a reactor run inline
        once, within its slice, the function's state untouched; raises
        `FunctionError` (``SLICE_EXPIRED``) where it is cut there. `handle` ran one cut
        at the slice again on a thread, to its own limits: a looping handler held a
        deploy 30 s (the warm-up's timeout) and a boot as long for each such function.
        Any other function's as `handle`'s."""
        if self.abi != "reactor" or self.threaded:
            return self.handle(request, route, params, principal)
        done = self._inline(request, encode_params(params), principal_blob(principal), 1)
        if done is None:
            raise FunctionError(SLICE_EXPIRED, 503, "its warm-up request was cut at the "
                                "inline slice (not run again)")
        return done

    def _inline(self, request: Request, params_blob: bytes, who: bytes, tries: int
                ) -> Response | None:
        """`request` run inline, `tries` times at most while it is cut at the slice
        (None: cut every time). Raises `FunctionError` for anything but the slice.

        One C call with the native extension: encode, run, decode. Cut at the slice,
        it runs inline once more before it needs a worker thread: a short guest is cut
        when the loop's thread is preempted mid-call (epochs count wall time), and other
        owners' long functions may hold every thread meanwhile. A run the native lane
        made and gave up on (`lane_cut`) was the first of the two."""
        for _ in range(tries):
            try:
                return Response(*self.call.serve(request.method, request.path, request.query,
                                                 request.headers, self.env_blob, request.body,
                                                 params_blob, who))
            except FunctionError as e:
                if e.code != SLICE_EXPIRED:
                    raise
        return None

    def _encode(self, request: Request, params_blob: bytes, principal: bytes) -> bytes:
        return encode_request(request.method, request.path, request.query, request.headers,
                              self.env_blob, request.body, params_blob, principal)

    async def _handle_threaded(self, data: bytes, origin: Origin = NO_ORIGIN) -> Response:
        """Reactors that declare bindings run on a worker thread: a model call or a
        synced KV write waits there while the event loop keeps serving. Their fetch
        and model calls carry the request's `traceparent`."""
        deadline = time.monotonic() + self.manifest.limits.wall_ms / 1000  # waiting counts
        output = await self._on_thread(self._call_here, data, origin, deadline)
        return Response(*decode_response(output))

    async def _rerun_threaded(self, data: bytes, origin: Origin) -> Response:
        """A request cut at the inline slice, run again on a worker thread with its
        full budget. The function moves to the threads for good only if that run
        shows the guest needs the slice (`SLICE_CPU_S` of its thread's CPU time):
        epochs count wall time, so on a busy machine a short guest is also cut
        when the loop's thread is preempted mid-call, and moving it for that
        would cost every later request a thread hop."""
        deadline = time.monotonic() + self.manifest.limits.wall_ms / 1000
        output = await self._on_thread(self._timed, self._call_here, data, origin, deadline)
        return Response(*decode_response(output))

    def _timed(self, job: Callable[..., bytes], *args: object) -> bytes:
        """`job(*args)` (a run cut at the inline slice, again on a worker thread), then
        the verdict: the threads for good if it took `SLICE_CPU_S` of CPU."""
        cpu = time.thread_time()
        try:
            return job(*args)
        finally:  # a limit hit counts too: it took at least its budget
            used = time.thread_time() - cpu
            if used >= SLICE_CPU_S:
                self._to_threads(f"ran past the {INLINE_SLICE_MS} ms inline slice and takes "
                                 f"{used * 1000:.1f} ms of CPU")
            self.verdict_pending = False  # after `threaded`: the loop reads them in turn

    def _to_threads(self, why: str) -> None:
        if not self.threaded:
            self.threaded = True
            log.info("%s: %s; runs on worker threads from now on", self.name, why)

    def _call_here(self, data: bytes, origin: Origin = NO_ORIGIN,
                   wall_deadline: float = 0.0) -> bytes:
        """One reactor call on this thread; its host calls end at `wall_deadline`
        (`time.monotonic()`; 0: `wall_ms` from now), counted from when the request
        asked for a thread: waiting for one counts."""
        call = getattr(self.per_thread, "call", None)
        if call is None:
            call = self.per_thread.call = self.new_call()
        if self.host_functions is not None:
            # host calls push a CPU deadline back by what they take (see `wasm_host`)
            now = time.monotonic()
            self.host_functions.begin_request(
                now + self.outcome.limit_ms / 1000
                if self.outcome.interrupt_kind == "cpu_limit" else 0.0, origin,
                wall_deadline or now + self.manifest.limits.wall_ms / 1000)
        return call(data)

    async def _on_thread(self, job: Callable[..., bytes], *args: object) -> bytes:
        """`job(*args)` on a worker thread, once one of this function's thread slots is
        free. Raises `FunctionError` (wall_limit) if waiting and running outlive the
        wall-time limit; the slot is released when `job` really returns."""
        wall_ms = self.manifest.limits.wall_ms
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.thread_share))
        slots, shares, owner = self._slots[1], self.wasm.shares(loop), self.manifest.tenant
        mb = shares.counted(self.manifest.limits.memory_mb)
        held: list[Callable[[], None]] = []
        stop = Stop()  # what the guest's model calls wait on, stopped if it is left
        running = False
        try:
            async with asyncio.timeout(wall_ms / 1000 + 0.05):
                await slots.acquire()
                held.append(slots.release)
                await shares.acquire(owner, mb)
                held.append(partial(shares.release, owner, mb))
                future = self.wasm.threads.submit(_stoppable, stop, job, *args)
                releases, held, running = tuple(held), [], True  # given back when it ends
                future.add_done_callback(partial(_release, loop, releases))
                return await asyncio.wrap_future(future)
        except TimeoutError:
            stop.cancel()  # its model call generated on to max_tokens for no one
            where = ("running, or blocked in a host call" if running else
                     f"waiting for a worker thread: its {self.thread_share} or its owner's "
                     "were all busy, or the threads' guest memory ([wasm] "
                     "max_thread_memory_mb) was")
            raise FunctionError("wall_limit", 504, f"exceeded its wall-time limit of "
                                f"{wall_ms} ms ({where})") from None
        except asyncio.CancelledError:  # the client went away
            stop.cancel()
            raise
        finally:
            for release in held:  # acquired, then the wait for the next one gave up
                release()

    def _wasi_inline(self, env: list[tuple[str, str]], body: bytes, tries: int
                     ) -> Response | None:
        """A WASI command without host imports run inline, as `_inline` runs a reactor:
        `tries` times at most while it is cut at the slice (None: cut each time, or it
        slept, which moves it to the threads for good; a run the native lane made and
        gave up on was the first of two). Raises `FunctionError`."""
        for _ in range(tries):
            try:
                return Response(*cgi.parse_response(self._run_wasi(
                    env, body, time.monotonic() + self.manifest.limits.wall_ms / 1000,
                    inline=True)))
            except FunctionError as e:
                if e.code != SLICE_EXPIRED:
                    raise
                if self.threaded:  # it slept
                    return None
        return None

    async def _wasi_threaded(self, env: list[tuple[str, str]], body: bytes,
                             origin: Origin) -> Response:
        """A WASI command that may block (its host imports, or it sleeps, or it needs
        more than the inline slice) runs on a worker thread."""
        deadline = time.monotonic() + self.manifest.limits.wall_ms / 1000  # waiting counts
        return Response(*cgi.parse_response(await self._on_thread(
            self._run_wasi, env, body, deadline, origin)))

    async def _rerun_wasi_threaded(self, env: list[tuple[str, str]], body: bytes,
                                   origin: Origin) -> Response:
        """A WASI command cut at the inline slice, run again on a worker thread with its
        full budget; the function moves to the threads if that run needed the slice
        (`_rerun_threaded`'s rule)."""
        deadline = time.monotonic() + self.manifest.limits.wall_ms / 1000
        return Response(*cgi.parse_response(await self._on_thread(
            self._timed, self._run_wasi, env, body, deadline, origin)))

    def _run_wasi(self, env: list[tuple[str, str]], body: bytes, deadline: float,
                  origin: Origin = NO_ORIGIN, inline: bool = False) -> bytes:
        """Run `_start` in a fresh store; its sleeps end at `deadline`
        (`time.monotonic()`). `inline` (on the event loop's thread): it stops at the
        inline slice or at a sleep, whichever comes first (`FunctionError` with code
        `SLICE_EXPIRED`; a sleep also moves the function to the threads). Raises
        `FunctionError`."""
        if time.monotonic() >= deadline:  # it waited for a thread that long: nobody waits now
            raise FunctionError("wall_limit", 504, "exceeded its wall-time limit of "
                                f"{self.manifest.limits.wall_ms} ms waiting for a thread")
        if self.host_functions is not None:
            self.host_functions.begin_request(0.0, origin)
        sliced = inline and self.slice_ticks < self.deadline_ticks
        ticks = self.slice_ticks if sliced else self.deadline_ticks
        outcome = Outcome(SLICE_EXPIRED, INLINE_SLICE_MS, self.memory_limit) if sliced \
            else self.outcome
        deadlines = self.wasm.deadlines
        deadlines.start(deadline, inline, INLINE_SLICE_MS / 1000)
        wasm_native.guest_begin()
        try:
            if self.native_wasi is not None:
                return self._start_native(self.native_wasi, env, body, ticks, outcome)
            return self._start_python(env, body, ticks, outcome)
        finally:
            wasm_native.guest_end()
            if inline:
                deadlines.end()

    def _start_native(self, lib: native_wasi.NativeWasi, env: list[tuple[str, str]],
                      body: bytes, ticks: int, outcome: Outcome) -> bytes:
        """`_run_wasi`'s run in one C call (`native_wasi`). Raises `FunctionError`."""
        stage, r = lib.run(*self.raw_pre, self.memory_limit, ticks, [self.name], env, body,
                           self.max_response)
        if r.err_len:
            self._log_stderr(ctypes.string_at(r.err, r.err_len))
        self._stderr_dropped(r.err_dropped)
        failure: wasmtime.WasmtimeError | wasmtime.Trap | None = None
        if r.trap or r.error:
            # what a Python host function raised (poll_oneoff's sleeps: `deadlines` says),
            # which wasmtime-py keeps for the next of its own calls that fails
            wasmtime_func.LAST_EXCEPTION = None
        if r.trap:
            failure = wasmtime.Trap._from_ptr(ctypes.cast(r.trap, native_wasi.TRAP))
            if r.error:  # (never both, but each is owned here)
                wasmtime.WasmtimeError._from_ptr(ctypes.cast(r.error, native_wasi.ERROR))
        elif r.error:
            failure = wasmtime.WasmtimeError._from_ptr(ctypes.cast(r.error, native_wasi.ERROR))
        elif stage != native_wasi.RUN_OK:  # (a deploy checked `_start`; the config, memory)
            raise FunctionError("trap", 500, "exports no `_start` function"
                                if stage == native_wasi.RUN_NO_START else
                                "cannot set up its WASI context (arguments, environment)")
        if r.overflow:  # (its trap, `failure`, is freed with it)
            raise self._too_large()
        if failure is not None:
            self._wasi_failed(failure, outcome, r.memory_size)
        return ctypes.string_at(r.out, r.out_len) if r.out_len else b""

    def _start_python(self, env: list[tuple[str, str]], body: bytes, ticks: int,
                      outcome: Outcome) -> bytes:
        """`_run_wasi`'s run through wasmtime-py, its stdio `wasi_stdio`'s. Raises
        `FunctionError`."""
        store = wasmtime.Store(self.wasm.engine)
        store.set_limits(memory_size=self.memory_limit)
        store.set_epoch_deadline(ticks)
        config = wasmtime.WasiConfig()  # argv and the environment: stdio is `wasi_stdio`'s
        config.argv = [self.name]
        config.env = env
        store.set_wasi(config)
        stdio = wasi_stdio.Stdio(body, self.max_response, self._log_stderr)
        instance = None
        failure: wasmtime.WasmtimeError | wasmtime.Trap | None = None
        try:
            with wasi_stdio.serving(stdio):
                instance = self.pre.instantiate(store)
                start = instance.exports(store)["_start"]
                assert isinstance(start, wasmtime.Func)
                start(store)
        except (wasmtime.Trap, wasmtime.WasmtimeError) as e:  # ExitTrap too
            failure = e
        self._stderr_dropped(stdio.err_dropped)
        if stdio.overflow:  # (what ended the run: `fd_write` trapped)
            raise self._too_large()
        if failure is not None:  # (raised here, not in the except: no chained traceback)
            self._wasi_failed(failure, outcome, _memory_size(store, instance))
        return stdio.output()

    def _too_large(self) -> FunctionError:
        return FunctionError("bad_response", 502, f"wrote a response larger than the limit "
                             f"of {self.max_response} bytes (limits.max_response_mb)")

    def _wasi_failed(self, e: wasmtime.WasmtimeError | wasmtime.Trap, outcome: Outcome,
                     memory_size: int) -> None:
        """What ended `_start` early: returns for an exit with status 0, else raises
        `FunctionError`: a sleep inline (`SLICE_EXPIRED`, and the function moves to the
        threads), a sleep past the deadline, a nonzero exit, or a trap."""
        if isinstance(e, wasmtime.ExitTrap):
            if e.code != 0:
                raise FunctionError("trap", 500, f"exited with status {e.code}")
            return
        deadlines = self.wasm.deadlines
        # wasmtime-py reports a trap raised in a host function as either
        if deadlines.slept:
            self._to_threads(f"{deadlines.doing} (WASI)" if deadlines.doing != "sleeping"
                             else "sleeps (WASI poll_oneoff)")
            raise FunctionError(SLICE_EXPIRED, 503, f"{deadlines.doing} inline")
        if deadlines.expired:
            raise FunctionError("wall_limit", 504, f"exceeded its wall-time limit of "
                                f"{self.manifest.limits.wall_ms} ms ({deadlines.doing})")
        if isinstance(e, wasmtime.Trap):
            raise trap_error(e, "_start", outcome, memory_size)
        failed = binding_error(str(e), "_start")  # a host function's, as from a reactor
        if failed is not None:  # (it was a `trap` with a backtrace, its reason cut off)
            raise failed
        raise FunctionError("trap", 500, f"failed: {_short(str(e))}")

    def _stderr_dropped(self, dropped: int) -> None:
        if dropped:
            self.stderr.line(b"[%d more bytes of stderr dropped: at most %d a request]"
                             % (dropped, wasi_stdio.STDERR_MAX))

    def _log_stderr(self, data: bytes) -> None:
        for line in data.splitlines():
            self.stderr.line(line)


def _stoppable(stop: Stop, job: Callable[..., bytes], *args: object) -> bytes:
    """`job(*args)` on a worker thread, with `stop` as its binding calls' `current`."""
    with stopping(stop):
        return job(*args)


def _release(loop: asyncio.AbstractEventLoop, releases: tuple[Callable[[], None], ...],
             _: object) -> None:
    """A worker job ended (on its thread): give its slots back on the loop."""
    with contextlib.suppress(RuntimeError):  # the loop closed first: nobody waits any more
        for release in releases:
            loop.call_soon_threadsafe(release)


def _memory_size(store: wasmtime.Store, instance: object) -> int:
    if instance is None:
        return 0
    try:
        memory = instance.exports(store).get("memory")  # type: ignore[attr-defined]
        return memory.data_len(store) if isinstance(memory, wasmtime.Memory) else 0
    except Exception:
        return 0


def _describe(ty: object) -> str:
    if ty is None:
        return "none"
    if isinstance(ty, wasmtime.FuncType):
        params = ", ".join(str(p) for p in ty.params)
        results = ", ".join(str(r) for r in ty.results)
        return f"func ({params}) -> ({results})"
    return "memory" if isinstance(ty, wasmtime.MemoryType) else type(ty).__name__


def _short(text: str, name: str = "") -> str:
    """wasmtime's error on one line: its first five lines that say something (a bare
    gutter `|` does not), `<anon>` named `name`. Five keep both a WAT error's source
    line and a compile error's cause ("Caused by: ... type mismatch ...")."""
    lines = [line.strip() for line in text.strip().splitlines()]
    said = [line for line in lines if line and line != "|"]
    out = " | ".join(said[:5])
    return out.replace("<anon>", name) if name else out


def _origin(request: Request, principal: Mapping[str, str]) -> Origin:
    """What the function's host calls carry of the request: its ``traceparent``
    (the tracing stage's span when tracing is on), the caller's tenant and its
    ``CDN-Loop`` (in a `Lineage` of its own: its fetches share one tree)."""
    value = request.header(b"traceparent")
    return Origin(value.decode("latin-1") if value is not None else None,
                  principal.get("tenant"), Lineage(cdn_loop(request.headers)))


_INCOMPATIBLE = re.compile(r"incompatible import type for `(?P<name>[^`]*)`\s*Caused by:\s*"
                           r"types incompatible: expected type `(?P<mine>[^`]*)`, "
                           r"found type `(?P<ours>[^`]*)`")


def _link_error(message: str) -> str:
    """wasmtime's link error, said from the module's side: its "expected" is the
    module's import, "found" what edgefn defines (which read backwards to an author)."""
    m = _INCOMPATIBLE.search(message)
    if m is None:
        return message
    return (f"it imports `{m['name']}` as `{m['mine']}`, but edgefn's `{m['name']}` is "
            f"`{m['ours']}`")
