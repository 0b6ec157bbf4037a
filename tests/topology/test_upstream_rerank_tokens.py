"""Rerank and token counts go upstream like chat and embeddings: two real PoPs on
loopback sharing a topology secret, an edge whose model worker forwards every model
(an ``openai`` engine) to a regional PoP that runs the packaged models in its real
worker. Through the edge, ``/v1/rerank``, ``/v1/tokenize`` and a function's
``ai.rerank`` answer as the regional does, and the regional counts each in the
caller's fair share (``calls_by_client``); an upstream that is down is a clear 502,
a bad input a clear 4xx. With three tiers (edge -> regional -> central), a token
count reaches central in the caller's share."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from runtime.security.keys import KeyStore
from tests.support import Running, pop_thread, python_function
from tests.topology.tiers import forwarding, three_tiers

SECRET = "0123456789abcdef0123"
CHAT, EMBED = "smollm2-135m", "all-minilm-l6-v2"
REGIONAL_PORT, EDGE_PORT, DOWN_PORT = 28410, 28411, 28412  # this suite's range: 28400-28599
NOTHING_PORT = 28413  # nothing listens there: an upstream that is down
CENTRAL_PORT = 28414  # and the next two: the three tiers
QUERY = "how do I keep bread fresh"
DOCS = ["Store bread in a paper bag at room temperature.", "The tide comes in twice a day.",
        "Freeze sliced bread and toast it from frozen."]
MESSAGES = [{"role": "user", "content": "Name three rivers in Europe, please."}]
RERANKER = f"""import json

from edgefn import Response


def handle(request, env):
    ranked = env.ai().rerank({QUERY!r}, {DOCS!r}, model="{EMBED}")
    return Response(json.dumps(ranked))
