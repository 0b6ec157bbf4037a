"""The llama.cpp engine's scheduler thread: it owns the model, runs the batching
policy (`batching.Scheduler`) step after step, and hands output back to the
event loop.

The event loop never touches the model or the scheduler: it posts new
sequences, cancels, credit and adapter loads to a `Mailbox`, which the thread
drains between steps. Output goes back with ``loop.call_soon_threadsafe`` to
each sequence's sink.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from edgefn_core.errors import EngineError

from .batching import Item, Scheduler, Seq, Shaping

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..metrics import Metrics
    from ..protocol import TokenLogprob

log = logging.getLogger("edgefn.gpu_worker.llamacpp")


class Model(Protocol):
    """What the driver needs of a model (`llama_model.LlamaModel` in production)."""

    def sampler(self, temperature: float, top_p: float, top_k: int, seed: int,
                shaping: Shaping | None = None) -> Any: ...

    def logprob(self, index: int, token: int, top: int, bias: dict[int, float]
                ) -> TokenLogprob: ...

    def free_sampler(self, sampler: Any) -> None: ...

    per_seq: bool  # whether one decode call may mix adapters (`use_adapters`)

    def use_adapter(self, name: str | None, scale: float) -> None: ...

    def use_adapters(self, seqs: list[tuple[int, str | None, float]]) -> None: ...

    def decode(self, items: list[Item]) -> int: ...

    def sample(self, sampler: Any, index: int) -> int: ...

    def is_eog(self, token: int) -> bool: ...

    def piece_bytes(self, token: int) -> bytes: ...

    def forget(self, seq: int) -> None: ...

    def load_adapter(self, name: str, path: str) -> None: ...

    def unload_adapter(self, name: str) -> None: ...


class LoadAdapter(NamedTuple):
    """Load LoRA adapter `name` from `path`; `done` resolves on the event loop."""

    name: str
    path: str
    done: asyncio.Future[None]


class UnloadAdapter(NamedTuple):
    """Stop carrying adapter `name` in per-sequence steps, once no sequence uses it."""

    name: str


type Command = LoadAdapter | UnloadAdapter


class Mail(NamedTuple):
    """Everything the loop posted since the thread last looked."""

    seqs: list[Seq]
    cancels: set[int]
    credits: dict[int, int]
    commands: list[Command]


class Mailbox:
    """Thread-safe hand-off from the event loop to the scheduler thread."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.seqs: list[Seq] = []
        self.cancels: set[int] = set()
        self.credits: dict[int, int] = {}
        self.commands: list[Command] = []
        self.stopping = False

    def post_seq(self, s: Seq) -> None:
        with self.cond:
            self.seqs.append(s)
            self.cond.notify()

    def post_cancel(self, rid: int) -> None:
        with self.cond:
            self.cancels.add(rid)
            self.cond.notify()

    def post_credit(self, rid: int, n: int) -> None:
        with self.cond:
            self.credits[rid] = self.credits.get(rid, 0) + n
            self.cond.notify()

    def post_command(self, command: Command) -> None:
        with self.cond:
            self.commands.append(command)
            self.cond.notify()

    def post_stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify()

    def take(self, busy: Callable[[], bool],
             wake_at: Callable[[], float | None] = lambda: None) -> Mail | None:
        """Wait until there is mail, `busy()` is true or the ``perf_counter`` time
        `wake_at()` comes, then empty the box (perhaps empty). Returns None once a
        stop was posted."""
        with self.cond:
            while not (self.seqs or self.cancels or self.commands or self.stopping
                       or self.credits or busy()):
                at = wake_at()
                if at is None:
                    self.cond.wait()
                elif (left := at - time.perf_counter()) > 0:
                    self.cond.wait(left)
                else:
                    break
            if self.stopping:
                return None
            mail = Mail(self.seqs, self.cancels, self.credits, self.commands)
            self.seqs, self.cancels, self.credits, self.commands = [], set(), {}, []
            return mail


# A step (admission and one decode per group, sampling included) running longer than
# this is wedged inside llama.cpp, where nothing can stop it: the worker exits so its
# supervisor restarts it. The worker's loop still answers pings meanwhile (the native
# calls release the GIL): a grammar whose walk exploded held every request for 17
# minutes, unseen. Steps take milliseconds, a long prefill on a loaded CPU seconds.
STEP_LIMIT = 60.0


def _exit_wedged(seconds: float) -> None:
    log.critical("a llama.cpp scheduler step has run for %.0f s; the worker exits so it "
                 "is restarted", seconds)
    os._exit(70)


