"""Token budgets on the real model worker (the default tiny models): prompts
counted with the model's tokenizer, reservations refunded after a short answer,
no overshoot under 32 concurrent streams, stream caps, and bad input.

No auth stage runs here, so each request passes through a chain of a stage that
sets the caller (a `Principal`, as auth would) and the PoP's own `openai` stage.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import openai
import pytest

from runtime.ai.openai_api import OpenAIApi
from runtime.net.message import Request, Response
from runtime.pipeline.chain import Chain
from runtime.pipeline.stage import Context, Next, Result
from runtime.security.keys import KeyStore
from runtime.security.principal import Principal
from runtime.security.ratelimit.budget import MemoryBudgetStore
from tests.support import EXAMPLES, Running, pop_thread

from .redis_server import RedisServer, redis_server  # noqa: F401

CHAT = "smollm2-135m"
EMBED = "all-minilm-l6-v2"
HELLO = [{"role": "user", "content": "Say hello."}]
TENANTS = {"refund": {"tpm": 10_000}, "crowd": {"tpm": 600}, "streams": {"max_streams": 2},
           "cut": {"tpm": 10_000}, "bad": {"tpm": 5_000}, "count": {"tpm": 100_000},
           "fn-team": {"tpm": 300}, "choices": {"tpm": 100}}
AI_C = EXAMPLES / "ai-c"


@pytest.fixture(scope="module")
def pop_and_key(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, str]]:
    """The PoP, and an API key of tenant "http" with 100 tokens a minute (made
    before the PoP starts: it reads new keys only every few seconds)."""
    data = tmp_path_factory.mktemp("budget-pop") / "data"
    data.mkdir()
    key, _ = KeyStore(data).create("http", ("*",), tpm=100)
    with pop_thread(data, ai=True, **{"ratelimit.tenants": TENANTS}) as running:
        yield running, key


@pytest.fixture(scope="module")
def pop(pop_and_key: tuple[Running, str]) -> Running:
    return pop_and_key[0]


class Caller:
    name = "caller"

    def __init__(self, principal: Principal) -> None:
        self.principal = principal

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        ctx.principal = self.principal
        return call_next(request, ctx)


def openai_stage(pop: Running) -> Any:
    return next(s for s in pop.pop.pipeline.stages if s.name == "openai")


def api(pop: Running) -> OpenAIApi:
    return openai_stage(pop).api  # type: ignore[no-any-return]


def on_pop[T](pop: Running, coro: Awaitable[T], timeout: float = 120) -> T:
    async def main() -> T:
        return await coro

    assert pop.loop is not None
    return asyncio.run_coroutine_threadsafe(main(), pop.loop).result(timeout)


async def post(pop: Running, tenant: str, path: bytes, body: dict[str, Any] | bytes,
               key: str = "k") -> Response:
    """One request as `tenant`'s key `key`, through the PoP's openai stage."""
    request = Request(b"POST", path, b"", [], b"localhost", "1.1", True, "127.0.0.1:1")
    request.body = body if isinstance(body, bytes) else msgspec.json.encode(body)
    who = Principal("key", tenant, scopes=("*",), key_id=f"{tenant}-{key}")
    app = Chain([Caller(who), openai_stage(pop)])
    result = app(request)
    return result if isinstance(result, Response) else await result


async def read_stream(response: Response, chunks: int | None = None) -> list[dict[str, Any]]:
    """The SSE events of a stream (the first `chunks` only, then it is closed as
    the HTTP front does when a client goes away)."""
    events: list[dict[str, Any]] = []
    body = response.body
    assert not isinstance(body, bytes)
    try:
        async for data in body:
            for line in data.split(b"\n"):
                if line.startswith(b"data: {"):
                    events.append(msgspec.json.decode(line[6:]))
            if chunks is not None and len(events) >= chunks:
                break
    finally:
        await body.aclose()  # type: ignore[attr-defined]
    return events


def used(pop: Running, tenant: str) -> int:
    """What the tenant's budget holds now, over all its windows."""
    store = api(pop).budgets.store  # type: ignore[union-attr]
    assert isinstance(store, MemoryBudgetStore)
    return sum(v for (bucket, _), v in store.windows.items() if bucket == f"tenant:{tenant}")


