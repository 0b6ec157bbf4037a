"""Model engines behind one interface.

An engine serves one or more model ids. The worker (`gpu_worker.server`) routes
each request by its ``model`` to the engine that serves it. Engines are created
by `create()` from a `ModelSpec` in the worker config; `llamacpp`, `onnx` and
`openai` (an upstream OpenAI-compatible server) exist.

All methods are called on the worker's event loop. An engine that computes on
its own thread hands results back with ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from edgefn_core.errors import EngineError

# llama.cpp's CPU backend is built with OpenMP, whose threads by default spin at each
# barrier (hundreds a token) before they sleep. With another process busy on one of the
# cores, the thread being waited for is off its core and every barrier spins a whole
# time slice: a 24-token chat took 30-60 s instead of 0.6-1.1 s on 2 cores with one busy
# (and that is a PoP's normal state: the PoP, its isolates and the worker share them).
# Passive threads sleep on a futex, after BARRIER_SPINS spins (a few us): on a VM a
# sleeping thread's core halts, and waking it cost ~10 us a barrier, more than the
# step's work between two of them (SmolLM2-135M, 2 threads on an idle 2-core VM: one
# stream 43 tok/s sleeping at once, 109 spinning 1000 first; a spin of 300 already
# gave the whole gain), while a bounded spin wastes at most that much when the thread
# waited for is off its core. Set before any engine loads llama.cpp (libgomp reads them
# once, when loaded); what the user set stands (an OMP_WAIT_POLICY of theirs, with no
# GOMP_SPINCOUNT, keeps libgomp's own spin for that policy).
BARRIER_SPINS = 300
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.environ.setdefault("GOMP_SPINCOUNT", str(BARRIER_SPINS))

if TYPE_CHECKING:
    from ..config import ModelSpec
    from ..metrics import Metrics
    from ..protocol import CountTokens, Embed, Generate, Rerank, TokenLogprob


class ModelInfo(msgspec.Struct, omit_defaults=True):
    id: str
    kind: str  # "chat" | "embed" | "rerank"
    engine: str
    parent: str | None = None  # a LoRA adapter's base model
    details: dict[str, Any] = {}


class Sink(Protocol):
    """Where one generation's output goes; methods are called on the event loop."""

    def chunk(self, text: str, tokens: int, logprobs: list[TokenLogprob] | None = None
              ) -> None: ...

    def done(self, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> None: ...

    def error(self, code: str, message: str, status: int) -> None: ...


class Engine:
    """Base class: every operation not overridden is refused with a clear error."""

    kind = "?"

    def models(self) -> list[ModelInfo]:
        return []

    async def start(self) -> None:
        """Load models. Raises `EngineError` if they cannot load."""

    def generate(self, req: Generate, sink: Sink) -> None:
        """Start a generation; output goes to `sink`. Raises `EngineError`."""
        raise EngineError("invalid_request", 400, f"model {req.model!r} does not generate text")

    def cancel(self, rid: int) -> None:
        """Stop generation `rid` (the client went away); unknown ids are ignored."""

    def credit(self, rid: int, n: int) -> None:
        """The client consumed `n` more chunks of stream `rid`."""

    async def embed(self, model: str, inputs: list[str], client: str | None = None,
                    asked: Embed | None = None) -> tuple[list[list[float]], int]:
        """Embeddings and the number of tokens read; `client` asked (its fair share);
        `asked`: the request, whose request id and signed client an upstream engine
        passes on. Raises `EngineError`."""
        raise EngineError("invalid_request", 400, f"model {model!r} does not embed")

    async def rerank(self, model: str, query: str, documents: list[str],
                     client: str | None = None, asked: Rerank | None = None
                     ) -> tuple[list[float], int]:
        """One relevance score per document (higher is more relevant) and tokens read;
        `asked`: the request, as `embed`'s. Raises `EngineError`."""
        raise EngineError("invalid_request", 400, f"model {model!r} does not rerank")

    async def count_tokens(self, req: CountTokens) -> int:
        """The tokens the model reads for `req`'s input. Raises `EngineError`:
        ``count_unsupported`` (400) where the engine cannot tell, invalid_request
        for an empty input."""
        raise EngineError("count_unsupported", 400, f"model {req.model!r} cannot count tokens "
                          "(its engine has no tokenizer here)")

    async def remove_lora(self, name: str) -> None:
        """Stop serving adapter `name`. Raises `EngineError` (400) where `name` is
        not an adapter of this engine."""
        raise EngineError("invalid_request", 400, f"{name!r} is a base model, not a LoRA "
                          "adapter")

    async def add_lora(self, name: str, path: str, base: str | None, scale: float
                       ) -> ModelInfo:
        """Register a LoRA adapter served as model `name`. Raises `EngineError`."""
        raise EngineError("invalid_request", 400,
                          f"engine {self.kind!r} does not take LoRA adapters")

    def close(self) -> None:
        """Release models and threads."""


def create(spec: ModelSpec, metrics: Metrics) -> Engine:
    """The engine a config entry names. Raises `EngineError` for an unknown engine."""
    if spec.engine == "llamacpp":
        from .llamacpp import LlamaEngine

        return LlamaEngine(spec, metrics)
    if spec.engine == "onnx":
        from .onnx import OnnxEngine

        return OnnxEngine(spec)
    if spec.engine == "openai":
        from .upstream import UpstreamEngine

        return UpstreamEngine(spec)
    raise EngineError("invalid_config", 400, f"unknown engine {spec.engine!r} for model "
                      f"{spec.name!r} (expected llamacpp, onnx or openai)")