class Driver:
    """Runs `sched` over `lm` on its own thread; create it on the event loop."""

    def __init__(self, lm: Model, sched: Scheduler, metrics: Metrics, name: str,
                 step_limit: float = STEP_LIMIT,
                 on_wedged: Callable[[float], None] = _exit_wedged) -> None:
        """`on_wedged(seconds)` is called (once, from a watchdog thread) when a step
        has run `step_limit` seconds."""
        self.lm = lm
        self.sched = sched
        self.metrics = metrics
        self.mailbox = Mailbox()
        self.retiring: set[str] = set()  # adapters removed, unloaded once no sequence uses them
        self.recomputed = 0  # `sched.recomputed` as last counted in `metrics`
        self.loop = asyncio.get_running_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.step_started = 0.0  # perf_counter() when the step under way began; 0: none
        self.step_limit, self.on_wedged = step_limit, on_wedged
        self.stopped = threading.Event()
        self.watchdog = threading.Thread(target=self._watch, name=f"{name}-watchdog",
                                         daemon=True)

    def start(self) -> None:
        self.thread.start()
        self.watchdog.start()

    def stop(self, timeout: float = 10) -> None:
        """Ask the thread to stop and wait up to `timeout` seconds for it; sequences
        still queued or running get no further sink call."""
        self.stopped.set()
        self.mailbox.post_stop()
        if self.thread.is_alive():
            self.thread.join(timeout)

    def _watch(self) -> None:
        """The watchdog thread: `on_wedged` once a step has run `step_limit` seconds."""
        while not self.stopped.wait(min(5.0, self.step_limit / 4)):
            started = self.step_started
            if started and (ran := time.perf_counter() - started) >= self.step_limit:
                self.on_wedged(ran)
                return

    # -- scheduler thread -----------------------------------------------------------------
    def _run(self) -> None:
        """The thread's body. Any exception ends the process (exit status 70) so the
        worker's supervisor restarts it with a fresh model."""
        try:
            while self._take():
                self.step_started = time.perf_counter()
                self._iterate()
                self.step_started = 0.0
        except BaseException:
            log.exception("llama.cpp scheduler failed; the worker exits so it is restarted")
            os._exit(70)

    def _iterate(self) -> None:
        """Preempt sequences paused for credit that the queue waits on, and those of
        the clients using most for a client using less (`Scheduler.rebalance`), admit what
        fits, preempt what the next step's tokens do not leave room for, then one
        decode call per adapter group."""
        self._preempted(self.sched.evict_paused(time.perf_counter()))
        self._preempted(self.sched.rebalance())
        for s in self.sched.admit():
            if s.sampler is not None:  # preempted before: its sampler's state goes on
                continue
            try:
                s.sampler = self.lm.sampler(s.temperature, s.top_p, s.top_k, s.seed, s.shaping)
            except EngineError as e:  # e.g. a grammar llama.cpp refuses: this request only
                self.sched.release(s)
                self._send(s.sink.error, e.code, str(e), e.status)
        self._preempted(self.sched.make_room())
        for slot in self.sched.take_dropped():  # before a decode may need their cells
            self.lm.forget(slot)
        if self.sched.recomputed > self.recomputed:
            self.metrics.recomputed(self.sched.recomputed - self.recomputed)
            self.recomputed = self.sched.recomputed
        groups = self.sched.groups(self.lm.per_seq)
        if not groups:  # sequences paused for credit still hold their slots
            self.metrics.idle(len(self.sched.waiting), len(self.sched.running))
        # one call per adapter (a stock llama.cpp): a stream in one group waits for
        # the others' calls too, so their prompts are chunked as if it were theirs
        sampling = len(groups) > 1 and any(s.prefilled for g in groups for s in g)
        for group in groups:
            self._step(group, sampling)
        self._retire()

    def _preempted(self, preempted: list[Seq]) -> None:
        """Count sequences taken out of the batch. Their cells stay (parked) until
        the scheduler drops them (`Scheduler.take_dropped`); their samplers are
        kept either way, so a resumed sequence samples as if never stopped."""
        for s in preempted:
            self.metrics.preempted()
            log.debug("request %d preempted after %d tokens (%d waiting)", s.rid,
                      s.generated, len(self.sched.waiting))

    def _take(self) -> bool:
        """Wait for work, then apply what the loop posted. Returns False when stopping."""
        mail = self.mailbox.take(self.sched.has_work, self.sched.next_wake)
        if mail is None:
            return False
        self.sched.add(mail.seqs)
        for s in mail.seqs:
            self.metrics.request(s.prompt_tokens)
        self._turn_away(self.sched.overdue(time.perf_counter()))
        for rid, n in mail.credits.items():
            self.sched.credit(rid, n)
        for rid in mail.cancels:
            self._cancel(rid)
        for command in mail.commands:
            if isinstance(command, UnloadAdapter):
                self.retiring.add(command.name)
            else:
                self.retiring.discard(command.name)  # added again under its old name
                self._load_adapter(command)
        self._retire()
        return True

    def _retire(self) -> None:
        """Unload each removed adapter that no running or waiting sequence uses: a
        per-sequence step carries every loaded adapter's rows, so a removed one kept
        costing every mixed step."""
        if not self.retiring:
            return
        used = {s.adapter for s in (*self.sched.running.values(), *self.sched.waiting)}
        for name in [n for n in self.retiring if n not in used]:
            self.retiring.discard(name)
            self.lm.unload_adapter(name)

    def _turn_away(self, overdue: list[Seq]) -> None:
        """503 ``overloaded`` to each sequence that waited its longest for a slot, or,
        where a slot is free, for room in the KV cache (the message says which):
        the OpenAI API answers it with ``Retry-After`` (clients retry), and the
        ``[ai] fallback`` model or a stale cached answer may serve it instead."""
        sched = self.sched
        for s in overdue:
            self.metrics.failed()  # counted once, at `_take`
            if len(sched.running) < sched.slots:  # a slot is free: the KV cache held it back
                why = (f"no room in its KV cache came free within {sched.max_wait:g} s for "
                       f"a {s.prompt_tokens}-token prompt ({sched.in_use} of its "
                       f"{sched.kv_tokens} tokens held by {len(sched.running)} running, "
                       f"{len(sched.waiting)} requests still waiting)")
            else:
                why = (f"no batch slot came free within {sched.max_wait:g} s "
                       f"({len(sched.waiting)} requests still waiting, {len(sched.running)} "
                       "running)")
            self._send(s.sink.error, "overloaded", f"the model is busy: {why}; retry later",
                       503)

    def _cancel(self, rid: int) -> None:
        if rid in self.sched.running:
            self._finish(self.sched.running[rid], "cancelled")
        elif (s := self.sched.unqueue(rid)) is not None:
            if s.sampler is not None:  # preempted: its cells, if parked, go with the next step
                self.lm.free_sampler(s.sampler)
            self._send(s.sink.done, "cancelled", s.prompt_tokens, s.generated)

    def _load_adapter(self, command: LoadAdapter) -> None:
        try:
            self.lm.load_adapter(command.name, command.path)
        except EngineError as e:
            self._send(_resolve, command.done, e)
            return
        self._send(_resolve, command.done, None)

    def _step(self, group: list[Seq], sampling: bool = False) -> None:
        """One decode call for `group` (sequences that share an adapter, or any where
        the model selects adapters per sequence), then their tokens; `sampling`: a
        sequence of another group waits on this iteration for a token."""
        step = self.sched.plan(group, sampling)
        if self.lm.per_seq:
            self.lm.use_adapters([(s.slot, s.adapter, s.scale) for s in group])
        else:
            self.lm.use_adapter(group[0].adapter, group[0].scale)
        started = time.perf_counter()
        rc = self.lm.decode(step.items)
        took = time.perf_counter() - started
        if rc != 0:
            for s in group:
                self._fail(s, f"llama_decode failed with status {rc}")
            return
        for s, index in step.outputs:
            token = self.lm.sample(s.sampler, index)
            if s.logprobs is not None and not self.lm.is_eog(token):
                bias = s.shaping.logit_bias if s.shaping is not None else {}
                s.pending.append(self.lm.logprob(index, token, s.logprobs, bias))
            self._token(s, token)
        self.metrics.step(len(self.sched.waiting), len(self.sched.running), took,
                          len(step.outputs))

    def _token(self, s: Seq, token: int) -> None:
        now = time.perf_counter()
        if s.generated == 0:
            self.metrics.first_token(now - s.submitted)
        else:
            self.metrics.inter_token(now - s.last_token_at)
        s.last_token_at = now
        piece = None if self.lm.is_eog(token) else self.lm.piece_bytes(token)
        text, reason = s.advance(token, piece)
        if s.stop.stopped and s.pending:  # the stop string's tokens are not the answer's
            s.pending = covering(s.pending, text)
        self._emit(s, text)
        if reason is not None:
            self._finish(s, reason)

    def _emit(self, s: Seq, text: str) -> None:
        if not text:
            return
        s.spend(time.perf_counter())
        if s.logprobs is None:
            self._send(s.sink.chunk, text, 1)
        else:  # the logprobs of the tokens this text comes from
            self._send(s.sink.chunk, text, 1, s.pending)
            s.pending = []

    def _release(self, s: Seq) -> None:
        self.sched.release(s)
        self.lm.forget(s.slot)
        self.lm.free_sampler(s.sampler)

    def _finish(self, s: Seq, reason: str) -> None:
        if reason != "cancelled":
            self._emit(s, s.stop.flush())
        self._release(s)
        self._send(s.sink.done, reason, s.prompt_tokens, s.generated)

    def _fail(self, s: Seq, message: str) -> None:
        self._release(s)
        self.metrics.failed()  # counted once, at `_take`
        self._send(s.sink.error, "internal", message, 500)

    def _send(self, fn: Any, *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)


def covering(entries: list[TokenLogprob], text: str) -> list[TokenLogprob]:
    """The first of `entries` whose bytes make up `text` (a token that straddles
    its end included): what is left once a stop string cut the text short."""
    size = len(text.encode())
    out: list[TokenLogprob] = []
    for entry in entries:
        if size <= 0:
            break
        out.append(entry)
        size -= len(entry.token)
    return out


def _resolve(fut: asyncio.Future[None], exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)
