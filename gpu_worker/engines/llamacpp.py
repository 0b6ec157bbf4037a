"""The llama.cpp engine: GGUF chat and completion models with continuous batching
and per-request LoRA adapters.

One scheduler thread owns the model. Each step it admits waiting requests into
free sequence slots (FIFO, while their prompt plus ``max_tokens`` fits in the
KV cache), then runs one decode per adapter group: every running sequence gets
one new token per step, and prompts are fed in chunks within a per-step token
budget so a long prompt never stalls the streams already running. Requests join
and leave the batch between steps.

llama.cpp applies LoRA adapters to a whole context, not per sequence, so a step
decodes each adapter's sequences in their own call (the adapter is switched in
between). Mixed-adapter load therefore costs one decode call per adapter per
step; bench/bench_ai.py measures what that costs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..models import converted, packaged_model
from ..stops import StopText
from . import Engine, EngineError, ModelInfo, Sink
from .llama_model import LlamaModel

if TYPE_CHECKING:
    from ..config import ModelSpec
    from ..metrics import Metrics
    from ..protocol import Generate

log = logging.getLogger("edgefn.gpu_worker.llamacpp")
STEP_TOKENS = 512  # tokens per decode call (llama.cpp's n_batch)
MAX_STOPS = 4


class Seq:
    """One generation: its prompt, sampler, KV slot and output state."""

    def __init__(self, req: Generate, sink: Sink, prompt: list[int], adapter: str | None,
                 scale: float) -> None:
        self.rid = req.id
        self.sink = sink
        self.prompt = prompt
        self.adapter = adapter
        self.scale = scale
        self.max_tokens = req.max_tokens
        self.temperature, self.top_p, self.top_k = req.temperature, req.top_p, req.top_k
        self.seed = req.seed if req.seed is not None else random.getrandbits(32)
        self.stop = StopText(req.stop)
        self.credit = req.window  # chunks it may send before the client reads them
        self.slot = -1
        self.fed = 0  # prompt tokens decoded so far
        self.pos = 0
        self.last = 0  # the token to decode next
        self.generated = 0
        self.sampler: Any = None
        self.submitted = self.last_token_at = time.perf_counter()

    @property
    def reserve(self) -> int:
        return len(self.prompt) + self.max_tokens


class LlamaEngine(Engine):
    kind = "llamacpp"

    def __init__(self, spec: ModelSpec, metrics: Metrics) -> None:
        self.spec = spec
        self.metrics = metrics
        self.lm: LlamaModel | None = None
        self.loras: dict[str, tuple[str, float]] = {}
        self.cond = threading.Condition()
        self.inbox: list[Seq] = []
        self.cancels: set[int] = set()
        self.credits: dict[int, int] = {}
        self.commands: list[tuple[str, str, float, asyncio.Future[None]]] = []
        self.waiting: deque[Seq] = deque()
        self.running: dict[int, Seq] = {}
        self.free_slots = list(range(spec.max_batch))
        self.reserved = 0
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- loop side ------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the model (and configured adapters) and start the scheduler thread.
        Raises `EngineError`."""
        self.loop = asyncio.get_running_loop()
        source = packaged_model() if self.spec.path == "auto" else Path(self.spec.path)
        if not source.is_file():
            raise EngineError("invalid_config", f"model file {source} does not exist", 500)
        path = await asyncio.to_thread(converted, source, self.spec.weights)
        self.lm = await asyncio.to_thread(LlamaModel, path, self.spec.context,
                                          self.spec.max_batch, self.spec.threads,
                                          self.spec.gpu_layers)
        self.path = source
        self.limit = min(self.lm.n_ctx, self.lm.n_ctx_train or self.lm.n_ctx)
        self.thread = threading.Thread(target=self._run, name=f"llama-{self.spec.name}",
                                       daemon=True)
        self.thread.start()

    def models(self) -> list[ModelInfo]:
        assert self.lm is not None
        base = ModelInfo(self.spec.name, "chat", self.kind, details={
            "file": self.path.name, "weights": self.spec.weights, "context": self.limit,
            "max_batch": self.spec.max_batch, "device": "gpu" if self.lm.gpu else "cpu"})
        return [base, *(ModelInfo(name, "chat", self.kind, parent=self.spec.name,
                                  details={"path": path, "scale": scale})
                        for name, (path, scale) in self.loras.items())]

    def generate(self, req: Generate, sink: Sink) -> None:
        """Queue a generation. Raises `EngineError` for bad parameters or a prompt
        that does not fit the context."""
        assert self.lm is not None
        _check_params(req)
        adapter = None if req.model == self.spec.name else req.model
        if adapter is not None and adapter not in self.loras:
            raise EngineError("model_not_found", f"model {req.model!r} does not exist", 404)
        text = self.lm.render_chat(req.messages) if req.messages is not None else req.prompt
        if not text:
            raise EngineError("invalid_request", "the prompt is empty")
        prompt = self.lm.tokenize(text)
        if len(prompt) + req.max_tokens > self.limit:
            raise EngineError("context_length_exceeded", f"this model's context is "
                              f"{self.limit} tokens; the prompt has {len(prompt)} and "
                              f"max_tokens asks for {req.max_tokens} more")
        scale = self.loras[adapter][1] if adapter else 1.0
        with self.cond:
            self.inbox.append(Seq(req, sink, prompt, adapter, scale))
            self.cond.notify()

    def cancel(self, rid: int) -> None:
        with self.cond:
            self.cancels.add(rid)
            self.cond.notify()

    def credit(self, rid: int, n: int) -> None:
        with self.cond:
            self.credits[rid] = self.credits.get(rid, 0) + n
            self.cond.notify()

    async def add_lora(self, name: str, path: str, base: str | None, scale: float
                       ) -> ModelInfo:
        """Load a GGUF LoRA adapter for this model, served as model `name`. Raises
        `EngineError` for a missing file, a file llama.cpp refuses, or a name in use."""
        if base not in (None, self.spec.name):
            raise EngineError("invalid_request", f"engine for {self.spec.name!r} cannot take "
                              f"an adapter for {base!r}")
        if name == self.spec.name or name in self.loras:
            raise EngineError("invalid_request", f"model name {name!r} is already in use")
        assert self.loop is not None
        done: asyncio.Future[None] = self.loop.create_future()
        with self.cond:
            self.commands.append((name, path, scale, done))
            self.cond.notify()
        await done
        return next(m for m in self.models() if m.id == name)

    def close(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify()
        if self.thread is not None:
            self.thread.join(10)
        if self.lm is not None:
            self.lm.close()
            self.lm = None

    # -- scheduler thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._take():
                self._admit()
                active = [s for s in self.running.values() if s.credit > 0]
                if not active:
                    self.metrics.idle(len(self.waiting))
                    continue
                groups: dict[str | None, list[Seq]] = {}
                for s in active:
                    groups.setdefault(s.adapter, []).append(s)
                for group in groups.values():
                    self._step(group)
        except BaseException:
            log.exception("llama.cpp scheduler failed; the worker exits so it is restarted")
            os._exit(70)

    def _take(self) -> bool:
        """Wait for work, then move everything the loop sent into scheduler state.
        Returns False when the engine is closing."""
        with self.cond:
            while not (self.inbox or self.cancels or self.commands or self.stopping
                       or self.credits or (self.waiting and self.free_slots)
                       or any(s.credit > 0 for s in self.running.values())):
                self.cond.wait()
            if self.stopping:
                return False
            inbox, self.inbox = self.inbox, []
            cancels, self.cancels = self.cancels, set()
            credits, self.credits = self.credits, {}
            commands, self.commands = self.commands, []
        self.waiting.extend(inbox)
        for s in inbox:
            self.metrics.request(len(s.prompt))
        for rid, n in credits.items():
            if rid in self.running:
                self.running[rid].credit += n
        for rid in cancels:
            self._cancel(rid)
        for command in commands:
            self._load_adapter(*command)
        return True

    def _cancel(self, rid: int) -> None:
        if rid in self.running:
            self._finish(self.running[rid], "cancelled")
            return
        for s in self.waiting:
            if s.rid == rid:
                self.waiting.remove(s)
                self._send(s.sink.done, "cancelled", len(s.prompt), 0)
                return

    def _load_adapter(self, name: str, path: str, scale: float, done: asyncio.Future[None]
                      ) -> None:
        assert self.lm is not None
        try:
            self.lm.load_adapter(name, path)
        except EngineError as e:
            self._send(_resolve, done, e)
            return
        self.loras[name] = (path, scale)
        self._send(_resolve, done, None)

    def _admit(self) -> None:
        assert self.lm is not None
        while self.waiting and self.free_slots:
            s = self.waiting[0]
            if self.running and self.reserved + s.reserve > self.lm.n_ctx:
                return  # FIFO: later requests wait behind it rather than overtake
            self.waiting.popleft()
            s.slot = self.free_slots.pop()
            s.sampler = self.lm.sampler(s.temperature, s.top_p, s.top_k, s.seed)
            self.reserved += s.reserve
            self.running[s.rid] = s

    def _step(self, group: list[Seq]) -> None:
        """One decode call for sequences that share an adapter."""
        lm = self.lm
        assert lm is not None
        items: list[tuple[int, int, int, bool]] = []
        outputs: list[tuple[Seq, int]] = []
        for s in group:
            if s.fed == len(s.prompt):
                outputs.append((s, len(items)))
                items.append((s.last, s.pos, s.slot, True))
                s.pos += 1
        for s in group:
            room = STEP_TOKENS - len(items)
            if s.fed == len(s.prompt) or room <= 0:
                continue
            chunk = s.prompt[s.fed:s.fed + room]
            for tok in chunk:
                s.fed += 1
                last = s.fed == len(s.prompt)
                if last:
                    outputs.append((s, len(items)))
                items.append((tok, s.pos, s.slot, last))
                s.pos += 1
        lm.use_adapter(group[0].adapter, group[0].scale)
        started = time.perf_counter()
        rc = lm.decode(items)
        took = time.perf_counter() - started
        if rc != 0:
            for s in group:
                self._fail(s, f"llama_decode failed with status {rc}")
            return
        for s, index in outputs:
            self._token(s, lm.sample(s.sampler, index))
        self.metrics.step(len(self.waiting), len(self.running), took, len(outputs))

    def _token(self, s: Seq, tok: int) -> None:
        assert self.lm is not None
        now = time.perf_counter()
        if s.generated == 0:
            self.metrics.first_token(now - s.submitted)
        else:
            self.metrics.inter_token(now - s.last_token_at)
        s.last_token_at = now
        s.generated += 1
        if self.lm.is_eog(tok):
            self._finish(s, "stop")
            return
        self._emit(s, s.stop.feed(self.lm.piece_bytes(tok)))
        if s.stop.stopped:
            self._finish(s, "stop")
        elif s.generated >= s.max_tokens:
            self._finish(s, "length")
        else:
            s.last = tok

    def _emit(self, s: Seq, text: str) -> None:
        if text:
            s.credit -= 1
            self._send(s.sink.chunk, text, 1)

    def _release(self, s: Seq) -> None:
        assert self.lm is not None
        del self.running[s.rid]
        self.lm.forget(s.slot)
        self.lm.free_sampler(s.sampler)
        self.free_slots.append(s.slot)
        self.reserved -= s.reserve

    def _finish(self, s: Seq, reason: str) -> None:
        if reason != "cancelled":
            self._emit(s, s.stop.flush())
        self._release(s)
        self._send(s.sink.done, reason, len(s.prompt), s.generated)

    def _fail(self, s: Seq, message: str) -> None:
        self._release(s)
        self.metrics.request(error=True)
        self._send(s.sink.error, "internal", message, 500)

    def _send(self, fn: Any, *args: Any) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(fn, *args)


def _resolve(fut: asyncio.Future[None], exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)


def _check_params(req: Generate) -> None:
    """Raises `EngineError` naming the first parameter out of range."""
    if not 1 <= req.max_tokens <= 1_000_000:
        raise EngineError("invalid_request", f"max_tokens must be at least 1, got {req.max_tokens}")
    if not 0 <= req.temperature <= 2:
        raise EngineError("invalid_request", f"temperature must be between 0 and 2, got "
                          f"{req.temperature}")
    if not 0 < req.top_p <= 1:
        raise EngineError("invalid_request", f"top_p must be in (0, 1], got {req.top_p}")
    if req.top_k < 0:
        raise EngineError("invalid_request", f"top_k must be 0 (off) or more, got {req.top_k}")
    if len(req.stop) > MAX_STOPS:
        raise EngineError("invalid_request", f"at most {MAX_STOPS} stop sequences, got "
                          f"{len(req.stop)}")
    if req.window < 1:
        raise EngineError("invalid_request", "window must be at least 1")
