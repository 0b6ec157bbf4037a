"""The AI caches end to end: a real PoP on loopback with the packaged models
(smollm2-135m, all-MiniLM-L6-v2 in the real worker), driven by the official
`openai` client, and a Python function's ``ai`` binding. Each test asks its
own questions, so none depends on another's entries."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from runtime.bindings.ai import AIBinding
from runtime.cache.ai.guards import DEFAULT_THRESHOLD, normalize
from runtime.security.keys import KeyStore
from tests.support import Running, pop_thread, python_function

CHAT = "smollm2-135m"


@pytest.fixture(scope="module")
def pop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with pop_thread(tmp_path_factory.mktemp("aicache-pop"), ai=True) as running:
        yield running


@pytest.fixture(scope="module")
def client(pop: Running) -> Iterator[openai.OpenAI]:
    with pop.openai(timeout=60) as c:
        yield c


def ask(client: openai.OpenAI, question: str, headers: dict[str, str] | None = None,
        **kw: Any) -> Any:
    return client.chat.completions.with_raw_response.create(  # type: ignore[call-overload]
        model=CHAT, messages=[{"role": "user", "content": question}],
        extra_headers=headers, **{"max_tokens": 12, "temperature": 0, **kw})


def test_a_repeated_question_is_an_exact_hit(client: openai.OpenAI) -> None:
    miss = ask(client, "Name a primary colour.")
    hit = ask(client, " Name a primary colour.\n")  # the same but for the space around it
    assert miss.headers["x-edgefn-cache"] == "miss"
    assert hit.headers["x-edgefn-cache"] == "hit-exact" and hit.headers["x-edgefn-cache-entry"]
    # spaces inside it and its stop are the exact cache's difference (they can be a
    # prompt's meaning: "Compute 5!", code), and the semantic cache's sameness
    near = ask(client, "Name a primary   colour")
    assert near.headers["x-edgefn-cache"] == "hit-semantic"
    assert near.headers["x-edgefn-cache-entry"] == hit.headers["x-edgefn-cache-entry"]
    a, b = miss.parse(), hit.parse()
    assert b.choices[0].message.content == a.choices[0].message.content and a.id != b.id
    assert b.usage.prompt_tokens_details.cached_tokens == a.usage.prompt_tokens > 0
    assert (b.usage.completion_tokens, b.choices[0].finish_reason) == (
        a.usage.completion_tokens, a.choices[0].finish_reason)


def test_a_streamed_answer_is_stored_and_replayed_as_a_valid_stream(
        client: openai.OpenAI) -> None:
    first = list(client.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "Count to three."}], max_tokens=12,
        temperature=0, stream=True))
    assert all(c.usage is None for c in first)  # usage the client did not ask for is dropped
    again = client.chat.completions.with_raw_response.create(
        model=CHAT, messages=[{"role": "user", "content": "Count to three."}], max_tokens=12,
        temperature=0, stream=True, stream_options={"include_usage": True})
    assert again.headers["x-edgefn-cache"] == "hit-exact"
    second = list(again.parse())

    def content(chunks: list[Any]) -> list[str | None]:
        return [c.choices[0].delta.content for c in chunks if c.choices]

    assert content(second) == content(first)  # the same chunks, role chunk and finish chunk
    assert second[-1].choices == [] and second[-1].usage.completion_tokens > 0
    assert second[-1].usage.prompt_tokens_details.cached_tokens == second[-1].usage.prompt_tokens
    plain = ask(client, "Count to three.")
    assert plain.headers["x-edgefn-cache"] == "hit-exact"
    assert plain.parse().choices[0].message.content == "".join(
        t or "" for t in content(first))


def test_a_paraphrase_is_a_semantic_hit_and_says_so(client: openai.OpenAI) -> None:
    first, paraphrase = "What is the capital of Italy?", "What's Italy's capital city?"
    vectors = [np.asarray(d.embedding) for d in client.embeddings.create(
        model="all-minilm-l6-v2", input=[normalize(first), normalize(paraphrase)]).data]
    similarity = float(vectors[0] @ vectors[1])
    assert similarity >= DEFAULT_THRESHOLD  # the premise (0.954 with MiniLM)
    a = ask(client, first).parse()
    hit = ask(client, paraphrase)
    assert hit.headers["x-edgefn-cache"] == "hit-semantic"
    assert float(hit.headers["x-edgefn-cache-similarity"]) == pytest.approx(similarity,
                                                                            abs=2e-4)
    assert hit.headers["x-edgefn-cache-entry"].startswith("aic-")
    assert hit.parse().choices[0].message.content == a.choices[0].message.content


def test_a_semantic_hits_usage_counts_the_callers_prompt(client: openai.OpenAI) -> None:
    """It showed the stored paraphrase's prompt_tokens (18 for a 35-token prompt)."""
    first = "How do I reverse a list in Python?"
    longer = "How can I reverse a list in Python, please?"
    stored = ask(client, first).parse()
    hit = ask(client, longer)
    if hit.headers["x-edgefn-cache"] != "hit-semantic":
        pytest.fail(f"the premise: {longer!r} is a semantic hit of {first!r}")
    fresh = ask(client, longer, {"cache-control": "no-store"}).parse()
    assert fresh.usage.prompt_tokens != stored.usage.prompt_tokens  # the premise: they differ
    got = hit.parse().usage
    assert got.prompt_tokens == fresh.usage.prompt_tokens
    assert got.prompt_tokens_details.cached_tokens == fresh.usage.prompt_tokens


