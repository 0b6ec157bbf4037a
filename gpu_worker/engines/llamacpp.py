"""The llama.cpp engine: GGUF chat and completion models with continuous batching
and per-request LoRA adapters.

This module is the engine's event-loop side: it loads the model, checks and
tokenizes requests, and posts them to the scheduler thread. The parts:

- `batching`: the policy (admission by KV use, FIFO, preemption when the KV
  cache fills or a slow reader holds a slot others wait for, chunked prefill
  within a per-step token budget, credit, adapter groups);
- `llama_driver`: the scheduler thread that runs that policy over the model,
  one step after another, and hands output back to the loop;
- `llama_model`: the native llama.cpp calls.

Each step admits waiting requests into free sequence slots (FIFO, while their
prompt fits in the KV cache next to what the running ones use; a sequence that
outgrows the cache preempts another, recomputed later), then runs one decode per
adapter group: every running sequence gets one new token per step, and prompts
are fed in chunks within a per-step token budget so a long prompt never stalls
the streams already running. Requests join and leave the batch between steps.

llama.cpp applies LoRA adapters to a whole context, not per sequence, so a step
decodes each adapter's sequences in their own call (the adapter is switched in
between). Mixed-adapter load therefore costs one decode call per adapter per
step; bench/bench_ai.py measures what that costs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from edgefn_core.errors import EngineError

from ..models import converted, packaged_model
from ..protocol import DEFAULT_MAX_TOKENS, Generate
from . import Engine, ModelInfo, Sink
from .batching import Scheduler, Seq, seq_ids_for, shaping_of
from .grammar_cache import Grammars
from .llama_driver import Driver, LoadAdapter, UnloadAdapter
from .llama_model import LlamaModel, content_text
from .tool_prompt import with_tools

if TYPE_CHECKING:
    from ..config import ModelSpec
    from ..metrics import Metrics
    from ..protocol import CountTokens

MAX_STOPS = 4
MAX_TOP_LOGPROBS = 20  # as OpenAI


class LlamaEngine(Engine):
    """One GGUF model (and its LoRA adapters) served by one scheduler thread."""

    kind = "llamacpp"

    def __init__(self, spec: ModelSpec, metrics: Metrics) -> None:
        self.spec = spec
        self.metrics = metrics
        self.lm: LlamaModel | None = None
        self.driver: Driver | None = None
        self.loras: dict[str, tuple[str, float]] = {}

    async def start(self) -> None:
        """Load the model and start the scheduler thread. Raises `EngineError` if
        the model file is missing or llama.cpp cannot load it."""
        source = packaged_model() if self.spec.path == "auto" else Path(self.spec.path)
        if not source.is_file():
            raise EngineError("invalid_config", 500, f"model file {source} does not exist")
        path = await asyncio.to_thread(converted, source, self.spec.weights)
        ids = seq_ids_for(self.spec.max_batch)  # batch slots, and as many to park cells in
        self.lm = await asyncio.to_thread(LlamaModel, path, self.spec.context, ids,
                                          self.spec.threads, self.spec.gpu_layers)
        self.path = source
        self.limit = min(self.lm.n_ctx, self.lm.n_ctx_train or self.lm.n_ctx)
        self.grammars = Grammars(self.lm.check_grammar)
        sched = Scheduler(self.spec.max_batch, self.lm.n_ctx,
                          max_wait=self.spec.max_queue_seconds or None, seq_ids=ids,
                          prefill_chunk=self.spec.prefill_chunk)
        self.driver = Driver(self.lm, sched, self.metrics, f"llama-{self.spec.name}")
        self.driver.start()

    def models(self) -> list[ModelInfo]:
        assert self.lm is not None
        file = self.path.stat()  # its identity: the API's created and system_fingerprint
        base = ModelInfo(self.spec.name, "chat", self.kind, details={
            "file": self.path.name, "bytes": file.st_size, "mtime": int(file.st_mtime),
            "weights": self.spec.weights, "context": self.limit,
            "max_batch": self.spec.max_batch, "device": "gpu" if self.lm.gpu else "cpu"})
        return [base, *(ModelInfo(name, "chat", self.kind, parent=self.spec.name,
                                  details={"path": path, "scale": scale, **_identity(path)})
                        for name, (path, scale) in self.loras.items())]

    def generate(self, req: Generate, sink: Sink) -> None:
        """Queue a generation. Raises `EngineError` for bad parameters, an unknown
        adapter, an empty prompt or a prompt that does not fit the context."""
        assert self.lm is not None and self.driver is not None
        _check_params(req)
        _check_shaping(req, self.lm.n_vocab)
        adapter = None if req.model == self.spec.name else req.model
        if adapter is not None and adapter not in self.loras:
            raise EngineError("model_not_found", 404, f"model {req.model!r} does not exist")
        prompt = self._tokenize(req)
        if req.max_tokens is None:  # no cap asked for: the default, within what the context leaves
            req = msgspec.structs.replace(
                req, max_tokens=min(DEFAULT_MAX_TOKENS, self.limit - len(prompt)))
        grammar = self.grammars.for_request(req)
        scale = self.loras[adapter][1] if adapter else 1.0
        self.driver.mailbox.post_seq(Seq(req, sink, prompt, adapter, scale,
                                         shaping_of(req, grammar)))

    def _tokenize(self, req: Generate) -> list[int]:
        """The prompt's tokens. Raises `EngineError` for an empty prompt, messages the
        chat template refuses, or a prompt plus ``max_tokens`` over the context
        (without ``max_tokens``: a prompt that leaves no room for a token)."""
        prompt = self._prompt(req)
        if req.max_tokens is None:
            if len(prompt) >= self.limit:
                raise EngineError("context_length_exceeded", 400, f"this model's context is "
                                  f"{self.limit} tokens; the prompt has {len(prompt)}, "
                                  "which leaves none to generate")
        elif len(prompt) + req.max_tokens > self.limit:
            raise EngineError("context_length_exceeded", 400, f"this model's context is "
                              f"{self.limit} tokens; the prompt has {len(prompt)} and "
                              f"max_tokens asks for {req.max_tokens} more")
        return prompt

    def _prompt(self, req: Generate | CountTokens) -> list[int]:
        """Raises `EngineError` for an empty prompt, messages the template refuses, or
        text longer than the context could hold however it tokenized (refused before
        tokenizing it: megabytes of text held the worker's loop for seconds)."""
        assert self.lm is not None
        if req.messages is not None:
            tools = req.tools if isinstance(req, Generate) and req.tool_choice != "none" else None
            messages = with_tools(req.messages, tools)
            if len(messages) > self.limit:  # each message takes a token at least
                raise EngineError("context_length_exceeded", 400, f"this model's context is "
                                  f"{self.limit} tokens; the chat has {len(messages)} messages")
            texts = [content_text(m.get("content")) for m in messages]
            self._fits(sum(len(t.encode()) for t in texts if isinstance(t, str)))
            tokens = self.lm.tokenize_chat(messages)
            if not tokens:
                raise EngineError("invalid_request", 400, "the prompt is empty")
            return tokens
        if not req.prompt:
            raise EngineError("invalid_request", 400, "the prompt is empty")
        self._fits(len(req.prompt.encode()))
        return self.lm.tokenize(req.prompt)

    def _fits(self, size: int) -> None:
        """Raises `EngineError` (context_length_exceeded) for `size` bytes of text that
        no tokenization fits in the context."""
        assert self.lm is not None
        most = self.limit * self.lm.max_token_bytes
        if size > most:
            raise EngineError("context_length_exceeded", 400, f"this model's context is "
                              f"{self.limit} tokens; the prompt's {size} bytes of text are "
                              f"more than that many tokens can hold ({most} bytes)")

    async def count_tokens(self, req: CountTokens) -> int:
        """The prompt's tokens, exactly as a generation counts them (``prompt_tokens``).
        Raises `EngineError` as `generate` does for the prompt, model_not_found for
        an unknown adapter, and invalid_request for texts to embed (``input``)."""
        if req.model != self.spec.name and req.model not in self.loras:
            raise EngineError("model_not_found", 404, f"model {req.model!r} does not exist")
        if req.inputs is not None:
            raise EngineError("invalid_request", 400, f"{req.model} generates text: count "
                              "its 'prompt' or 'messages' ('input' is an embedding model's)")
        return len(self._prompt(req))

    def cancel(self, rid: int) -> None:
        if self.driver is not None:
            self.driver.mailbox.post_cancel(rid)

    def credit(self, rid: int, n: int) -> None:
        if self.driver is not None:
            self.driver.mailbox.post_credit(rid, n)

    async def add_lora(self, name: str, path: str, base: str | None, scale: float
                       ) -> ModelInfo:
        """Load a GGUF LoRA adapter for this model, served as model `name`. Raises
        `EngineError` for a missing file, a file llama.cpp refuses, or a name in use."""
        if base not in (None, self.spec.name):
            raise EngineError("invalid_request", 400, f"engine for {self.spec.name!r} cannot take "
                              f"an adapter for {base!r}")
        if name == self.spec.name or name in self.loras:
            raise EngineError("invalid_request", 400, f"model name {name!r} is already in use")
        assert self.driver is not None
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.driver.mailbox.post_command(LoadAdapter(name, path, done))
        await done
        self.loras[name] = (path, scale)
        return next(m for m in self.models() if m.id == name)

    async def remove_lora(self, name: str) -> None:
        """Stop serving adapter `name`: new requests cannot use it, running ones
        finish on it (llama.cpp frees it with the model). Raises `EngineError` (400)
        for the base model."""
        if name not in self.loras:
            raise EngineError("invalid_request", 400, f"{name!r} is a base model, not a LoRA "
                              "adapter")
        del self.loras[name]
        if self.driver is not None:  # unloaded once no sequence uses it
            self.driver.mailbox.post_command(UnloadAdapter(name))

    def close(self) -> None:
        """Stop the scheduler thread (up to 10 s) and free the model."""
        if self.driver is not None:
            self.driver.stop()
        if self.lm is not None:
            self.lm.close()
            self.lm = None


def _check_params(req: Generate) -> None:
    """Raises `EngineError` naming the first parameter out of range."""
    if req.max_tokens is not None and not 1 <= req.max_tokens <= 1_000_000:
        raise EngineError("invalid_request", 400,
                          f"max_tokens must be between 1 and 1000000, got {req.max_tokens}")
    if not 0 <= req.temperature <= 2:
        raise EngineError("invalid_request", 400, f"temperature must be between 0 and 2, got "
                          f"{req.temperature}")
    if not 0 <= req.top_p <= 1:  # OpenAI's range; 0 keeps the likeliest token (min_keep 1)
        raise EngineError("invalid_request", 400, f"top_p must be in [0, 1], got {req.top_p!r}")
    if req.top_k < 0:
        raise EngineError("invalid_request", 400, f"top_k must be 0 (off) or more, got {req.top_k}")
    if len(req.stop) > MAX_STOPS:
        raise EngineError("invalid_request", 400, f"at most {MAX_STOPS} stop sequences, got "
                          f"{len(req.stop)}")
    if req.window < 1:
        raise EngineError("invalid_request", 400, "window must be at least 1")


def _check_shaping(req: Generate, n_vocab: int) -> None:
    """Raises `EngineError` naming the first sampling field out of range: penalties
    in [-2, 2], logit bias values in [-100, 100] on token ids the model has,
    top logprobs in [0, 20]."""
    for name in ("presence_penalty", "frequency_penalty"):
        if not -2 <= getattr(req, name) <= 2:
            raise EngineError("invalid_request", 400, f"{name} must be between -2 and 2, "
                              f"got {getattr(req, name)}")
    for token, bias in req.logit_bias.items():
        if not 0 <= token < n_vocab:
            raise EngineError("invalid_request", 400, f"logit_bias: token {token} is not in "
                              f"this model's vocabulary (0..{n_vocab - 1})")
        if not -100 <= bias <= 100:
            raise EngineError("invalid_request", 400, f"logit_bias: the bias of token {token} "
                              f"must be between -100 and 100, got {bias}")
    if req.logprobs is not None and not 0 <= req.logprobs <= MAX_TOP_LOGPROBS:
        raise EngineError("invalid_request", 400, f"top_logprobs must be between 0 and "
                          f"{MAX_TOP_LOGPROBS}, got {req.logprobs}")


def _identity(path: str) -> dict[str, int]:
    """An adapter file's size and mtime (the API's ``created``; with them, another file
    under the same name has another fingerprint); none for a file gone since it loaded."""
    try:
        st = Path(path).stat()
    except OSError:
        return {}
    return {"bytes": st.st_size, "mtime": int(st.st_mtime)}
