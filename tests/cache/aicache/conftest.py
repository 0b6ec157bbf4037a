"""Fixtures of the AI cache tests: the real packaged MiniLM (ONNX, in process)
as the semantic cache's embedder, a controlled clock, calls to build."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_worker.config import ModelSpec
from gpu_worker.engines.onnx import OnnxEngine, libstdcxx_clash

EMBED = "all-minilm-l6-v2"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class MiniLM:
    """The worker's embedding engine, called in process; each distinct text is
    embedded once (`calls` counts what the engine really computed)."""

    def __init__(self, engine: OnnxEngine) -> None:
        self.engine = engine
        self.memo: dict[str, list[float]] = {}
        self.calls = 0

    async def __call__(self, model: str, texts: list[str], client: str | None = None
                       ) -> dict[str, Any]:
        todo = [t for t in texts if t not in self.memo]
        if todo:
            self.calls += 1
            vecs, _ = await self.engine.embed(model, todo)
            self.memo.update(zip(todo, (list(map(float, v)) for v in vecs), strict=True))
        return {"embeddings": [self.memo[t] for t in texts], "tokens": 0}


@pytest.fixture(scope="session")
def minilm() -> Iterator[MiniLM]:
    if libstdcxx_clash():
        pytest.skip("onnxruntime would segfault here (see gpu_worker/engines/onnx.py)")
    engine = OnnxEngine(ModelSpec(EMBED, "onnx"))
    asyncio.run(engine.start())
    yield MiniLM(engine)
    engine.close()


@pytest.fixture
def clock() -> Clock:
    return Clock()