def test_request_headers_bypass_and_refuse_bad_values(client: openai.OpenAI,
                                                      pop: Running) -> None:
    ask(client, "Name a planet.")
    for headers in ({"cache-control": "no-cache"}, {"x-edgefn-cache": "bypass"},
                    {"cache-control": "no-store"}):
        assert ask(client, "Name a planet.", headers).headers["x-edgefn-cache"] == "bypass"
    for name, value in (("x-edgefn-cache-ttl", "soon"), ("x-edgefn-cache-ttl", "-3"),
                        ("x-edgefn-cache", "hit-exact")):
        with pytest.raises(openai.BadRequestError) as err:
            ask(client, "Name a planet.", {name: value})
        assert err.value.body["param"] == name and name in err.value.body["message"]  # type: ignore[index]


def test_concurrent_identical_requests_make_one_model_call(client: openai.OpenAI) -> None:
    outcomes: list[str] = []
    go = threading.Barrier(6)

    def one() -> None:
        go.wait()
        outcomes.append(ask(client, "Name an ocean.").headers["x-edgefn-cache"])

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcomes) == ["hit-exact"] * 5 + ["miss"]


def test_embeddings_are_cached(client: openai.OpenAI) -> None:
    a = client.embeddings.with_raw_response.create(model="all-minilm-l6-v2",
                                                   input=["an edge cache"])
    b = client.embeddings.with_raw_response.create(model="all-minilm-l6-v2",
                                                   input=["an edge cache"])
    assert (a.headers["x-edgefn-cache"], b.headers["x-edgefn-cache"]) == ("miss", "hit-exact")
    assert b.parse().data[0].embedding == pytest.approx(a.parse().data[0].embedding, abs=1e-6)


ASKER = """
import json
from edgefn import Response


def handle(request, env):
    ai = env.ai()
    q = [{"role": "user", "content": request.query.get("q", "hi")}]
    out = []
    for cache in (True, True, False):
        r = ai.chat(q, max_tokens=8, temperature=0, cache=cache)
        out.append([r["cache"]["outcome"], r["text"], r["usage"].get("cached_tokens")])
    e = [ai._call("ai.embed", {"model": "all-minilm-l6-v2", "input": "x"}, True)["cache"]
         ["outcome"] for _ in range(2)]
    return Response.json({"chats": out, "embeds": e})
"""