def test_prompts_are_counted_as_the_model_counts_them(pop: Running) -> None:
    async def main() -> tuple[int, int, int, int]:
        client = api(pop).ai.client
        counted = await client.count_tokens(CHAT, messages=HELLO)
        r = await post(pop, "count", b"/v1/chat/completions",
                       {"model": CHAT, "messages": HELLO, "max_tokens": 4})
        usage = msgspec.json.decode(r.body)["usage"]
        texts = ["edge functions", "a longer sentence about rate limits and budgets"]
        embed_counted = await client.count_tokens(EMBED, inputs=texts)
        out = await client.embed(EMBED, texts)
        return counted, usage["prompt_tokens"], embed_counted, out["tokens"]

    counted, prompt_tokens, embed_counted, embed_tokens = on_pop(pop, main())
    assert counted == prompt_tokens > 5
    assert embed_counted == embed_tokens > 5


def test_a_short_answer_is_refunded_what_it_did_not_use(pop: Running) -> None:
    async def main() -> tuple[int, dict[str, int]]:
        r = await post(pop, "refund", b"/v1/chat/completions",
                       {"model": CHAT, "messages": HELLO, "max_tokens": 400, "stop": [" "],
                        "temperature": 0})
        assert r.status == 200
        return used(pop, "refund"), msgspec.json.decode(r.body)["usage"]

    held, usage = on_pop(pop, main())
    assert usage["completion_tokens"] < 20  # short: the stop sequence ended it
    assert held == usage["total_tokens"]  # 400 - completion refunded, to the token


def test_n_choices_reserve_n_times_max_tokens_and_pay_the_prompt_once(pop: Running) -> None:
    def asking(n: int) -> dict[str, Any]:
        return {"model": CHAT, "messages": HELLO, "max_tokens": 40, "n": n, "temperature": 0}

    async def main() -> tuple[Response, Response, int]:
        three = await post(pop, "choices", b"/v1/chat/completions", asking(3))
        two = await post(pop, "choices", b"/v1/chat/completions", asking(2))
        return three, two, used(pop, "choices")

    three, two, held = on_pop(pop, main())
    # 3 x 40 and the prompt can never fit 100 a minute; 2 x 40 and the prompt can
    err = msgspec.json.decode(three.body)["error"]
    assert (three.status, err["code"], err["param"]) == (400, "token_budget", "max_tokens")
    assert "reserves 13" in err["message"], err
    assert two.status == 200, two.body
    usage = msgspec.json.decode(two.body)["usage"]
    assert held == usage["total_tokens"] and usage["completion_tokens"] > 40 // 2


def test_a_stream_cut_short_is_charged_what_it_could_have_used(pop: Running) -> None:
    async def main() -> tuple[int, int]:
        r = await post(pop, "cut", b"/v1/chat/completions",
                       {"model": CHAT, "messages": HELLO, "max_tokens": 1000, "stream": True})
        await read_stream(r, chunks=3)  # role, then two tokens: the client goes away
        prompt = await api(pop).ai.client.count_tokens(CHAT, messages=HELLO)
        return used(pop, "cut"), prompt

    held, prompt = on_pop(pop, main())
    # the prompt, what was read, and at most one flow-control window unread
    assert prompt + 2 <= held <= prompt + 2 + 64 + 1
    assert held < prompt + 1000


