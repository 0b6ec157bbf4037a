"""The PoP's side of the model worker: starts and supervises it (through
`gpu_worker.client`), keeps the LoRA adapters added at run time (persisted in
DATA/ai/loras.json and registered again whenever the worker restarts), and
serves the ``ai.*`` bindings functions call.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import msgspec

from gpu_worker.client import Generation, WorkerClient, WorkerError

log = logging.getLogger("edgefn.ai")
STREAM_IDLE = 30.0  # a function's chat stream nobody reads for this long is closed


class Lora(msgspec.Struct):
    name: str
    path: str
    base: str | None = None
    scale: float = 1.0


class AIService:
    """One model worker for the PoP."""

    def __init__(self, data_dir: Path, config: str | None = None, socket: str | None = None
                 ) -> None:
        self.dir = data_dir / "ai"
        self.dir.mkdir(parents=True, exist_ok=True)
        path = socket or str(self.dir / "worker.sock")
        self.client = WorkerClient.spawning(path, config) if socket is None else \
            WorkerClient(path)
        self.client.on_connect = self._registered_again
        self.loras_file = self.dir / "loras.json"
        self.loras: list[Lora] = []
        if self.loras_file.exists():
            self.loras = msgspec.json.decode(self.loras_file.read_bytes(), type=list[Lora])
        self.streams: dict[int, tuple[Generation, float]] = {}
        self.stream_ids = 0

    async def start(self, wait: bool = True) -> None:
        """Start the worker. With `wait`, raises `WorkerDead` if it does not come up."""
        await self.client.start(wait)

    async def close(self) -> None:
        for gen, _ in self.streams.values():
            await gen.aclose()
        await self.client.close()

    # -- LoRA -----------------------------------------------------------------------------
    async def add_lora(self, name: str, path: str, base: str | None = None,
                       scale: float = 1.0) -> dict[str, Any]:
        """Register an adapter now and after every restart. Raises `WorkerError`."""
        path = str(Path(path).resolve())
        info = await self.client.add_lora(name, path, base, scale)
        self.loras.append(Lora(name, path, base, scale))
        tmp = self.loras_file.with_suffix(".tmp")
        tmp.write_bytes(msgspec.json.encode(self.loras))
        tmp.replace(self.loras_file)
        return info

    async def _registered_again(self) -> None:
        for lo in self.loras:
            try:
                await self.client.add_lora(lo.name, lo.path, lo.base, lo.scale, early=True)
            except WorkerError as e:
                log.error("LoRA adapter %s no longer loads: %s", lo.name, e)

    # -- bindings -------------------------------------------------------------------------
    async def binding(self, op: str, a: dict[str, Any]) -> Any:
        """``ai.chat``, ``ai.chat_stream``/``ai.chat_next``, ``ai.complete``,
        ``ai.embed``, ``ai.rerank``, ``ai.models``. Raises `WorkerError` and
        KeyError/TypeError/ValueError for bad arguments."""
        if op in ("chat", "complete", "chat_stream"):
            return await self._generate(op, a)
        if op == "chat_next":
            return await self._next(int(a["stream"]))
        if op == "embed":
            inputs = a["input"]
            out = await self.client.embed(a["model"], [inputs] if isinstance(inputs, str)
                                          else list(inputs))
            return {"embeddings": out["embeddings"], "tokens": out["tokens"]}
        if op == "rerank":
            return await self.client.rerank(a["model"], a["query"], list(a["documents"]),
                                            a.get("top_n"))
        if op == "models":
            return await self.client.models()
        raise ValueError(f"unknown AI operation {op!r}")

    async def _generate(self, op: str, a: dict[str, Any]) -> Any:
        params: dict[str, Any] = {k: a[k] for k in ("max_tokens", "temperature", "top_p",
                                                     "top_k", "seed") if a.get(k) is not None}
        stop = a.get("stop")
        params["stop"] = [stop] if isinstance(stop, str) else list(stop or [])
        if op == "complete":
            params["prompt"] = str(a["prompt"])
        else:
            params["messages"] = list(a["messages"])
        gen = await self.client.generate(str(a["model"]), stream=op == "chat_stream", **params)
        if op == "chat_stream":
            self._sweep()
            self.stream_ids += 1
            self.streams[self.stream_ids] = (gen, time.monotonic())
            return {"stream": self.stream_ids}
        text, done = await gen.collect()
        return {"text": text, "finish_reason": done.finish_reason,
                "usage": {"prompt_tokens": done.prompt_tokens,
                          "completion_tokens": done.completion_tokens}}

    async def _next(self, sid: int) -> dict[str, Any]:
        """At least one chunk (or the end) of stream `sid`, plus whatever else
        already arrived."""
        entry = self.streams.get(sid)
        if entry is None:
            raise ValueError(f"no AI stream {sid} (finished, or closed after "
                             f"{STREAM_IDLE:.0f} s unread)")
        gen = entry[0]
        self.streams[sid] = (gen, time.monotonic())
        chunks: list[str] = []
        try:
            chunks.append(await anext(gen))
            while not gen.queue.empty() and not gen.finished:
                chunks.append(await anext(gen))
        except StopAsyncIteration:
            pass
        except WorkerError:
            del self.streams[sid]
            raise
        if not gen.finished:
            return {"chunks": chunks, "done": None}
        del self.streams[sid]
        d = gen.done
        assert d is not None
        return {"chunks": chunks, "done": {"finish_reason": d.finish_reason,
                                           "usage": {"prompt_tokens": d.prompt_tokens,
                                                     "completion_tokens": d.completion_tokens}}}

    def _sweep(self) -> None:
        now = time.monotonic()
        for sid, (gen, seen) in list(self.streams.items()):
            if now - seen > STREAM_IDLE:
                del self.streams[sid]
                asyncio.get_running_loop().create_task(gen.aclose())