"""


@pytest.fixture(scope="module")
def tiers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Running,
                                                                      dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("upstream-calls")
    off = {"ai_cache.enabled": False}
    with pop_thread(tmp / "reg", REGIONAL_PORT, ai=True, name="reg", tier="regional",
                    residency={"secret": SECRET}, **off) as reg, \
            pop_thread(tmp / "edge", EDGE_PORT, ai=True, ai_config=forwarding(
                tmp / "edge.toml", reg, [CHAT, EMBED]), name="edge",
                residency={"secret": SECRET}, **off) as edge:
        store = KeyStore(edge.data)
        keys = {t: store.create(t, ("*",))[0] for t in ("acme", "globex")}
        edge.admin.request("POST", "/v1/keys/reload")
        edge.deploy(python_function(tmp / "fns", "reranker", RERANKER,
                                    extra='owner = "initech"\n[bindings]\nai = true'))
        yield reg, edge, keys


def calls(pop: Running) -> dict[str, int]:
    """Model calls per client its worker counted ("" the anonymous share)."""
    return dict(pop.admin.request("GET", "/v1/ai/metrics")["calls_by_client"])


def grew(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {c: n - before.get(c, 0) for c, n in after.items() if n != before.get(c, 0)}


def post(pop: Running, path: str, body: dict[str, object], headers: dict[str, str] | None = None
         ) -> tuple[int, dict[str, object]]:
    status, _, out = pop.request("POST", path, json.dumps(body).encode(), {
        "content-type": "application/json", **(headers or {})}, timeout=60)
    return status, json.loads(out)


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def error_of(answer: dict[str, object]) -> tuple[object, str]:
    err = answer["error"]
    assert isinstance(err, dict), answer
    return err["code"], str(err["message"])


def test_rerank_through_the_edge_is_the_regionals_in_the_callers_share(
        tiers: tuple[Running, Running, dict[str, str]]) -> None:
    reg, edge, keys = tiers
    body = {"model": EMBED, "query": QUERY, "documents": DOCS, "top_n": 2}
    status, direct = post(reg, "/v1/rerank", body)
    assert status == 200, direct
    before = calls(reg)
    status, out = post(edge, "/v1/rerank", body, bearer(keys["acme"]))
    assert status == 200, out
    assert out["results"] == direct["results"] and out["usage"] == direct["usage"], out
    assert [r["index"] for r in out["results"]] == [0, 2]  # type: ignore[attr-defined]
    assert grew(before, calls(reg)) == {"tenant:acme": 1}


def test_a_token_count_through_the_edge_is_the_regionals_in_the_callers_share(
        tiers: tuple[Running, Running, dict[str, str]]) -> None:
    """``/v1/tokenize`` (vLLM's shape) counts as the regional's model reads the input:
    a chat's messages as its prompt_tokens, texts to embed as their tokens."""
    reg, edge, keys = tiers
    status, chat = post(reg, "/v1/chat/completions", {
        "model": CHAT, "messages": MESSAGES, "max_tokens": 1, "temperature": 0})
    assert status == 200, chat
    status, embedded = post(reg, "/v1/embeddings", {"model": EMBED, "input": DOCS})
    assert status == 200, embedded
    before = calls(reg)
    status, out = post(edge, "/v1/tokenize", {"model": CHAT, "messages": MESSAGES},
                       bearer(keys["globex"]))
    assert status == 200, out
    assert out["count"] == chat["usage"]["prompt_tokens"], (out, chat)  # type: ignore[index]
    status, out = post(edge, "/v1/tokenize", {"model": EMBED, "input": DOCS},
                       bearer(keys["globex"]))
    assert status == 200, out
    assert out["count"] == embedded["usage"]["prompt_tokens"], out  # type: ignore[index]
    assert grew(before, calls(reg)) == {"tenant:globex": 2}


def test_a_functions_rerank_counts_in_its_owners_share_upstream(
        tiers: tuple[Running, Running, dict[str, str]]) -> None:
    reg, edge, _ = tiers
    before = calls(reg)
    status, _, out = edge.get("/reranker", timeout=60)
    assert status == 200, out
    assert [r["index"] for r in json.loads(out)][:2] == [0, 2]
    assert grew(before, calls(reg)) == {"tenant:initech": 1}


@pytest.mark.parametrize(("path", "body", "status", "code", "says"), [
    ("/v1/rerank", {"model": EMBED, "query": QUERY, "documents": []}, 400, "invalid_request",
     "'documents' must not be empty"),
    ("/v1/rerank", {"model": "nope", "query": QUERY, "documents": DOCS}, 404,
     "model_not_found", "'nope' does not exist"),
    ("/v1/rerank", {"model": CHAT, "query": QUERY, "documents": DOCS}, 400, "invalid_request",
     f"model {CHAT!r} does not rerank"),  # the regional's own refusal, passed on
    ("/v1/tokenize", {"model": CHAT, "prompt": ""}, 400, "invalid_request", "empty"),
    ("/v1/tokenize", {"model": CHAT, "prompt": "a", "messages": MESSAGES}, 400,
     "invalid_request", "exactly one of"),
    ("/v1/tokenize", {"model": "nope", "prompt": "a"}, 404, "model_not_found",
     "'nope' does not exist"),
    # the other kind of model's input: said so (not "the prompt is empty")
    ("/v1/tokenize", {"model": EMBED, "prompt": "a"}, 400, "invalid_request",
     "is an embedding model: count the texts it embeds, given as 'input'"),
    ("/v1/tokenize", {"model": CHAT, "input": "a"}, 400, "invalid_request",
     "generates text: count its 'prompt' or 'messages'"),
])
def test_a_bad_call_through_the_edge_is_a_clear_4xx(
        tiers: tuple[Running, Running, dict[str, str]], path: str, body: dict[str, object],
        status: int, code: str, says: str) -> None:
    _, edge, keys = tiers
    got, out = post(edge, path, body, bearer(keys["acme"]))
    assert got == status, out
    assert error_of(out)[0] == code and says in error_of(out)[1], out


@pytest.fixture(scope="module")
def down(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """An edge whose upstream does not run."""
    tmp = tmp_path_factory.mktemp("upstream-down")
    with pop_thread(tmp / "edge", DOWN_PORT, ai=True, ai_config=forwarding(
            tmp / "edge.toml", NOTHING_PORT, [CHAT, EMBED]), name="edge",
            **{"ai_cache.enabled": False}) as edge:
        yield edge


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/rerank", {"model": EMBED, "query": QUERY, "documents": DOCS}),
    ("/v1/tokenize", {"model": CHAT, "messages": MESSAGES}),
])
def test_an_upstream_that_is_down_is_a_clear_502(down: Running, path: str,
                                                 body: dict[str, object]) -> None:
    status, out = post(down, path, body)
    assert status == 502, out
    code, message = error_of(out)
    assert code == "upstream_unavailable" and "upstream 'up' is unavailable" in message, out


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Running,
                                                                      dict[str, str]]]:
    """central (the real worker), a regional and an edge each forwarding to the next."""
    with three_tiers(tmp_path_factory.mktemp("upstream-three"), CENTRAL_PORT, SECRET,
                     CHAT) as chain:
        yield chain


def test_a_token_count_crosses_three_tiers_in_the_callers_share(
        three: tuple[Running, Running, dict[str, str]]) -> None:
    central, edge, keys = three
    status, direct = post(central, "/v1/tokenize", {"model": CHAT, "prompt": "Once upon"})
    assert status == 200, direct
    before = calls(central)
    rid = f"three-{uuid.uuid4().hex[:8]}"
    status, out = post(edge, "/v1/tokenize", {"model": CHAT, "prompt": "Once upon"},
                       {**bearer(keys["acme"]), "x-request-id": rid})
    assert status == 200, out
    assert out == direct
    assert grew(before, calls(central)) == {"tenant:acme": 1}