def test_a_functions_ai_binding_goes_through_the_cache(pop: Running, tmp_path: Path) -> None:
    pop.deploy(python_function(tmp_path, "asker", ASKER, limits="wall_ms = 60000",
                               extra="[bindings]\nai = true\n"))
    status, _, body = pop.request("GET", "/asker?q=Name+a+fruit.", timeout=60)
    assert status == 200, body
    out = json.loads(body)
    (o1, t1, c1), (o2, t2, c2), (o3, t3, _) = out["chats"]
    assert (o1, o2, o3) == ("miss", "hit-exact", "bypass") and t1 == t2 == t3
    assert c1 is None and c2 is not None and c2 > 0
    assert out["embeds"] == ["miss", "hit-exact"]
    rows = [r for r in pop.pop.stores.cache_stats.snapshot()
            if (r["cache"], r["function"]) == ("ai", "asker")]
    assert {r["model"]: r["hits"] for r in rows} == {CHAT: 1, "all-minilm-l6-v2": 1}


STREAMER = """
import json
from edgefn import Response


def handle(request, env):
    ai = env.ai()
    q = [{"role": "user", "content": request.query.get("q", "hi")}]
    if request.query.get("shaped"):  # the cache's key has no response_format or bias
        list(ai.chat(q, stream=True, max_tokens=8, temperature=0))
        shaped = ai.chat(q, stream=True, max_tokens=8, temperature=0,
                         response_format={"type": "json_object"})
        list(shaped)
        done = [ai.complete("Once upon", max_tokens=4, temperature=0, logit_bias={"1": -5})
                for _ in range(2)]
        return Response.json([shaped.cache["outcome"], *(d["cache"]["outcome"] for d in done)])
    if request.query.get("twice"):  # the second opened before the first is read
        a, b = (ai.chat(q, stream=True, max_tokens=8, temperature=0) for _ in range(2))
        return Response.json([a.cache["outcome"], b.cache["outcome"], list(a) == list(b)])
    out = []
    for cache in (True, True, False):
        s = ai.chat(q, stream=True, max_tokens=8, temperature=0, cache=cache)
        chunks = list(s)
        out.append([s.cache["outcome"], chunks, s.result])
    if request.query.get("plain"):  # a streamed miss stored: a plain call hits it
        out.append([ai.chat(q, max_tokens=8, temperature=0)["cache"]["outcome"]])
    return Response.json(out)
"""


def test_a_functions_streamed_chat_goes_through_the_cache(pop: Running, tmp_path: Path
                                                           ) -> None:
    """`ai.chat(stream=True)` never looked the cache up nor stored its answer: the same
    question streamed twice cost the model's tokens twice."""
    pop.deploy(python_function(tmp_path, "streamer", STREAMER, limits="wall_ms = 60000",
                               extra="[bindings]\nai = true\n"))
    status, _, body = pop.request("GET", "/streamer?q=Name+a+river.&plain=1", timeout=60)
    assert status == 200, body
    (o1, c1, r1), (o2, c2, r2), (o3, c3, _), (o4,) = json.loads(body)
    assert (o1, o2, o3, o4) == ("miss", "hit-exact", "bypass", "hit-exact")
    assert c1 == c2 and "".join(c1) == "".join(c3) and len(c1) > 1  # chunks as they came
    assert r2["usage"]["cached_tokens"] == r2["usage"]["prompt_tokens"] > 0
    assert "cached_tokens" not in r1["usage"] and r1["finish_reason"] == r2["finish_reason"]
    rows = [r for r in pop.pop.stores.cache_stats.snapshot()
            if (r["cache"], r["function"]) == ("ai", "streamer")]
    assert [r["hits"] for r in rows] == [2]
    # a shaped call is no key's answer: a plain entry served it (and it stored its own)
    status, _, body = pop.request("GET", "/streamer?q=Name+a+sea.&shaped=1", timeout=60)
    assert (status, json.loads(body)) == (200, ["bypass", "bypass", "bypass"]), body
    # nothing waits on a stream in flight: this one waited on itself to its wall limit
    status, _, body = pop.request("GET", "/streamer?q=Name+a+lake.&twice=1", timeout=30)
    assert (status, json.loads(body)) == (200, ["miss", "miss", True]), body


