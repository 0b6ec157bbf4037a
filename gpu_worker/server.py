"""The worker process: loads the configured engines and answers IPC frames on a
Unix socket.

Each connection may carry many requests at once; ids are the client's and are
mapped to worker-wide ids for the engines. A connection that closes cancels
everything it started (the client went away).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import time
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from edgefn_core.errors import EngineError, ProtocolError

from . import protocol as p
from .config import WorkerConfig
from .engines import Engine, ModelInfo, create
from .metrics import Metrics

COLLECTED = 1 << 30  # the window of a generation collected here: never waits for credit
log = logging.getLogger("edgefn.gpu_worker")
MAX_INPUTS = 2048
MAX_CLIENT = 200  # characters of a request's `client` (a key id or an owner's name)


class Worker:
    """The engines and the model table; `serve()` answers clients."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.engines: list[Engine] = []
        self.by_model: dict[str, Engine] = {}
        self.ids = itertools.count(1)

    async def start(self) -> None:
        """Load every configured engine and LoRA adapter. Raises `EngineError`."""
        for spec in self.config.models:
            engine = create(spec, self.metrics)
            started = time.perf_counter()
            await engine.start()
            self.engines.append(engine)
            for m in engine.models():
                self.by_model[m.id] = engine
            log.info("loaded %s (%s) in %.2f s", spec.name, spec.engine,
                     time.perf_counter() - started)
        for lo in self.config.loras:
            await self.add_lora(lo.name, lo.path, lo.base, lo.scale)

    def models(self) -> list[ModelInfo]:
        return [m for e in self.engines for m in e.models()]

    def engine_for(self, model: str) -> Engine:
        """Raises `EngineError` (404) for a model no engine serves."""
        engine = self.by_model.get(model)
        if engine is None:
            known = ", ".join(sorted(self.by_model)) or "none"
            raise EngineError("model_not_found", 404, f"model {model!r} does not exist "
                              f"(available: {known})")
        return engine

    async def add_lora(self, name: str, path: str, base: str | None, scale: float) -> ModelInfo:
        """Raises `EngineError` for an unknown base or an adapter the engine refuses."""
        if name in self.by_model:
            raise EngineError("invalid_request", 400, f"model name {name!r} is already in use")
        if base is None:
            base = next((m.id for m in self.models() if m.kind == "chat" and m.parent is None
                         and self.by_model[m.id].kind == "llamacpp"), None)
        if base is None:
            raise EngineError("invalid_request", 400, "no base model takes LoRA adapters")
        engine = self.engine_for(base)
        info = await engine.add_lora(name, path, base, scale)
        self.by_model[name] = engine
        log.info("LoRA adapter %s (%s) on %s", name, path, base)
        return info

    async def remove_lora(self, name: str) -> dict[str, str]:
        """Stop serving adapter `name`. Raises `EngineError`: 404 for an unknown
        model, 400 for a base model."""
        engine = self.engine_for(name)
        await engine.remove_lora(name)
        del self.by_model[name]
        log.info("LoRA adapter %s removed", name)
        return {"removed": name}

    async def serve(self, path: str) -> asyncio.Server:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        server = await asyncio.start_unix_server(lambda r, w: Connection(self, r, w).run(), path)
        os.chmod(path, 0o600)
        return server

    def close(self) -> None:
        for engine in self.engines:
            engine.close()