def test_32_concurrent_streams_never_overspend_the_tenant(pop: Running) -> None:
    tpm = TENANTS["crowd"]["tpm"]

    async def one(i: int) -> tuple[int, int]:
        r = await post(pop, "crowd", b"/v1/chat/completions",
                       {"model": CHAT, "messages": [{"role": "user", "content": f"Count to {i}."}],
                        "max_tokens": 24, "stream": True,
                        "stream_options": {"include_usage": True}}, key=str(i))
        if r.status != 200:
            return r.status, 0
        events = await read_stream(r)
        return 200, next(e["usage"]["total_tokens"] for e in events if e.get("usage"))

    async def main() -> list[tuple[int, int]]:
        return list(await asyncio.gather(*(one(i) for i in range(32))))

    results = on_pop(pop, main(), timeout=300)
    store = api(pop).budgets.store  # type: ignore[union-attr]
    assert isinstance(store, MemoryBudgetStore)
    windows = {w for (bucket, w) in store.windows if bucket == "tenant:crowd"}
    spent = sum(tokens for _, tokens in results)
    admitted = sum(status == 200 for status, _ in results)
    overshoot = max(0, spent - tpm)
    print(f"admitted {admitted}/32, spent {spent} of {tpm} tokens, overshoot {overshoot}")
    assert {status for status, _ in results} == {200, 429}  # the budget was binding
    assert admitted >= tpm // (40 + 24)  # a reservation is at most ~64 tokens here
    if len(windows) == 1:  # within one window the bound is exact
        assert overshoot == 0
    assert used(pop, "crowd") == spent  # every stream settled to its real usage


def test_streams_over_the_cap_are_refused_until_one_ends(pop: Running) -> None:
    body = {"model": CHAT, "messages": HELLO, "max_tokens": 200, "stream": True}

    async def main() -> tuple[int, bytes, int]:
        a = await post(pop, "streams", b"/v1/chat/completions", body)
        b = await post(pop, "streams", b"/v1/chat/completions", body, key="other")
        third = await post(pop, "streams", b"/v1/chat/completions", body)
        await read_stream(a, chunks=1)
        again = await post(pop, "streams", b"/v1/chat/completions", body)
        await read_stream(b, chunks=1)
        await read_stream(again, chunks=1)
        assert (a.status, b.status, again.status) == (200, 200, 200)
        return third.status, third.body, len(third.headers)  # type: ignore[return-value]

    status, raw, _ = on_pop(pop, main())
    err = msgspec.json.decode(raw)["error"]
    assert status == 429 and err["code"] == "too_many_streams"
    assert err["type"] == "rate_limit_error" and "at most 2" in err["message"]


@pytest.mark.parametrize(("path", "body", "status", "code"), [
    (b"/v1/chat/completions", b"{not json", 400, "invalid_json"),
    (b"/v1/chat/completions", b"", 400, "invalid_request"),
    (b"/v1/chat/completions", {"model": CHAT, "messages": HELLO, "max_tokens": 10**5}, 400,
     "token_budget"),  # more than the tenant's 5 000 a minute: it can never fit
    (b"/v1/chat/completions", {"model": CHAT, "messages": HELLO, "max_tokens": 10**9}, 400,
     "invalid_value"),  # past any model: refused before a budget is asked
    (b"/v1/chat/completions", {"model": "no-such-model", "messages": HELLO}, 404,
     "model_not_found"),
    (b"/v1/chat/completions", {"model": CHAT, "messages": HELLO, "max_tokens": "many"}, 400,
     "invalid_value"),
    (b"/v1/completions", {"model": CHAT, "prompt": ""}, 400, "invalid_request"),
    (b"/v1/embeddings", {"model": EMBED, "input": [""]}, 400, "invalid_request"),
    (b"/v1/embeddings", {"model": "no-such-model", "input": "x"}, 404, "model_not_found"),
])
def test_bad_input_is_a_clear_4xx_and_reserves_nothing(pop: Running, path: bytes,
                                                       body: dict[str, Any] | bytes,
                                                       status: int, code: str) -> None:
    response = on_pop(pop, post(pop, "bad", path, body))
    err = msgspec.json.decode(response.body)["error"]
    assert (response.status, err["code"]) == (status, code), err
    assert err["message"]
    assert used(pop, "bad") == 0


