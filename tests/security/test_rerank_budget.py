"""A rerank is charged to the caller's token budget as an embedding is: it reserves
its query and documents (counted by the model's tokenizer) before the model reads
them, is refused as an embedding over budget is (429 ``token_budget`` in OpenAI's
shape over HTTP; `BindingError` in a function), and is charged what it read.

Before, neither ``/v1/rerank`` nor a function's ``ai.rerank`` asked the budget: a key
or tenant out of tokens was still served reranks of up to 24 MiB of documents.

A real PoP on loopback with the real model worker (its default tiny embedder).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.ai.openai_api import OpenAIApi
from runtime.security.keys import KeyStore
from runtime.security.ratelimit.budget import MemoryBudgetStore
from tests.support import Running, pop_thread, python_function

EMBED = "all-minilm-l6-v2"
QUERY = "fresh bread from the bakery"
DOCUMENTS = ["a loaf of sourdough bread baked this morning",
             "the tide tables for the harbour this week",
             "croissants and rolls from the corner bakery"]
TPM = 100  # one rerank of QUERY and DOCUMENTS (about 40 tokens) fits, three do not
TENANTS = {"fn-rank": {"tpm": TPM}}

RANKER = '''
from edgefn import BindingError, Response


def handle(request, env):
    body = request.json()
    try:
        results = env.ai().rerank(body["query"], body["documents"])
    except BindingError as e:
        return Response.json({"error": str(e)}, status=429)
    return Response.json({"results": results})
'''


@pytest.fixture(scope="module")
def pop_and_key(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, str]]:
    """The PoP with the worker, and an API key of TPM tokens a minute (made before
    the PoP starts: it reads new keys only every few seconds)."""
    data = tmp_path_factory.mktemp("rerank-budget") / "data"
    data.mkdir()
    key, _ = KeyStore(data).create("rank-http", ("*",), tpm=TPM)
    with pop_thread(data, ai=True, **{"ratelimit.tenants": TENANTS}) as running:
        yield running, key


def on_pop[T](pop: Running, coro: Awaitable[T], timeout: float = 60) -> T:
    async def main() -> T:
        return await coro

    assert pop.loop is not None
    return asyncio.run_coroutine_threadsafe(main(), pop.loop).result(timeout)


def api(pop: Running) -> OpenAIApi:
    return next(s for s in pop.pop.pipeline.stages if s.name == "openai").api  # type: ignore[no-any-return]


def counted(pop: Running, texts: list[str]) -> int:
    """The tokens the embedder reads for `texts` (what a rerank of them reports)."""
    return on_pop(pop, api(pop).ai.client.count_tokens(EMBED, inputs=texts))


def used(pop: Running, prefix: str) -> int:
    """What the buckets named `prefix`... hold now, over all their windows."""
    store = api(pop).budgets.store  # type: ignore[union-attr]
    assert isinstance(store, MemoryBudgetStore)
    return sum(v for (bucket, _), v in store.windows.items() if bucket.startswith(prefix))


def post(pop: Running, key: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any],
                                                                            dict[str, str]]:
    status, headers, out = pop.request("POST", path, json.dumps(body).encode(), {
        "authorization": f"Bearer {key}", "content-type": "application/json"}, timeout=60)
    return status, json.loads(out), headers


def test_a_keys_rerank_reserves_its_input_and_is_refused_as_an_embedding_is(
        pop_and_key: tuple[Running, str]) -> None:
    pop, key = pop_and_key
    rerank = {"model": EMBED, "query": QUERY, "documents": DOCUMENTS}
    tokens = counted(pop, [QUERY, *DOCUMENTS])
    assert 2 * tokens <= TPM < 3 * tokens, tokens

    status, first, _ = post(pop, key, "/v1/rerank", rerank)  # within the budget: served
    assert status == 200, first
    assert first["usage"]["total_tokens"] == tokens
    assert used(pop, "key:") == tokens  # charged what it read (before: nothing)

    status, second, _ = post(pop, key, "/v1/rerank", rerank)
    assert status == 200, second
    assert used(pop, "key:") == 2 * tokens

    # the budget left is less than one more rerank: refused before the model reads it
    status, refused, headers = post(pop, key, "/v1/rerank", rerank)
    assert status == 429, refused  # (before: 200)
    assert refused["error"]["code"] == "token_budget"
    assert f"this request reserves {tokens}" in refused["error"]["message"]
    assert 1 <= int(headers["retry-after"]) <= 60
    assert used(pop, "key:") == 2 * tokens  # a refusal charges nothing

    # as an embedding of the same texts is refused
    status, embed, embed_headers = post(pop, key, "/v1/embeddings",
                                        {"model": EMBED, "input": [QUERY, *DOCUMENTS]})
    assert status == 429 and "retry-after" in embed_headers, embed
    assert {k: v for k, v in embed["error"].items() if k != "message"} == \
        {k: v for k, v in refused["error"].items() if k != "message"}
    assert embed["error"]["message"] == refused["error"]["message"]

    # one larger than the whole budget: the 400 an embedding that large gets
    many = {"model": EMBED, "query": QUERY, "documents": DOCUMENTS * 4}
    status, too_big, _ = post(pop, key, "/v1/rerank", many)
    assert status == 400 and too_big["error"]["code"] == "token_budget", too_big
    assert used(pop, "key:") == 2 * tokens


def test_a_functions_rerank_is_charged_to_its_tenant(pop_and_key: tuple[Running, str],
                                                     tmp_path: Path) -> None:
    pop, _ = pop_and_key
    pop.deploy(python_function(tmp_path, "ranker", RANKER, limits="wall_ms = 60000",
                               extra='owner = "fn-rank"\n[bindings]\nai = true'))
    tokens = counted(pop, [QUERY, *DOCUMENTS])
    body = json.dumps({"query": QUERY, "documents": DOCUMENTS}).encode()

    for n in (1, 2):  # within the budget: served, and charged what it read
        status, _, out = pop.request("POST", "/ranker", body, timeout=60)
        assert status == 200, out
        assert sorted(r["index"] for r in json.loads(out)["results"]) == [0, 1, 2]
        assert used(pop, "tenant:fn-rank") == n * tokens  # (before: 0)

    status, _, out = pop.request("POST", "/ranker", body, timeout=60)
    assert status == 429, out  # the BindingError the function caught (before: served)
    error = json.loads(out)["error"]
    assert error.startswith("ai.rerank: token budget of tenant 'fn-rank' exhausted"), error
    assert used(pop, "tenant:fn-rank") == 2 * tokens

    # the worker's own refusal of an empty document, before any charge
    status, _, out = pop.request("POST", "/ranker", json.dumps(
        {"query": QUERY, "documents": ["bread", ""]}).encode(), timeout=60)
    assert status == 429 and "'documents'[1] is an empty string" in json.loads(out)["error"]
