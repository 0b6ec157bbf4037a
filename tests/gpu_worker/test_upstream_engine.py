"""UpstreamEngine against a real OpenAI-compatible HTTP/1.1 server on loopback.

The fake upstream below is a small asyncio server: GET /v1/models, streamed
POST /v1/chat/completions (chunked SSE echoing the last user message word by
word, then a usage chunk and ``[DONE]``), POST /v1/completions (SSE with a
Content-Length body and no usage), POST /v1/embeddings, POST /v1/rerank (Jina's
shape: a document's score is the words it shares with the query; model ``short``
leaves the last one out) and, as vLLM, POST /tokenize at its root only (a prompt's
or the messages' words), and an OpenAI-shaped 404 for unknown models. Model ``forever`` streams until the client goes away and
model ``stall`` sends one token and then nothing, model ``flood`` sends 1 MiB
tokens and counts the bytes the network has taken; ``cut`` and ``oops`` send a
token and then hang up mid-body or send an error event; ``breaks`` streams tokens
holding Unicode line breaks that JSON leaves unescaped (U+2028, U+0085, U+2029);
``junk`` answers with something that is not HTTP. `FakeUpstream.unavailable`
lists 503 answers to give first, each closing its connection or not;
`FakeUpstream.hang_up` is how many requests to read and then close the connection
on, answering nothing.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from edgefn_core.errors import EngineError
from gpu_worker.client import WorkerClient
from gpu_worker.config import ModelSpec
from gpu_worker.engines import upstream
from gpu_worker.engines.upstream import UpstreamEngine
from gpu_worker.protocol import CountTokens, Generate, Rerank

MODELS = ["echo", "forever", "stall", "flood", "cut", "oops", "breaks", "junk", "embedder",
          "short", "chatty"]
BREAKS = ["one\u2028two", "\x85", "three\u2029"]  # msgspec, like pydantic, sends them raw
FLOOD_TOKEN = "x" * (1 << 20)
FLOOD_TOKENS = 256  # 256 MiB: more than loopback socket buffers can hold
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, dict[str, Any]], Awaitable[None]]


# -- the fake upstream ------------------------------------------------------------------------

def sse(obj: Any) -> bytes:
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


def delta(text: str) -> dict[str, Any]:
    return {"object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


async def send_chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
    await writer.drain()


def response_head(status: int, content_type: str, length: int | None = None,
                  close: bool = True) -> bytes:
    framing = "Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}"
    reason = {200: "OK", 404: "Not Found"}.get(status, "Error")
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n{framing}\r\n"
            f"{'Connection: close' if close else 'Connection: keep-alive'}\r\n\r\n").encode()


def words_of(body: dict[str, Any]) -> list[str]:
    if "messages" in body:
        last = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    else:
        last = body["prompt"]
    words = last.split()
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


class FakeUpstream:
    """An OpenAI-compatible server on an ephemeral loopback port."""

    def __init__(self, keep_alive: bool = False) -> None:
        """`keep_alive`: serve request after request on a connection until an answer
        says ``Connection: close`` (else one, and close); `connections` counts those
        accepted."""
        self.keep_alive = keep_alive
        self.connections = 0
        self.closing = False  # the answer being written says Connection: close
        self.requests: list[tuple[str, str, dict[str, str], dict[str, Any]]] = []
        self.disconnected = asyncio.Event()
        self.flood_sent = 0  # bytes of the flood model's answer the network took
        self.unavailable: list[bool] = []  # 503s to answer POSTs with first: closing or not
        self.hang_up = 0  # requests to read and then close the connection on, unanswered
        self.port = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> FakeUpstream:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self.connections += 1
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                method, path, _ = head[0].split(" ")
                headers = {k.strip().lower(): v.strip()
                           for k, _, v in (line.partition(":") for line in head[1:] if line)}
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                body = msgspec.json.decode(raw) if raw else {}
                self.requests.append((method, path, headers, body))
                if self.hang_up:
                    self.hang_up -= 1
                    break
                self.closing = not self.keep_alive
                await self._route(method, path, body, reader, writer)
                if self.closing:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            self.disconnected.set()
        finally:
            self._handlers.discard(task)
            writer.close()

    async def _route(self, method: str, path: str, body: dict[str, Any],
                     reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if method == "POST" and self.unavailable:
            data = msgspec.json.encode({"error": {"message": "the model worker is down",
                                                  "type": "server_error", "code": "busy"}})
            close = self.unavailable.pop(0)  # what the answer says; closed after it if so
            writer.write(response_head(503, "application/json", len(data), close) + data)
            self.closing = self.closing or close
            return await writer.drain()
        if path == "/v1/tokenize":  # vLLM serves it at its root only (FastAPI's 404)
            return await self._json(writer, 404, {"detail": "Not Found"})
        if method == "GET" and path == "/v1/models":
            return await self._json(writer, 200, {
                "object": "list", "data": [{"id": m, "object": "model"} for m in MODELS]})
        if body.get("model") not in MODELS:
            return await self._json(writer, 404, {"error": {
                "message": f"The model `{body.get('model')}` does not exist.",
                "type": "NotFoundError", "param": None, "code": 404}})
        if body["model"] == "junk":
            writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
            return await writer.drain()
        routes: dict[str, Handler] = {"/v1/chat/completions": self._chat,
                                      "/v1/completions": self._completions,
                                      "/v1/embeddings": self._embeddings,
                                      "/v1/rerank": self._rerank, "/tokenize": self._tokenize}
        await routes[path](reader, writer, body)

    async def _json(self, writer: asyncio.StreamWriter, status: int, obj: Any) -> None:
        data = msgspec.json.encode(obj)
        writer.write(response_head(status, "application/json", len(data), self.closing) + data)
        await writer.drain()

    async def _chat(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    body: dict[str, Any]) -> None:
        writer.write(response_head(200, "text/event-stream", close=self.closing))
        if body["model"] == "forever":
            return await self._forever(reader, writer)
        if body["model"] == "flood":
            event = sse(delta(FLOOD_TOKEN))
            for _ in range(FLOOD_TOKENS):
                await send_chunk(writer, event)
                self.flood_sent += len(event)
            return None
        if body["model"] in ("cut", "oops"):
            await send_chunk(writer, sse(delta("partial")))
            if body["model"] == "oops":
                await send_chunk(writer, sse({"error": {
                    "message": "prompt too long", "type": "BadRequestError", "code": 400}}))
            return None  # no last chunk: the body is cut short
        if body["model"] == "breaks":
            for token in BREAKS:
                await send_chunk(writer, sse(delta(token)))
            return await send_chunk(writer, b"data: [DONE]\n\n")
        if body["model"] == "stall":
            await send_chunk(writer, sse(delta("first")))
            await asyncio.sleep(30)  # cancelled when the test ends
        words = words_of(body)
        out = words[:body["max_tokens"]]
        if body["model"] == "chatty":  # a chunk per character: chunks are not tokens
            for char in "".join(out):
                await send_chunk(writer, sse(delta(char)))
            return await send_chunk(writer, b"data: [DONE]\n\n")
        await send_chunk(writer, sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
        await send_chunk(writer, b": keep-alive comment\n\nevent: ping\n\n")  # no data: skipped
        for i, word in enumerate(out):
            event = sse(delta(word))
            if i == 0:  # one event split across two chunks of the transfer encoding
                await send_chunk(writer, event[:7])
                await send_chunk(writer, event[7:])
            else:
                await send_chunk(writer, event)
        reason = "length" if len(out) < len(words) else "stop"
        prompt_tokens = sum(len(m["content"].split()) for m in body["messages"])
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(out),
                 "total_tokens": prompt_tokens + len(out)}
        tail = (sse({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
                + sse({"choices": [], "usage": usage}) + b"data: [DONE]\n\n")
        await send_chunk(writer, tail)
        await send_chunk(writer, b"")

    async def _forever(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        i = 0
        while not reader.at_eof():
            await send_chunk(writer, sse(delta(f"t{i} ")))
            i += 1
            await asyncio.sleep(0.01)
        self.disconnected.set()

    async def _completions(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           body: dict[str, Any]) -> None:
        events = [sse({"choices": [{"index": 0, "text": w, "finish_reason": None}]})
                  for w in words_of(body)]
        events.append(sse({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}))
        data = b"".join(events).replace(b"\n", b"\r\n") + b"data: [DONE]\r\n\r\n"
        writer.write(response_head(200, "text/event-stream; charset=utf-8", len(data)) + data)
        await writer.drain()

    async def _embeddings(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                          body: dict[str, Any]) -> None:
        inputs = body["input"]
        data = [{"object": "embedding", "index": i, "embedding": [float(len(s)), 1.0]}
                for i, s in enumerate(inputs)]
        await self._json(writer, 200, {"object": "list", "data": data[::-1], "usage": {
            "prompt_tokens": sum(len(s.split()) for s in inputs)}})


    async def _rerank(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      body: dict[str, Any]) -> None:
        query = set(body["query"].split())
        scores = [len(query & set(d.split())) for d in body["documents"]]
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[:body["top_n"]]
        results = [{"index": i, "relevance_score": float(scores[i]), "document": None}
                   for i in order]
        await self._json(writer, 200, {"id": "rerank-1", "model": body["model"], "results":
                                       results[:-1] if body["model"] == "short" else results,
                                       "usage": {"total_tokens": 7}})

    async def _tokenize(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        body: dict[str, Any]) -> None:
        if "prompt" not in body and "messages" not in body:
            return await self._json(writer, 400, {"error": {"message": "prompt is required",
                                                            "type": "BadRequestError",
                                                            "code": 400}})
        words = len(body["prompt"].split()) if "prompt" in body else sum(
            len(m["content"].split()) for m in body["messages"])
        await self._json(writer, 200, {"count": words, "max_model_len": 8192,
                                       "tokens": list(range(words))})


# -- helpers ----------------------------------------------------------------------------------

class RecordingSink:
    """Records what the engine sends; a second terminal call fails the test."""

    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.end: tuple[Any, ...] | None = None
        self.ended = asyncio.Event()

    def chunk(self, text: str, tokens: int) -> None:
        assert self.end is None, "chunk after the terminal call"
        assert tokens == 1 and text
        self.chunks.append(text)

    def done(self, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> None:
        self._terminal(("done", finish_reason, prompt_tokens, completion_tokens))

    def error(self, code: str, message: str, status: int) -> None:
        self._terminal(("error", code, message, status))

    def _terminal(self, what: tuple[Any, ...]) -> None:
        assert self.end is None, f"second terminal call {what} after {self.end}"
        self.end = what
        self.ended.set()

    async def result(self) -> tuple[Any, ...]:
        await asyncio.wait_for(self.ended.wait(), 1.5)
        await asyncio.sleep(0.02)  # a second terminal call would fail in _terminal
        assert self.end is not None
        return self.end


async def until(check: Callable[[], bool], timeout: float = 1.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.005)


def engine_for(url: str, models: list[str] | None = None, timeout: float = 1.0,
               api_key_env: str = "") -> UpstreamEngine:
    return UpstreamEngine(ModelSpec("up", "openai", url=url, models=models or [],
                                    timeout=timeout, api_key_env=api_key_env))


def chat(rid: int, model: str, text: str, **kw: Any) -> Generate:
    return Generate(rid, model, messages=[{"role": "system", "content": "be brief"},
                                          {"role": "user", "content": text}], **kw)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# -- tests ------------------------------------------------------------------------------------

def test_start_lists_upstream_models_and_streams_chat_with_usage(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEFN_TEST_UPSTREAM_KEY", "sekrit")

    async def scenario() -> None:
        async with FakeUpstream() as up:
            engine = engine_for(up.url + "/", api_key_env="EDGEFN_TEST_UPSTREAM_KEY")
            await engine.start()
            infos = engine.models()
            assert [m.id for m in infos] == MODELS
            assert {(m.kind, m.engine) for m in infos} == {("chat", "openai")}
            assert infos[0].details == {"upstream": up.url}

            sink = RecordingSink()
            engine.generate(chat(1, "echo", "hello big wide world", seed=7), sink)
            assert await sink.result() == ("done", "stop", 6, 4)
            assert sink.chunks == ["hello", " big", " wide", " world"]

            method, path, headers, body = up.requests[-1]
            assert (method, path) == ("POST", "/v1/chat/completions")
            assert headers["authorization"] == "Bearer sekrit"
            assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
            assert body["seed"] == 7 and body["max_tokens"] == 256 and "stop" not in body
            engine.close()

    asyncio.run(scenario())


def test_finish_reason_length_and_prompt_completion_without_usage() -> None:
    async def scenario() -> None:
        async with FakeUpstream() as up:
            engine = engine_for(up.url, models=["echo"])
            await engine.start()
            assert up.requests == []  # models were named: nothing asked at start

            sink = RecordingSink()
            engine.generate(chat(1, "echo", "a b c d e", max_tokens=2, stop=["\n"]), sink)
            assert await sink.result() == ("done", "length", 7, 2)
            assert up.requests[-1][3]["stop"] == ["\n"]

            sink = RecordingSink()
            engine.generate(Generate(2, "echo", prompt="one two three"), sink)
            # no usage from the upstream: chunks are counted, prompt tokens unknown
            assert await sink.result() == ("done", "stop", 0, 3)
            assert sink.chunks == ["one", " two", " three"]
            assert up.requests[-1][1] == "/v1/completions"
            assert "seed" not in up.requests[-1][3]
            engine.close()

    asyncio.run(scenario())


def test_unknown_model_keeps_upstream_status_and_message() -> None:
    async def scenario() -> None:
        async with FakeUpstream() as up:
            engine = engine_for(up.url, models=["nope"])
            await engine.start()
            sink = RecordingSink()
            engine.generate(chat(1, "nope", "hi"), sink)
            assert await sink.result() == (
                "error", "model_not_found", "The model `nope` does not exist.", 404)
            assert sink.chunks == []
            with pytest.raises(EngineError) as err:
                await engine.embed("nope", ["x"])
            assert (err.value.code, err.value.status) == ("model_not_found", 404)
            assert "does not exist" in str(err.value)
            with pytest.raises(EngineError) as err:
                engine.generate(chat(2, "not-served", "hi"), RecordingSink())
            assert err.value.status == 404
            engine.close()

    asyncio.run(scenario())


def test_upstream_down_is_upstream_unavailable() -> None:
    async def scenario() -> None:
        url = f"http://127.0.0.1:{closed_port()}/v1"
        with pytest.raises(EngineError) as err:
            await engine_for(url).start()
        assert (err.value.code, err.value.status) == ("upstream_unavailable", 502)
        # named by its entry, not its URL: an internal address reached clients
        assert "upstream 'up' is unavailable" in str(err.value) and url not in str(err.value)

        engine = engine_for(url, models=["echo"])
        await engine.start()
        sink = RecordingSink()
        engine.generate(chat(1, "echo", "hi"), sink)
        code, status = (await sink.result())[1::2]
        assert (code, status) == ("upstream_unavailable", 502)
        with pytest.raises(EngineError) as err:
            await engine.embed("echo", ["x"])
        assert err.value.code == "upstream_unavailable"
        engine.close()

    asyncio.run(scenario())


def test_bad_config_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEFN_TEST_UNSET_KEY", raising=False)

    async def scenario() -> None:
        for engine in (engine_for("ftp://127.0.0.1/v1", models=["m"]),
                       engine_for("http://127.0.0.1:1/v1", models=["m"],
                                  api_key_env="EDGEFN_TEST_UNSET_KEY")):
            with pytest.raises(EngineError) as err:
                await engine.start()
            assert err.value.code == "invalid_config"

    asyncio.run(scenario())


def test_cancel_closes_the_upstream_connection() -> None:
    async def scenario() -> None:
        async with FakeUpstream() as up:
            engine = engine_for(up.url, models=["forever"])
            sink = RecordingSink()
            engine.generate(chat(1, "forever", "go"), sink)
            await until(lambda: len(sink.chunks) >= 3)
            engine.cancel(1)
            engine.cancel(1)  # twice, and unknown ids, are harmless
            engine.credit(1, 5)
            await asyncio.wait_for(up.disconnected.wait(), 1)
            await asyncio.sleep(0.05)
            assert sink.end is None
            assert sink.chunks[:3] == ["t0 ", "t1 ", "t2 "]
            engine.close()

    asyncio.run(scenario())


def test_close_stops_every_stream() -> None:
    async def scenario() -> None:
        async with FakeUpstream() as up:
            engine = engine_for(up.url, models=["forever"])
            sinks = [RecordingSink(), RecordingSink()]
            for rid, sink in enumerate(sinks):
                engine.generate(chat(rid, "forever", "go"), sink)
            await until(lambda: all(s.chunks for s in sinks))
            engine.close()
            await asyncio.wait_for(up.disconnected.wait(), 1)
            await until(lambda: not up._handlers)
            assert all(s.end is None for s in sinks)

    asyncio.run(scenario())


def test_window_holds_chunks_until_credit() -> None:
    async def scenario() -> None:
        async with FakeUpstream() as up:
            engine = engine_for(up.url, models=["echo"])
            sink = RecordingSink()
            engine.generate(chat(1, "echo", "one two three four five six", window=2), sink)
            await until(lambda: len(sink.chunks) == 2)
            await asyncio.sleep(0.15)
            assert sink.chunks == ["one", " two"] and sink.end is None
            engine.credit(1, 1)
            await until(lambda: len(sink.chunks) == 3)
            await asyncio.sleep(0.05)
            assert len(sink.chunks) == 3 and sink.end is None
            engine.credit(1, 10)
            assert await sink.result() == ("done", "stop", 8, 6)
            assert "".join(sink.chunks) == "one two three four five six"
            engine.close()

    asyncio.run(scenario())


def test_window_pushes_back_on_the_upstream_socket() -> None:
    async def scenario() -> None:
        async with FakeUpstream() as up:
            engine = engine_for(up.url, models=["flood"])
            sink = RecordingSink()
            engine.generate(chat(1, "flood", "go", window=1), sink)
            await until(lambda: len(sink.chunks) == 1)
            await asyncio.sleep(0.2)
            held = up.flood_sent
            await asyncio.sleep(0.1)
            # the engine stopped reading, so the upstream's writes block
            assert up.flood_sent == held < FLOOD_TOKENS * len(FLOOD_TOKEN) // 2
            assert len(sink.chunks) == 1
            engine.credit(1, 2)
            await until(lambda: len(sink.chunks) == 3)
            assert sink.chunks[2] == FLOOD_TOKEN
            engine.cancel(1)
            await asyncio.wait_for(up.disconnected.wait(), 1)
            assert sink.end is None
            engine.close()

    asyncio.run(scenario())


def test_upstream_failing_mid_stream() -> None:
    async def scenario() -> None:
        async with FakeUpstream() as up:
            engine = engine_for(up.url, models=["cut", "oops"])
            cut, oops = RecordingSink(), RecordingSink()
            engine.generate(chat(1, "cut", "hi"), cut)
            engine.generate(chat(2, "oops", "hi"), oops)
            code, status = (await cut.result())[1::2]
            assert (code, status) == ("upstream_unavailable", 502)
            assert await oops.result() == ("error", "invalid_request", "prompt too long", 400)
            assert cut.chunks == oops.chunks == ["partial"]
            engine.close()

    asyncio.run(scenario())


def test_silent_upstream_times_out() -> None:
    async def scenario() -> None:
        async with FakeUpstream() as up:
            engine = engine_for(up.url, models=["stall"], timeout=0.2)
            sink = RecordingSink()
            engine.generate(chat(1, "stall", "hi"), sink)
            end = await sink.result()
            assert (end[1], end[3]) == ("timeout", 504)
            assert sink.chunks == ["first"]
            engine.close()

    asyncio.run(scenario())


def test_embed_returns_vectors_in_input_order_and_usage() -> None:
    async def scenario() -> None:
        async with FakeUpstream() as up:
            engine = engine_for(up.url)
            await engine.start()
            vectors, tokens = await engine.embed("embedder", ["a", "bb cc", "ddd"])
            assert vectors == [[1.0, 1.0], [5.0, 1.0], [3.0, 1.0]]
            assert tokens == 4
            assert up.requests[-1][3] == {"model": "embedder", "input": ["a", "bb cc", "ddd"]}
            engine.close()

    asyncio.run(scenario())


def test_a_503_that_closes_its_connection_is_tried_once_more() -> None:
    """Once, on a new connection (a PoP whose model worker is down says so); a 503
    on a kept connection is passed on at once."""
    async def scenario() -> None:
        async with FakeUpstream() as up:
            engine = engine_for(up.url)
            await engine.start()
            up.unavailable = [True]
            sink = RecordingSink()
            engine.generate(chat(1, "echo", "still here"), sink)
            assert await sink.result() == ("done", "stop", 4, 2)
            up.unavailable = [True]
            assert (await engine.embed("embedder", ["a"]))[0] == [[1.0, 1.0]]
            posts = [r for r in up.requests if r[0] == "POST"]
            assert [r[1] for r in posts] == ["/v1/chat/completions"] * 2 + ["/v1/embeddings"] * 2

            for answers, tries in (([True, True], 2), ([False], 1)):
                up.unavailable, before = list(answers), len(up.requests)
                sink = RecordingSink()
                engine.generate(chat(2, "echo", "gone"), sink)
                assert await sink.result() == (
                    "error", "overloaded", "the model worker is down", 503)
                assert len(up.requests) - before == tries
                up.unavailable, before = list(answers), len(up.requests)
                with pytest.raises(EngineError) as err:
                    await engine.embed("embedder", ["a"])
                assert (err.value.code, err.value.status) == ("overloaded", 503)
                assert len(up.requests) - before == tries
            engine.close()

    asyncio.run(scenario())


def test_the_second_try_takes_a_new_connection_not_another_idle_one() -> None:
    """The pool's other idle connections may lead where the 503 came from (through
    a link, to the PoP whose worker is down): the second try opens its own."""
    async def scenario() -> None:
        async with FakeUpstream(keep_alive=True) as up:
            engine = engine_for(up.url)
            await engine.start()
            await asyncio.gather(*(engine.embed("embedder", ["a"]) for _ in range(3)))
            idle = up.connections
            assert idle >= 2  # answers read whole: their connections wait in the pool
            up.unavailable = [True]
            assert (await engine.embed("embedder", ["a"]))[0] == [[1.0, 1.0]]
            assert up.connections == idle + 1  # the second try's own
            engine.close()

    asyncio.run(scenario())


def test_a_streamed_answer_leaves_its_connection_to_the_next_request() -> None:
    """Every generation is streamed upstream; reading past [DONE] to the body's end
    keeps the connection, so the next request skips the handshake (a round trip on
    each link of a topology)."""
    async def scenario() -> None:
        async with FakeUpstream(keep_alive=True) as up:
            engine = engine_for(up.url, models=["echo"])
            for rid in (1, 2, 3):
                sink = RecordingSink()
                engine.generate(chat(rid, "echo", "one two"), sink)
                assert (await sink.result())[:2] == ("done", "stop")
                assert sink.chunks == ["one", " two"]
            assert (len(up.requests), up.connections) == (3, 1)
            engine.close()

    asyncio.run(scenario())


def test_a_kept_connection_that_hangs_up_before_the_head_is_tried_once_more() -> None:
    """A kept connection may be closed by the upstream (or a link whose route died)
    while a request is on its way: the request goes once more on a new connection.
    A second hang-up is the answer (upstream_unavailable)."""
    async def scenario() -> None:
        async with FakeUpstream(keep_alive=True) as up:
            engine = engine_for(up.url, models=["echo", "embedder"])
            sink = RecordingSink()
            engine.generate(chat(1, "echo", "warm"), sink)
            assert (await sink.result())[0] == "done"
            up.hang_up = 1
            sink = RecordingSink()
            engine.generate(chat(2, "echo", "again please"), sink)
            assert (await sink.result())[:2] == ("done", "stop")
            assert sink.chunks == ["again", " please"]
            assert (len(up.requests), up.connections) == (3, 2)  # the second try's own
            up.hang_up = 1
            assert (await engine.embed("embedder", ["abc"]))[0] == [[3.0, 1.0]]
            # the pool had none left: a new one, hung up on, then the second try's own
            assert (len(up.requests), up.connections) == (5, 4)
            up.hang_up = 2
            sink = RecordingSink()
            engine.generate(chat(3, "echo", "gone"), sink)
            end = await sink.result()
            assert end[:2] == ("error", "upstream_unavailable") and end[3] == 502, end
            assert len(up.requests) == 7
            engine.close()

    asyncio.run(scenario())


def test_generate_refuses_bad_requests() -> None:
    async def scenario() -> None:
        engine = engine_for("http://127.0.0.1:1/v1", models=["echo"])
        for req in (Generate(1, "echo"), chat(1, "echo", "hi", window=0)):
            with pytest.raises(EngineError) as err:
                engine.generate(req, RecordingSink())
            assert err.value.code == "invalid_request"
        engine.close()

    asyncio.run(scenario())


def test_unicode_line_breaks_inside_a_token_do_not_split_its_event() -> None:
    async def scenario() -> None:
        async with FakeUpstream() as up:
            engine = engine_for(up.url, models=["breaks"])
            sink = RecordingSink()
            engine.generate(chat(1, "breaks", "hi"), sink)
            assert await sink.result() == ("done", "stop", 0, 3)
            assert sink.chunks == BREAKS
            engine.close()

    asyncio.run(scenario())


def test_an_upstream_that_does_not_speak_http_is_upstream_error() -> None:
    async def scenario() -> None:
        async with FakeUpstream() as up:
            engine = engine_for(up.url, models=["junk"])
            sink = RecordingSink()
            engine.generate(chat(1, "junk", "hi"), sink)
            _, code, message, status = await sink.result()
            assert (code, status) == ("upstream_error", 502) and "upstream 'up'" in message
            assert up.url not in message
            with pytest.raises(EngineError) as err:
                await engine.embed("junk", ["x"])
            assert (err.value.code, err.value.status) == ("upstream_error", 502)
            engine.close()

    asyncio.run(scenario())


def test_an_event_over_the_size_limit_fails_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upstream, "MAX_EVENT", 64 * 1024)

    async def scenario() -> None:
        async with FakeUpstream() as up:
            engine = engine_for(up.url, models=["flood"])
            sink = RecordingSink()
            engine.generate(chat(1, "flood", "go"), sink)
            _, code, message, status = await sink.result()
            assert (code, status) == ("upstream_error", 502) and "65536 byte" in message
            assert sink.chunks == []
            await asyncio.wait_for(up.disconnected.wait(), 1)  # the connection was closed
            engine.close()

    asyncio.run(scenario())


def test_proxies_from_the_environment_are_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    dead = f"http://127.0.0.1:{closed_port()}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, dead)

    async def scenario() -> None:
        async with FakeUpstream() as up:
            engine = engine_for(up.url)
            await engine.start()
            assert "echo" in [m.id for m in engine.models()]
            engine.close()

    asyncio.run(scenario())


def test_close_releases_the_http_client() -> None:
    async def scenario() -> None:
        async with FakeUpstream() as up:
            engine = engine_for(up.url)
            await engine.start()
            client = engine._client
            assert client is not None and not client.is_closed
            engine.close()
            await asyncio.sleep(0.01)
            assert client.is_closed

    asyncio.run(scenario())


def test_a_kept_connection_is_dropped_before_a_pop_would_close_it() -> None:
    """Dropped idle before the server's own timeout (a PoP's keepalive_timeout, 5 s),
    so a request rarely meets the server's close on its way."""
    from runtime.net.server import ServerConfig

    engine = engine_for("http://127.0.0.1:1/v1", models=["echo"])
    pool = engine._setup()._transport._pool  # type: ignore[attr-defined]
    assert pool._keepalive_expiry == upstream.IDLE_S < ServerConfig().keepalive_timeout
    engine.close()