class ReplySink:
    """Routes one generation's output back to its connection."""

    def __init__(self, conn: Connection, rid: int, gid: int, engine: Engine, stream: bool
                 ) -> None:
        self.conn, self.rid, self.gid, self.engine, self.stream = conn, rid, gid, engine, stream
        self.parts: list[str] = []
        self.logprobs: list[p.TokenLogprob] | None = None
        self.finished = False

    def chunk(self, text: str, tokens: int, logprobs: list[p.TokenLogprob] | None = None
              ) -> None:
        if self.finished:
            return
        if self.stream:
            self.conn.send(p.Chunk(self.rid, text, tokens, logprobs))
            return
        self.parts.append(text)
        if logprobs is not None:
            self.logprobs = (self.logprobs or []) + logprobs

    def done(self, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> None:
        if self._end():
            self.conn.send(p.Done(self.rid, finish_reason, prompt_tokens, completion_tokens,
                                  "".join(self.parts), self.logprobs))

    def error(self, code: str, message: str, status: int) -> None:
        if self._end():
            self.conn.send(p.Error(self.rid, code, message, status))

    def _end(self) -> bool:
        if self.finished:
            return False
        self.finished = True
        self.conn.generations.pop(self.rid, None)
        return True


class Connection:
    def __init__(self, worker: Worker, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.worker, self.reader, self.writer = worker, reader, writer
        self.generations: dict[int, ReplySink] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.answering: dict[int, asyncio.Task[None]] = {}  # request id -> its task

    def send(self, msg: msgspec.Struct) -> None:
        if not self.writer.is_closing():
            self.writer.write(p.frame(msg))

    async def run(self) -> None:
        try:
            while True:
                body = await p.read_frame(self.reader)
                try:
                    msg = p.request_decoder.decode(body)
                except msgspec.DecodeError as e:
                    self.send(p.Error(_id_of(body), "invalid_request", f"bad message: {e}", 400))
                    continue
                try:
                    self.dispatch(msg)
                except Exception as e:  # a bug answers its own request, never the connection
                    log.exception("request %r failed", type(msg).__name__)
                    self.send(p.Error(getattr(msg, "id", 0), "internal",
                                      f"{type(e).__name__}: {e}", 500))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except ProtocolError as e:
            log.warning("closing a client connection: %s", e)
        finally:
            for sink in list(self.generations.values()):
                sink.engine.cancel(sink.gid)
            for task in self.tasks:
                task.cancel()
            self.writer.close()

    def dispatch(self, msg: p.Request) -> None:
        match msg:
            case p.Generate():
                self.generate(msg)
            case p.Cancel(id=rid):
                sink = self.generations.get(rid)
                if sink is not None:
                    sink.engine.cancel(sink.gid)
                answering = self.answering.get(rid)
                if answering is not None:  # an embedding or rerank nobody waits for: it ran
                    answering.cancel()  # on for minutes, every later one queued behind it
            case p.Credit(id=rid, n=n):
                sink = self.generations.get(rid)
                if sink is not None:
                    sink.engine.credit(sink.gid, n)
            case p.Ping(id=rid, payload=payload):
                self.send(p.Result(rid, payload))
            case _:
                task = asyncio.get_running_loop().create_task(self.answer(msg))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
                self._answering(getattr(msg, "id", None), task)

    def _answering(self, rid: object, task: asyncio.Task[None]) -> None:
        """Keep `task` under its request id until it ends (a Cancel stops it)."""
        if isinstance(rid, int):
            self.answering[rid] = task
            task.add_done_callback(partial(_forget, self.answering, rid))

    def generate(self, msg: p.Generate) -> None:
        if msg.id in self.generations:
            self.send(p.Error(msg.id, "invalid_request", f"id {msg.id} is already in use", 400))
            return
        try:
            _check_client(msg.client)
            self.worker.metrics.asked(msg.client)
            engine = self.worker.engine_for(msg.model)
            gid = next(self.worker.ids)
            sink = ReplySink(self, msg.id, gid, engine, msg.stream)
            # a non-streamed answer is collected here, so it never waits for credit:
            # not max_tokens + 2 chunks, since an upstream's chunks are not tokens (one
            # that sent more waited for credit nobody gives, until the idle timeout)
            window = msg.window if msg.stream else COLLECTED
            engine.generate(msgspec.structs.replace(msg, id=gid, window=window), sink)
        except EngineError as e:  # a 4xx refuses the input: not the engine's error
            self.worker.metrics.request(error=e.status >= 500)
            self.send(p.Error(msg.id, e.code, str(e), e.status))
            return
        except Exception as e:  # an input no check foresaw: this request's 500, nothing more
            log.exception("generate for model %r failed", msg.model)
            self.worker.metrics.request(error=True)
            self.send(p.Error(msg.id, "internal", f"{type(e).__name__}: {e}", 500))
            return
        self.generations[msg.id] = sink

    async def answer(self, msg: p.Request) -> None:
        try:
            data = await self.compute(msg)
            self.send(p.Result(msg.id, data))
        except EngineError as e:
            self.send(p.Error(msg.id, e.code, str(e), e.status))
        except Exception as e:
            log.exception("request %r failed", type(msg).__name__)
            self.send(p.Error(msg.id, "internal", f"{type(e).__name__}: {e}", 500))

    async def compute(self, msg: p.Request) -> Any:
        """The answer to a non-streaming request. Raises `EngineError`."""
        w = self.worker
        if isinstance(msg, p.Embed | p.Rerank | p.CountTokens):
            _check_client(msg.client)
            w.metrics.asked(msg.client)
        match msg:
            case p.Embed(model=model, inputs=inputs, client=client):
                _check_texts("input", inputs)
                vectors, tokens = await w.engine_for(model).embed(model, inputs, client, msg)
                return {"embeddings": vectors, "tokens": tokens}
            case p.Rerank(model=model, query=query, documents=docs, top_n=top_n, client=client):
                _check_texts("query", [query])
                _check_texts("documents", docs)
                scores, tokens = await w.engine_for(model).rerank(model, query, docs, client,
                                                                  msg)
                order = sorted(range(len(docs)), key=lambda i: -scores[i])[:top_n or len(docs)]
                return {"results": [{"index": i, "relevance_score": scores[i]} for i in order],
                        "tokens": tokens}
            case p.CountTokens(model=model):
                return await w.engine_for(model).count_tokens(msg)
            case p.Models():
                return [msgspec.to_builtins(m) for m in w.models()]
            case p.AddLora(name=name, path=path, base=base, scale=scale):
                return msgspec.to_builtins(await w.add_lora(name, path, base, scale))
            case p.RemoveLora(name=name):
                return await w.remove_lora(name)
            case p.GetMetrics():
                return w.metrics.snapshot()
        raise EngineError("invalid_request", 400, f"unexpected message {type(msg).__name__}")


async def _exit_with_parent(stop: asyncio.Event) -> None:
    """A worker started by a PoP stops when that PoP is gone, even if it was killed
    before it could stop the worker (EDGEFN_PARENT_PID is set by the spawner)."""
    parent = int(os.environ.get("EDGEFN_PARENT_PID", "0"))
    while parent:
        await asyncio.sleep(1.0)
        if os.getppid() != parent:
            log.warning("the PoP that started this worker is gone; stopping")
            stop.set()
            return


def _id_of(body: bytes) -> int:
    """The id of a frame that failed validation, so its sender gets the error."""
    try:
        raw = msgspec.msgpack.decode(body)
        return int(raw[1]) if isinstance(raw, list) and len(raw) > 1 else 0
    except (msgspec.DecodeError, TypeError, ValueError):
        return 0


def _check_client(client: str | None) -> None:
    """Raises `EngineError` (400) for a client name past `MAX_CLIENT` characters: it
    keys the engines' fair shares, so it is a short name, never a whole payload."""
    if client is not None and len(client) > MAX_CLIENT:
        raise EngineError("invalid_request", 400, f"'client' has {len(client)} characters; "
                          f"at most {MAX_CLIENT}")


def _check_texts(field: str, texts: list[str]) -> None:
    if not texts:
        raise EngineError("invalid_request", 400, f"'{field}' must not be empty")
    if len(texts) > MAX_INPUTS:
        raise EngineError("invalid_request", 400, f"'{field}' has {len(texts)} items; at most "
                          f"{MAX_INPUTS} per request")
    for i, t in enumerate(texts):
        if not t:
            where = f"'{field}'" if field == "query" else f"'{field}'[{i}]"  # query: one string
            raise EngineError("invalid_request", 400, f"{where} is an empty string")


async def run(config: WorkerConfig, socket_path: str) -> None:
    """Load the engines, serve until SIGTERM/SIGINT, then release them."""
    worker = Worker(config)
    await worker.start()
    server = await worker.serve(socket_path)
    log.info("gpu worker ready on %s: %s", socket_path,
             ", ".join(m.id for m in worker.models()))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watch = loop.create_task(_exit_with_parent(stop))
    try:
        await stop.wait()
    finally:
        watch.cancel()
        server.close()
        worker.close()
        with contextlib.suppress(FileNotFoundError):
            Path(socket_path).unlink()


def _forget(answering: dict[int, asyncio.Task[None]], rid: int, _: object) -> None:
    answering.pop(rid, None)
