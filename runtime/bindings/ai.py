"""The AI capability: ``ai.chat``, ``ai.chat_stream``/``ai.chat_next``,
``ai.complete``, ``ai.embed``, ``ai.rerank`` and ``ai.models`` on the PoP's model
worker.

A stream belongs to the deployment that opened it: each `AIBinding` keeps its
own streams, so a stream id means nothing to another function.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from edgefn_core.errors import BindingError, WorkerError
from gpu_worker.client import Generation
from runtime.ai.service import AIService

STREAM_IDLE = 30.0  # a chat stream nobody reads for this long is closed
OPS = frozenset({"chat", "chat_stream", "chat_next", "complete", "embed", "rerank", "models"})


class AIBinding:
    def __init__(self, service: AIService, owner: str) -> None:
        self.service = service
        self.owner = owner
        self.streams: dict[int, tuple[Generation, float]] = {}
        self.ids = itertools.count(1)

    async def call(self, op: str, a: dict[str, Any]) -> Any:
        """Run one AI operation. Raises `BindingError` (with the worker's reason for
        a refused request) and KeyError/TypeError/ValueError for bad arguments."""
        if op not in OPS:
            raise BindingError(f"unknown AI operation {op!r}")
        try:
            return await self._run(op, a)
        except WorkerError as e:
            raise BindingError(f"ai.{op}: {e}") from None

    async def _run(self, op: str, a: dict[str, Any]) -> Any:
        client = self.service.client
        match op:
            case "chat" | "complete" | "chat_stream":
                return await self._generate(op, a)
            case "chat_next":
                return await self._next(int(a["stream"]))
            case "embed":
                inputs = a["input"]
                out = await client.embed(a["model"], [inputs] if isinstance(inputs, str)
                                         else list(inputs))
                return {"embeddings": out["embeddings"], "tokens": out["tokens"]}
            case "rerank":
                return await client.rerank(a["model"], a["query"], list(a["documents"]),
                                           a.get("top_n"))
        return await client.models()

    async def _generate(self, op: str, a: dict[str, Any]) -> Any:
        params: dict[str, Any] = {k: a[k] for k in ("max_tokens", "temperature", "top_p",
                                                     "top_k", "seed") if a.get(k) is not None}
        stop = a.get("stop")
        params["stop"] = [stop] if isinstance(stop, str) else list(stop or [])
        if op == "complete":
            params["prompt"] = str(a["prompt"])
        else:
            params["messages"] = list(a["messages"])
        gen = await self.service.client.generate(str(a["model"]), stream=op == "chat_stream",
                                                 **params)
        if op == "chat_stream":
            self._sweep()
            sid = next(self.ids)
            self.streams[sid] = (gen, time.monotonic())
            return {"stream": sid}
        text, done = await gen.collect()
        return {"text": text, "finish_reason": done.finish_reason,
                "usage": {"prompt_tokens": done.prompt_tokens,
                          "completion_tokens": done.completion_tokens}}

    async def _next(self, sid: int) -> dict[str, Any]:
        """At least one chunk (or the end) of this deployment's stream `sid`, plus
        whatever else already arrived. Raises `BindingError` for a stream it does
        not own (or one that ended)."""
        entry = self.streams.get(sid)
        if entry is None:
            raise BindingError(f"no AI stream {sid} for function {self.owner!r} (finished, "
                               f"closed after {STREAM_IDLE:.0f} s unread, or not its own)")
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

    async def close(self) -> None:
        """Close the streams still open (the deployment is going away)."""
        streams, self.streams = self.streams, {}
        for gen, _ in streams.values():
            await gen.aclose()