def test_a_functions_ai_calls_are_charged_to_its_tenant(pop: Running, tmp_path: Path) -> None:
    d = tmp_path / "ai-budget"
    d.mkdir()
    shutil.copy(AI_C / "ai.wasm", d / "ai.wasm")
    (d / "edgefn.toml").write_text(
        (AI_C / "edgefn.toml").read_text().replace('name = "ai-c"', 'name = "ai-budget"\n'
                                                   'owner = "fn-team"')
        .replace('["/ai-c"]', '["/ai-budget"]'))
    pop.deploy(d)
    chat = {"model": CHAT, "messages": HELLO, "temperature": 0}
    status, headers, body = pop.request("POST", "/ai-budget", json.dumps(
        {**chat, "max_tokens": 1000}).encode(), timeout=60)
    assert status == 500 and headers.get("x-edgefn-error") == "binding", body
    assert b"more than the 300 per minute of tenant 'fn-team'" in body
    assert used(pop, "fn-team") == 0
    status, _, body = pop.request("POST", "/ai-budget", json.dumps(
        {**chat, "max_tokens": 200, "stop": [" "]}).encode(), timeout=60)
    assert status == 200, body
    usage = json.loads(body)["usage"]
    assert used(pop, "fn-team") == usage["prompt_tokens"] + usage["completion_tokens"]
    before = used(pop, "fn-team")
    status, _, body = pop.request("POST", "/ai-budget", json.dumps(
        {"model": EMBED, "input": ["one", "two"]}).encode(), {"x-ai-op": "ai.embed"},
        timeout=60)
    assert status == 200, body
    assert used(pop, "fn-team") == before + json.loads(body)["tokens"] > before


def test_a_keys_token_budget_over_http_in_openais_shape(pop_and_key: tuple[Running, str]
                                                        ) -> None:
    pop, key = pop_and_key
    client = openai.OpenAI(base_url=f"http://{pop.host}:{pop.port}/v1", api_key=key,
                           max_retries=0, timeout=60)
    try:
        first = client.chat.completions.create(  # 12 prompt tokens + 80: 92 reserved
            model=CHAT, messages=HELLO, max_tokens=80, stop=[" "], temperature=0)  # type: ignore[arg-type]
        assert first.usage is not None and first.usage.total_tokens < 30
        with pytest.raises(openai.RateLimitError) as e:  # the first's usage + 92 > 100
            client.chat.completions.create(model=CHAT, messages=HELLO, max_tokens=80)  # type: ignore[arg-type]
        with pytest.raises(openai.BadRequestError) as never:
            client.chat.completions.create(model=CHAT, messages=HELLO, max_tokens=10**6)  # type: ignore[arg-type]
    finally:
        client.close()
    headers = e.value.response.headers
    assert e.value.code == "token_budget" and 1 <= int(headers["retry-after"]) <= 60
    assert headers["ratelimit-policy"] == '"key-tpm";q=100;w=60'
    assert never.value.code == "token_budget" and "lower max_tokens" in never.value.message


def test_a_redis_budget_is_shared_by_pops_and_closed_when_they_stop(
        pop: Running, tmp_path: Path, redis_server: RedisServer) -> None:  # noqa: F811
    """Two PoPs on the module's model worker and one Redis: a tenant's tokens are
    one budget across them, and each PoP closes its connections when it stops."""
    assert pop.pop.ai is not None
    shared = {"ai.socket": pop.pop.ai.client.socket_path, "ratelimit.storage": redis_server.url,
              "ratelimit.tenants": {"edge": {"tpm": 100}}}
    before = len(redis_server.client().client_list())
    with pop_thread(tmp_path / "a", ai=True, **shared) as a, \
            pop_thread(tmp_path / "b", ai=True, **shared) as b:
        body = {"model": CHAT, "messages": HELLO, "max_tokens": 60, "temperature": 0}
        first = on_pop(a, post(a, "edge", b"/v1/chat/completions", body))
        assert first.status == 200, first.body
        spent = json.loads(first.body)["usage"]["total_tokens"]
        second = on_pop(b, post(b, "edge", b"/v1/chat/completions", body))
        # the other PoP sees what the first spent: its 60 + prompt no longer fit in 100
        error = json.loads(second.body).get("error") or {}  # a 200 shows its body below
        assert (second.status, error.get("code")) == (429, "token_budget"), (
            spent, second.status, second.body)
        assert len(redis_server.client().client_list()) > before
    assert len(redis_server.client().client_list()) == before