async def _answering(reply: Callable[[asyncio.StreamWriter], None]) -> asyncio.Server:
    """A server that reads one request head and then does `reply`."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        reply(writer)

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_an_upstream_edgefn_pops_error_code_is_kept() -> None:
    """A regional's 502 upstream_unavailable (its central is gone) stays that at the
    edge; a code edgefn does not use follows the status."""
    def answer(code: str) -> Callable[[asyncio.StreamWriter], None]:
        def reply(writer: asyncio.StreamWriter) -> None:
            body = msgspec.json.encode({"error": {"message": "central is gone", "code": code,
                                                  "type": "server_error"}})
            writer.write(response_head(502, "application/json", len(body)) + body)
            writer.close()
        return reply

    async def scenario() -> None:
        for code, kept in (("upstream_unavailable", "upstream_unavailable"),
                           ("BadGateway", "upstream_error")):
            server = await _answering(answer(code))
            port = server.sockets[0].getsockname()[1]
            engine = engine_for(f"http://127.0.0.1:{port}/v1", models=["echo"])
            sink = RecordingSink()
            engine.generate(chat(1, "echo", "hi"), sink)
            assert await sink.result() == ("error", kept, "central is gone", 502)
            engine.close()
            server.close()

    asyncio.run(scenario())


def test_a_reset_says_so() -> None:
    """A reset carries no message of its own (a link with no route left resets): the
    error says what happened, not only ``ReadError``."""
    def reset(writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async def scenario() -> None:
        server = await _answering(reset)
        port = server.sockets[0].getsockname()[1]
        engine = engine_for(f"http://127.0.0.1:{port}/v1", models=["echo"])
        sink = RecordingSink()
        engine.generate(chat(1, "echo", "hi"), sink)
        _, code, message, status = await sink.result()
        assert (code, status) == ("upstream_unavailable", 502)
        assert message.endswith("is unavailable: the connection was reset before the answer "
                                "ended (ReadError)"), message
        engine.close()
        server.close()

    asyncio.run(scenario())


def test_rerank_and_token_counts_go_to_vllms_endpoints_named_as_the_caller() -> None:
    """Rerank: every document scored, in their order, with the call's request id and
    signed client; token counts: /v1/tokenize is not there (vLLM), so /tokenize at the
    root, and from then on only there; texts to embed, which vLLM's /tokenize does
    not take, cannot be counted there."""
    async def scenario() -> None:
        async with FakeUpstream(keep_alive=True) as up:
            engine = engine_for(up.url, models=["echo", "short"])
            asked = Rerank(1, "echo", "red apple", ["a red car", "red apple pie", "tide"],
                           request_id="r-1", signed_client="tenant:acme;1;tag")
            assert await engine.rerank("echo", asked.query, asked.documents, None, asked) == (
                [1.0, 2.0, 0.0], 7)
            _, path, headers, body = up.requests[-1]
            assert path == "/v1/rerank" and body["top_n"] == 3
            assert (headers["x-request-id"], headers["x-edgefn-client"]) == (
                "r-1", "tenant:acme;1;tag")

            count = CountTokens(2, "echo", messages=[{"role": "user", "content": "one two"}],
                                request_id="r-2", signed_client="tenant:acme;2;tag")
            assert await engine.count_tokens(count) == 2
            assert [r[1] for r in up.requests[-2:]] == ["/v1/tokenize", "/tokenize"]
            assert up.requests[-1][2]["x-edgefn-client"] == "tenant:acme;2;tag"
            assert await engine.count_tokens(CountTokens(3, "echo", prompt="a b c")) == 3
            assert up.requests[-1][1] == "/tokenize"  # straight there
            asked_before = len(up.requests)
            with pytest.raises(EngineError) as e:
                await engine.count_tokens(CountTokens(4, "echo", inputs=["a b"]))
            assert (e.value.code, e.value.status) == ("count_unsupported", 400)
            assert len(up.requests) == asked_before
            engine.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(("model", "code", "status", "says"), [
    ("short", "upstream_error", 502, "upstream ranked 2 results for 3 documents"),
    ("nope", "model_not_found", 404, "model 'nope' does not exist"),
])
def test_a_rerank_the_upstream_cannot_answer_is_a_clear_error(model: str, code: str,
                                                             status: int, says: str) -> None:
    async def scenario() -> None:
        async with FakeUpstream() as up:
            engine = engine_for(up.url, models=["short"])
            with pytest.raises(EngineError) as e:
                await engine.rerank(model, "red", ["red", "blue", "green"])
            assert (e.value.code, e.value.status) == (code, status)
            assert says in str(e.value)
            engine.close()

    asyncio.run(scenario())


def test_an_upstream_that_is_down_fails_a_rerank_and_a_count_as_unavailable() -> None:
    async def scenario() -> None:
        engine = engine_for(f"http://127.0.0.1:{closed_port()}/v1", models=["echo"])
        for call in (engine.rerank("echo", "q", ["d"]),
                     engine.count_tokens(CountTokens(1, "echo", prompt="p"))):
            with pytest.raises(EngineError) as e:
                await call
            assert (e.value.code, e.value.status) == ("upstream_unavailable", 502)
            assert "upstream 'up' is unavailable" in str(e.value)
        engine.close()

    asyncio.run(scenario())


def test_a_collected_answer_of_more_chunks_than_tokens_is_not_held_for_credit(
        tmp_path: Path) -> None:
    """A non-streamed answer is collected in the worker, which gave it a window of
    max_tokens + 2 chunks; an upstream that sends more chunks than tokens (one a
    character here, as some do for tool-call deltas) waited for credit nobody gives,
    until the 120 s idle timeout."""
    async def scenario() -> tuple[str, Any]:
        async with FakeUpstream() as up:
            config = tmp_path / "worker.toml"
            config.write_text(f'[[models]]\nname = "up"\nengine = "openai"\nurl = "{up.url}"\n'
                              'models = ["chatty"]\ntimeout = 5\n')
            client = WorkerClient.spawning(str(tmp_path / "w.sock"), str(config))
            await client.start()
            try:
                gen = await client.generate("chatty", stream=False, max_tokens=3,
                                            messages=[{"role": "user",
                                                       "content": "alpha beta gamma delta"}])
                return await asyncio.wait_for(gen.collect(), 10)
            finally:
                await client.close()

    text, done = asyncio.run(scenario())
    assert text == "alpha beta gamma" and done.finish_reason == "stop", (text, done)
