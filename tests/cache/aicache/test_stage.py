"""The ``ai_cache`` stage without sockets: a `Request` built directly, the stage
called with a `Context`; what comes after it (the ``openai`` stage) is a
stand-in answering in the OpenAI API's shapes and counting its calls. Replayed
streams are parsed by the official `openai` client (over httpx's MockTransport)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx2
import openai
import pytest

from runtime.ai.openai_api import PATHS, SSE_HEADERS, OpenAITarget
from runtime.cache.ai import replay
from runtime.cache.ai.cache import AICache
from runtime.cache.ai.entry import Generated
from runtime.cache.settings import AICacheSettings
from runtime.functions.router import Router
from runtime.net.message import Request, Response, json_response
from runtime.pipeline.stage import Context
from runtime.pipeline.stages.ai_cache import AICacheStage
from runtime.pipeline.targets import Targets
from runtime.security.principal import Principal

from .conftest import Clock

MODEL = "smollm2-135m"
CHUNKS = ["The", " capital", " is", " Paris", "."]


def chat_body(**extra: Any) -> bytes:
    return json.dumps({"model": MODEL, "temperature": 0, "max_tokens": 16,
                       "messages": [{"role": "user", "content": "Capital of France?"}],
                       **extra}).encode()


def request(body: bytes, path: bytes = b"/v1/chat/completions",
            headers: list[tuple[bytes, bytes]] | None = None) -> Request:
    r = Request(b"POST", path, b"", headers or [], b"h", "1.1", True, "1.2.3.4:5")
    r.body = body
    return r


def event(data: Any) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


class Model:
    """What the ``openai`` stage answers, in its shapes; `bodies` are the request
    bodies it got."""

    def __init__(self, fail_stream: str = "") -> None:
        """`fail_stream`: "end" (an error event instead of the end, as the API
        does), "done" (an error event, then the end and ``[DONE]``)."""
        self.bodies: list[dict[str, Any] | None] = []
        self.fail_stream = fail_stream

    def __call__(self, request: Request, ctx: Context) -> Any:
        try:
            body = json.loads(request.body)
        except ValueError:
            body = None
        self.bodies.append(body)
        return self._answer(body)

    async def _answer(self, body: dict[str, Any] | None) -> Response:
        if body is None or "model" not in body or body.get("n", 1) != 1:
            return json_response({"error": {"message": "bad request"}}, 400)
        if request_path_is_embeddings(body):
            return json_response({"object": "list", "model": body["model"], "data": [
                {"object": "embedding", "index": 0, "embedding": [0.5, 0.25]}],
                "usage": {"prompt_tokens": 3, "total_tokens": 3}})
        if body.get("stream"):
            return Response(200, list(SSE_HEADERS), self._sse(body))
        return json_response({"id": "chatcmpl-1", "object": "chat.completion", "created": 1,
                              "model": body["model"], "choices": [{
                                  "index": 0, "finish_reason": "stop", "message": {
                                      "role": "assistant", "content": "".join(CHUNKS)}}],
                              "usage": {"prompt_tokens": 9, "completion_tokens": 5,
                                        "total_tokens": 14}})

    async def _sse(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
        yield event({**base, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                "content": ""},
                                          "finish_reason": None}]})
        for c in CHUNKS:
            yield event({**base, "choices": [{"index": 0, "delta": {"content": c},
                                              "finish_reason": None}]})
        if self.fail_stream:
            yield event({"error": {"message": "worker died", "type": "server_error"}})
            if self.fail_stream == "end":
                return
        yield event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            yield event({**base, "choices": [], "usage": {
                "prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}})
        yield b"data: [DONE]\n\n"


def request_path_is_embeddings(body: dict[str, Any]) -> bool:
    return "input" in body


def stage(**settings: Any) -> AICacheStage:
    targets = Targets(SimpleNamespace(router=Router(), canaries={}),  # type: ignore[arg-type]
                      dict.fromkeys(PATHS, OpenAITarget()))
    return AICacheStage(AICache(AICacheSettings(**settings), None, clock=Clock()), targets)


async def serve(s: AICacheStage, req: Request, model: Model,
                principal: Principal | None = None) -> tuple[Response, bytes, Context]:
    ctx = Context(req.client)
    ctx.principal = principal
    result = s(req, ctx, model)
    response = result if isinstance(result, Response) else await result
    if isinstance(response.body, bytes):
        return response, response.body, ctx
    return response, b"".join([c async for c in response.body]), ctx


def headers(r: Response) -> dict[bytes, bytes]:
    return dict(r.headers)


def test_a_repeated_chat_is_answered_by_the_cache() -> None:
    s, model = stage(), Model()

    async def main() -> list[tuple[Response, bytes, Context]]:
        return [await serve(s, request(chat_body()), model) for _ in range(2)]

    (miss, _, ctx1), (hit, body, ctx2) = asyncio.run(main())
    assert len(model.bodies) == 1
    assert headers(miss)[b"x-edgefn-cache"] == b"miss"
    assert headers(hit)[b"x-edgefn-cache"] == b"hit-exact"
    data = json.loads(body)
    assert data["choices"][0]["message"]["content"] == "The capital is Paris."
    assert data["usage"] == {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14,
                             "prompt_tokens_details": {"cached_tokens": 9}}
    assert data["id"].startswith("chatcmpl-") and data["id"] != "chatcmpl-1"
    entry = headers(hit)[b"x-edgefn-cache-entry"].decode()
    assert ctx1.decisions == {"ai_cache": {"outcome": "miss", "bytes": 0, "saved_ms": 0.0}}
    assert ctx2.decisions is not None and ctx2.decisions["ai_cache"]["entry"] == entry
    assert ctx2.decisions["ai_cache"]["bytes"] == len("The capital is Paris.")


def replayed(sse: bytes, **kw: Any) -> list[Any]:
    """`sse` parsed by the official client as the answer to a streamed request."""
    transport = httpx2.MockTransport(lambda r: httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, content=sse))
    client = openai.OpenAI(base_url="http://pop/v1", api_key="k",
                           http_client=httpx2.Client(transport=transport))
    return list(client.chat.completions.create(  # type: ignore[call-overload]
        model=MODEL, messages=[{"role": "user", "content": "q"}], stream=True, **kw))


@pytest.mark.parametrize("usage", [True, False])
def test_a_streamed_miss_is_relayed_as_asked_stored_and_replayed(usage: bool) -> None:
    s, model = stage(), Model()
    ask = chat_body(stream=True, **({"stream_options": {"include_usage": True}} if usage
                                    else {}))

    async def main() -> list[tuple[Response, bytes, Context]]:
        return [await serve(s, request(ask), model) for _ in range(2)]

    (_, relayed, _), (hit, replay_body, _) = asyncio.run(main())
    assert model.bodies[0]["stream_options"] == {"include_usage": True}  # asked for usage
    assert (b'"usage"' in relayed) is usage  # ... and dropped it if the client did not
    assert len(model.bodies) == 1 and headers(hit)[b"x-edgefn-cache"] == b"hit-exact"
    for body in (relayed, replay_body):
        chunks = replayed(body)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
            "The capital is Paris."
    chunks = replayed(replay_body)
    assert [c.choices[0].delta.content for c in chunks[1:6]] == CHUNKS  # the stored chunking
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[6].choices[0].finish_reason == "stop"
    if usage:
        assert chunks[-1].choices == [] and chunks[-1].usage is not None
        assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 9
    else:
        assert all(c.usage is None for c in chunks)
    assert replay_body.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("how", ["end", "done"])
def test_a_stream_that_fails_is_not_stored(how: str) -> None:
    s, model = stage(), Model(fail_stream=how)

    async def main() -> None:
        for _ in range(2):
            await serve(s, request(chat_body(stream=True)), model)

    asyncio.run(main())
    assert len(model.bodies) == 2 and len(s.cache) == 0 and not s.cache.flights


def test_a_plain_hit_from_a_streamed_miss_and_back() -> None:
    s, model = stage(), Model()

    async def main() -> tuple[bytes, bytes]:
        await serve(s, request(chat_body(stream=True)), model)
        _, plain, _ = await serve(s, request(chat_body()), model)
        return plain, b""

    plain, _ = asyncio.run(main())
    assert json.loads(plain)["choices"][0]["message"]["content"] == "The capital is Paris."
    assert len(model.bodies) == 1


@pytest.mark.parametrize(("hdrs", "outcome", "reason", "calls", "stored"), [
    ([(b"cache-control", b"no-cache")], "bypass", "no-cache", 2, 1),
    ([(b"x-edgefn-cache", b"bypass")], "bypass", "no-cache", 2, 1),
    ([(b"cache-control", b"no-store")], "bypass", "no-store", 2, 1),
])
def test_request_headers_skip_the_lookup(hdrs: list[tuple[bytes, bytes]], outcome: str,
                                         reason: str, calls: int, stored: int) -> None:
    s, model = stage(), Model()

    async def main() -> tuple[Response, Context]:
        await serve(s, request(chat_body()), model)  # stored
        r, _, ctx = await serve(s, request(chat_body(), headers=hdrs), model)
        return r, ctx

    r, ctx = asyncio.run(main())
    assert headers(r)[b"x-edgefn-cache"] == outcome.encode()
    assert ctx.decisions is not None and ctx.decisions["ai_cache"]["reason"] == reason
    assert len(model.bodies) == calls and len(s.cache) == stored


def test_nondeterministic_requests_bypass_by_default() -> None:
    s, model = stage(), Model()

    async def main() -> list[Response]:
        return [(await serve(s, request(chat_body(temperature=0.8)), model))[0]
                for _ in range(2)]

    assert [headers(r)[b"x-edgefn-cache"] for r in asyncio.run(main())] == [b"bypass"] * 2
    assert len(model.bodies) == 2 and len(s.cache) == 0


def test_the_ttl_header_sets_the_entrys_ttl() -> None:
    s, model = stage(ttl_seconds=3600), Model()
    clock = s.cache.clock
    assert isinstance(clock, Clock)

    async def main() -> None:
        await serve(s, request(chat_body(), headers=[(b"x-edgefn-cache-ttl", b"10")]), model)

    asyncio.run(main())
    (entry,) = s.cache.exact.values()
    assert entry.expires == clock.now + 10


def test_a_caller_not_allowed_the_model_gets_no_cached_answer() -> None:
    s, model = stage(), Model()
    allowed = Principal("key", "acme", ("model:*",))
    denied = Principal("key", "acme", ("fn:*",))

    async def main() -> Context:
        await serve(s, request(chat_body()), model, allowed)
        _, _, ctx = await serve(s, request(chat_body()), model, denied)
        return ctx

    ctx = asyncio.run(main())
    assert len(model.bodies) == 2  # passed on, no cached answer: the API says 403
    assert ctx.decisions == {"ai_cache": {"outcome": "bypass", "reason": "uncacheable"}}


def test_tenants_do_not_share_entries() -> None:
    s, model = stage(), Model()

    async def main() -> list[bytes]:
        out = []
        for tenant in ("acme", "globex", "acme"):
            r, _, _ = await serve(s, request(chat_body()), model,
                                  Principal("key", tenant, ("*",)))
            out.append(headers(r)[b"x-edgefn-cache"])
        return out

    assert asyncio.run(main()) == [b"miss", b"miss", b"hit-exact"]


def test_embeddings_are_cached_and_rendered_in_the_format_asked() -> None:
    s, model = stage(), Model()
    body = json.dumps({"model": "all-minilm-l6-v2", "input": "hi"}).encode()
    b64 = json.dumps({"model": "all-minilm-l6-v2", "input": "hi",
                      "encoding_format": "base64"}).encode()

    async def main() -> list[bytes]:
        return [(await serve(s, request(b, b"/v1/embeddings"), model))[1] for b in (body, b64)]

    _, hit = asyncio.run(main())
    assert len(model.bodies) == 1
    assert json.loads(hit)["data"][0]["embedding"] == "AAAAPwAAgD4="  # 0.5, 0.25 as f32


def test_requests_it_does_not_take_pass_through_synchronously() -> None:
    s, model = stage(), Model()
    answer = Response(200)
    ctx = Context("c")
    r = Request(b"GET", b"/v1/models", b"", [], b"h", "1.1", True, "c")
    assert s(r, ctx, lambda req, c: answer) is answer
    # the API answers the first two with a 400; n = 2 is never cached: each says bypass
    for bad in (b"{", b'{"model": "m"}', chat_body(n=2)):
        ctx = Context("c")
        result = s(request(bad), ctx, model)
        assert not isinstance(result, Response)
        assert ctx.decisions == {"ai_cache": {"outcome": "bypass", "reason": "uncacheable"}}
        response = asyncio.run(result)  # type: ignore[arg-type]
        assert dict(response.headers)[b"x-edgefn-cache"] == b"bypass"
    assert len(model.bodies) == 3


def test_replay_renders_completions_too() -> None:
    r = Generated(("Once", " upon"), "length", 4, 2)
    body = replay.sse(r, MODEL, chat=False, include_usage=True)
    events = [json.loads(e[6:]) for e in body.split(b"\n\n") if e and e != b"data: [DONE]"]
    assert [e["choices"][0]["text"] for e in events[:3]] == ["Once", " upon", ""]
    assert events[2]["choices"][0]["finish_reason"] == "length" and events[3]["choices"] == []
    plain = replay.completion(r, MODEL, chat=False)
    assert plain["object"] == "text_completion" and plain["choices"][0]["text"] == "Once upon"


def test_a_call_a_lower_tier_forwarded_is_scoped_to_the_tenant_it_names() -> None:
    """An upper tier's anonymous calls from edges were all tenant "": one tenant's
    cached answer served another's question, and no purge by tenant reached it."""
    from runtime.pipeline.stages.ai_cache import _asked

    body = json.dumps({"model": "m", "temperature": 0,
                       "messages": [{"role": "user", "content": "Hi"}]}).encode()
    calls = {t: _asked("chat", body, None, t) for t in ("globex", "initech", None)}
    assert {t: a.call.tenant for t, a in calls.items() if a is not None} == {
        "globex": "globex", "initech": "initech", None: ""}
    assert len({a.call.key for a in calls.values() if a is not None}) == 3
    who = Principal(kind="key", tenant="acme", key_id="k", scopes=("model:*",))
    asked = _asked("chat", body, who, "globex")
    assert asked is not None and asked.call.tenant == "acme"  # a principal comes first


def test_max_completion_tokens_is_read_as_the_api_reads_it() -> None:
    """`max_completion_tokens: 0` (the API's 400) fell through to `max_tokens` for the
    key, so a stored answer to `max_tokens: 8` was served to a request the API refuses."""
    from runtime.pipeline.stages.ai_cache import _asked

    def key(**fields: Any) -> bytes:
        body = json.dumps({"model": "m", "temperature": 0,
                           "messages": [{"role": "user", "content": "Hi"}], **fields}).encode()
        asked = _asked("chat", body, None, None)
        assert asked is not None
        return asked.call.key

    stored = key(max_tokens=8)
    assert key(max_tokens=8, max_completion_tokens=0) != stored
    assert key(max_tokens=3, max_completion_tokens=8) == stored == key(max_completion_tokens=8)