def test_a_stream_that_a_purge_overtook_stores_nothing(pop: Running) -> None:
    """The binding stores a streamed miss when it ends, with no flight a purge could
    mark: a purge meanwhile must still keep its answer out."""
    assert pop.loop is not None and pop.pop.ai is not None
    binding = AIBinding(pop.pop.ai, "purged-stream", cache=pop.pop.stores.ai_cache)
    q = {"model": CHAT, "messages": [{"role": "user", "content": "Name a mountain."}],
         "max_tokens": 6, "temperature": 0}

    async def stream(purge: bool) -> str:
        opened = await binding.call("chat_stream", dict(q))
        if purge:
            assert binding.cache is not None
            binding.cache.purge(model=CHAT)
        while (await binding.call("chat_next", {"stream": opened["stream"]}))["done"] is None:
            pass
        return str(opened["cache"]["outcome"])

    def run(purge: bool) -> str:
        return asyncio.run_coroutine_threadsafe(stream(purge), pop.loop).result(60)  # type: ignore[arg-type]

    assert [run(True), run(False), run(False)] == ["miss", "miss", "hit-exact"]


def test_a_function_may_turn_its_cache_off(pop: Running, tmp_path: Path) -> None:
    pop.deploy(python_function(tmp_path, "uncached", ASKER, limits="wall_ms = 60000",
                               extra="[bindings]\nai = true\n[cache.ai]\nenabled = false\n"))
    status, _, body = pop.request("GET", "/uncached?q=Name+a+tree.", timeout=60)
    assert status == 200, body
    assert [c[0] for c in json.loads(body)["chats"]] == ["bypass"] * 3


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, str, str]]:
    """A PoP whose callers have API keys: tenant "acme" with 100 tokens a minute,
    tenant "globex" with plenty."""
    data = tmp_path_factory.mktemp("aicache-keys") / "data"
    data.mkdir()
    acme, _ = KeyStore(data).create("acme", ("*",), tpm=100)
    globex, _ = KeyStore(data).create("globex", ("*",), tpm=100_000)
    with pop_thread(data, ai=True) as running:
        yield running, acme, globex


def test_hits_spend_no_tokens_and_tenants_do_not_share(keyed: tuple[Running, str, str]
                                                       ) -> None:
    pop, acme, globex = keyed
    clients = [openai.OpenAI(base_url=f"http://{pop.host}:{pop.port}/v1", api_key=k,
                             max_retries=0, timeout=60) for k in (acme, globex)]
    try:
        outcomes = [ask(clients[0], "Say yes.").headers["x-edgefn-cache"] for _ in range(8)]
        other = ask(clients[1], "Say yes.")
        with pytest.raises(openai.RateLimitError):  # a miss still pays: 8 x 30 > 100 tokens
            for i in range(4):
                ask(clients[0], f"Say yes {i} times.", max_tokens=60)
    finally:
        for c in clients:
            c.close()
    # 8 asks of ~20 tokens each would be over 100: only the first reached the model
    assert outcomes == ["miss"] + ["hit-exact"] * 7
    assert other.headers["x-edgefn-cache"] == "miss"  # acme's entry is not globex's


def test_completions_are_cached_and_replayed_streamed(client: openai.OpenAI) -> None:
    ask_ = {"model": CHAT, "prompt": "The sky is", "max_tokens": 8, "temperature": 0}
    miss = client.completions.with_raw_response.create(**ask_)  # type: ignore[call-overload]
    hit = client.completions.with_raw_response.create(**ask_)  # type: ignore[call-overload]
    assert (miss.headers["x-edgefn-cache"], hit.headers["x-edgefn-cache"]) == ("miss",
                                                                               "hit-exact")
    text = miss.parse().choices[0].text
    assert hit.parse().choices[0].text == text
    chunks = list(client.completions.create(stream=True, **ask_))  # type: ignore[call-overload]
    assert "".join(c.choices[0].text for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == miss.parse().choices[0].finish_reason
