"""What leaves a PoP for a pinned tenant's chat, over real HTTP: a real PoP in
region emea whose model worker forwards ``echo`` to an OpenAI-compatible upstream
in region americas (a fake server on loopback that records every request it
gets). A pinned tenant's chat, and its embeddings of a forwarded embedding model,
are refused before the hop (the upstream gets nothing); one allowed to leave
de-sensitised reaches it scrubbed (and a chat marked). Reranks (``/v1/rerank``) and
token counts (``/v1/tokenize``, which the upstream answers at vLLM's root
``/tokenize``) follow the same rule."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from runtime.ai.egress import DESENSITISED_RID
from runtime.security.keys import KeyStore
from runtime.security.residency import hashed_id
from tests.gpu_worker.test_upstream_engine import FakeUpstream
from tests.support import Running, function_dir, pop_thread, reactor

SECRET = "0123456789abcdef0123"
RESIDENCY = {"tenants": {"acme-eu": "emea", "acme-ds": "emea"}, "secret": SECRET,
             "allow_desensitised": ["acme-ds"],
             "uplink": {"models": ["echo", "embedder"],
                        "pops": [{"pop": "central", "tier": "central", "region": "americas"}]}}


@contextmanager
def upstream() -> Iterator[FakeUpstream]:
    """The fake upstream, served by a loop of its own on a thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    up = FakeUpstream()
    asyncio.run_coroutine_threadsafe(up.__aenter__(), loop).result(10)
    try:
        yield up
    finally:
        asyncio.run_coroutine_threadsafe(up.__aexit__(None, None, None), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, FakeUpstream,
                                                                      dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("egress")
    with upstream() as up:
        worker = tmp / "worker.toml"
        worker.write_text(f'[[models]]\nname = "central"\nengine = "openai"\n'
                          f'url = "{up.url}"\nmodels = ["echo", "embedder"]\n')
        with pop_thread(tmp / "data", ai=True, ai_config=str(worker), name="edge-eu",
                        region="emea", residency=RESIDENCY,
                        **{"ai_cache.enabled": False}) as pop:
            store = KeyStore(pop.data)
            keys = {t: store.create(t, ("*",))[0] for t in ("acme-eu", "acme-ds", "globex")}
            pop.admin.request("POST", "/v1/keys/reload")
            for owner in ("acme-eu", "acme-ds"):
                pop.deploy(embedder_function(tmp / owner, owner))
            yield pop, up, keys


def chat(pop: Running, key: str, text: str, rid: str) -> tuple[int, bytes]:
    body = {"model": "echo", "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
    status, _, out = pop.request("POST", "/v1/chat/completions", json.dumps(body).encode(), {
        "authorization": f"Bearer {key}", "content-type": "application/json",
        "x-request-id": rid}, timeout=30)
    return status, out


def embedder_function(folder: Path, owner: str) -> Path:
    """A Python function of `owner` that embeds ?q= with the forwarded model."""
    folder.mkdir()
    (folder / "edgefn.toml").write_text(
        f'name = "embed-{owner}"\nruntime = "python"\nentry = "main.py"\n'
        f'routes = ["/embed/{owner}"]\nowner = "{owner}"\n[bindings]\nai = true\n')
    (folder / "main.py").write_text(
        "from edgefn import Response\n\n\ndef handle(request, env):\n"
        "    try:\n"
        "        env.ai().embed([request.query['q']], model='embedder')\n"
        "    except Exception as e:\n"
        "        return Response(str(e), status=502)\n"
        "    return Response('embedded')\n")
    return folder


def embed(pop: Running, key: str, text: str) -> tuple[int, bytes]:
    body = {"model": "embedder", "input": [text]}
    status, _, out = pop.request("POST", "/v1/embeddings", json.dumps(body).encode(), {
        "authorization": f"Bearer {key}", "content-type": "application/json"}, timeout=30)
    return status, out


def embeddings_sent(up: FakeUpstream) -> list[object]:
    return [b["input"] for m, p, h, b in list(up.requests) if p == "/v1/embeddings"]


def chats_sent(up: FakeUpstream) -> list[tuple[dict[str, str], dict[str, object]]]:
    return [(h, b) for m, p, h, b in list(up.requests) if p == "/v1/chat/completions"]


def test_a_pinned_tenants_chat_is_refused_before_it_leaves(setup: tuple[
        Running, FakeUpstream, dict[str, str]]) -> None:
    pop, up, keys = setup
    before = len(chats_sent(up))
    status, out = chat(pop, keys["acme-eu"], "hello", "rid-pinned")
    assert status == 451, out
    error = json.loads(out)["error"]
    assert error["code"] == "residency_violation"
    assert error["message"] == ("tenant 'acme-eu' is pinned to region 'emea': model 'echo' "
                                "would need central 'central' in region 'americas'; not "
                                "forwarded by PoP 'edge-eu'")
    assert len(chats_sent(up)) == before, "the upstream got nothing"
    assert chat(pop, keys["globex"], "hello", "rid-other")[0] == 200  # unpinned: as before
    assert len(chats_sent(up)) == before + 1


def test_a_tenant_that_allows_it_leaves_scrubbed_and_marked(setup: tuple[
        Running, FakeUpstream, dict[str, str]]) -> None:
    pop, up, keys = setup
    mark = f"dsmark{uuid.uuid4().hex[:8]}"
    rid = f"rid-{mark}"
    status, out = chat(pop, keys["acme-ds"], f"write to {mark}@example.com or "
                       "+44 20 7946 0958 from 10.1.2.3", rid)
    assert status == 200, out
    headers, body = chats_sent(up)[-1]
    assert body["messages"] == [{"role": "user",
                                 "content": "write to [email] or [phone] from [ip]"}]
    assert headers["x-edgefn-desensitised"] == hashed_id(SECRET, "acme-ds")
    assert headers["x-request-id"] == DESENSITISED_RID + hashed_id(SECRET, rid)
    assert "x-edgefn-tenant" not in headers
    sent = json.dumps([headers, body])
    assert mark not in sent and "acme-ds" not in sent and "7946" not in sent


def test_a_pinned_tenants_embeddings_are_refused_before_they_leave(setup: tuple[
        Running, FakeUpstream, dict[str, str]]) -> None:
    pop, up, keys = setup
    before = len(embeddings_sent(up))
    status, out = embed(pop, keys["acme-eu"], "hello")
    assert status == 451, out
    error = json.loads(out)["error"]
    assert error["code"] == "residency_violation"
    assert "model 'embedder' would need central 'central' in region 'americas'" in \
        error["message"]
    assert len(embeddings_sent(up)) == before, "the upstream got nothing"
    assert embed(pop, keys["globex"], "hello there")[0] == 200  # unpinned: as before
    assert embeddings_sent(up)[-1] == ["hello there"]


def test_embeddings_a_tenant_allows_to_leave_go_scrubbed(setup: tuple[
        Running, FakeUpstream, dict[str, str]]) -> None:
    pop, up, keys = setup
    mark = f"dsmark{uuid.uuid4().hex[:8]}"
    status, out = embed(pop, keys["acme-ds"], f"mail {mark}@example.com from 10.1.2.3")
    assert status == 200, out
    assert embeddings_sent(up)[-1] == ["mail [email] from [ip]"]


def test_a_function_of_a_pinned_tenant_embeds_under_the_same_rule(setup: tuple[
        Running, FakeUpstream, dict[str, str]]) -> None:
    """The ai binding's embed: refused for acme-eu, masked for acme-ds."""
    pop, up, _ = setup
    before = len(embeddings_sent(up))
    status, _, out = pop.get("/embed/acme-eu?q=hello", timeout=30)
    assert status == 502, out
    assert b"ai.embed: tenant 'acme-eu' is pinned to region 'emea': model 'embedder'" in out, out
    assert len(embeddings_sent(up)) == before, "the upstream got nothing"
    status, _, out = pop.get("/embed/acme-ds?q=jane.doe%40example.com", timeout=30)
    assert (status, out) == (200, b"embedded")
    assert embeddings_sent(up)[-1] == ["[email]"]


def _wat_string(data: bytes) -> str:
    return "".join(f"\\{b:02x}" for b in data)


def chatting_functions(folder: Path) -> tuple[Path, Path]:
    """Functions of unpinned globex, callable by any key, whose ai binding chats
    with the forwarded model a prompt of the request's (Python: ?q=; WASM: a fixed
    marker)."""
    py = folder / "py"
    py.mkdir(parents=True)
    (py / "edgefn.toml").write_text(
        'name = "chat-py"\nruntime = "python"\nentry = "main.py"\nroutes = ["/chat-py"]\n'
        'owner = "globex"\nauth = "key"\n[bindings]\nai = true\n')
    (py / "main.py").write_text(
        "from edgefn import Response\n\n\ndef handle(request, env):\n"
        "    try:\n"
        "        env.ai().chat([{'role': 'user', 'content': request.query['q']}],\n"
        "                      model='echo', max_tokens=2)\n"
        "    except Exception as e:\n"
        "        return Response(str(e), status=502)\n"
        "    return Response('chatted')\n")
    args = json.dumps({"model": "echo", "max_tokens": 2,
                       "messages": [{"role": "user", "content": "wasmmark"}]}).encode()
    wat = reactor(
        f"(drop (call $call (i32.const 2048) (i32.const 7) (i32.const 2100) "
        f"(i32.const {len(args)}) (i32.const 8192) (i32.const 4096)))",
        prelude=f'(data (i32.const 2048) "ai.chat")\n'
                f'  (data (i32.const 2100) "{_wat_string(args)}")',
        imports='(import "edgefn" "call" (func $call (param i32 i32 i32 i32 i32 i32) '
                "(result i64)))")
    wasm = function_dir(folder, "chat-wasm", wat,
                        extra='owner = "globex"\nauth = "key"\n[bindings]\nai = true')
    return py, wasm


def test_a_pinned_callers_prompt_keeps_to_its_region_in_another_owners_function(
        setup: tuple[Running, FakeUpstream, dict[str, str]], tmp_path: Path) -> None:
    """The binding's residency was its owner's: a pinned tenant calling a function of
    an unpinned owner had its prompt sent out of its region (central logged it)."""
    pop, up, keys = setup
    py, wasm = chatting_functions(tmp_path)
    pop.deploy(py)
    pop.deploy(wasm)
    before = len(chats_sent(up))
    for path, key in (("/chat-py?q=pymark", keys["acme-eu"]), ("/chat-wasm", keys["acme-eu"])):
        status, _, out = pop.request("GET", path, headers={"authorization": f"Bearer {key}"},
                                     timeout=30)
        assert status in (500, 502), (path, status, out)
        assert b"tenant 'acme-eu' is pinned to region 'emea'" in out, (path, out)
    assert len(chats_sent(up)) == before, "the upstream got nothing"
    status, _, out = pop.request("GET", "/chat-py?q=mine",
                                 headers={"authorization": f"Bearer {keys['globex']}"},
                                 timeout=30)
    assert (status, out) == (200, b"chatted")  # an unpinned caller's goes, as before
    status, _, out = pop.request("GET", "/chat-wasm",
                                 headers={"authorization": f"Bearer {keys['globex']}"},
                                 timeout=30)
    assert (status, out) == (200, b"ok"), out
    sent = [json.dumps(b) for _, b in chats_sent(up)[before:]]
    assert len(sent) == 2 and "mine" in sent[0] and "wasmmark" in sent[1]


def rerank(pop: Running, key: str, query: str, documents: list[str]) -> tuple[int, bytes]:
    body = {"model": "embedder", "query": query, "documents": documents}
    status, _, out = pop.request("POST", "/v1/rerank", json.dumps(body).encode(), {
        "authorization": f"Bearer {key}", "content-type": "application/json"}, timeout=30)
    return status, out


def count(pop: Running, key: str, prompt: str) -> tuple[int, bytes]:
    body = {"model": "echo", "prompt": prompt}
    status, _, out = pop.request("POST", "/v1/tokenize", json.dumps(body).encode(), {
        "authorization": f"Bearer {key}", "content-type": "application/json"}, timeout=30)
    return status, out


def sent_to(up: FakeUpstream, *paths: str) -> list[tuple[dict[str, str], dict[str, object]]]:
    return [(h, b) for m, p, h, b in list(up.requests) if p in paths]


COUNTS = ("/v1/tokenize", "/tokenize")  # the PoP's path, then vLLM's root one


def test_a_pinned_tenants_rerank_and_token_count_are_refused_before_they_leave(setup: tuple[
        Running, FakeUpstream, dict[str, str]]) -> None:
    pop, up, keys = setup
    reranks, counts = len(sent_to(up, "/v1/rerank")), len(sent_to(up, *COUNTS))
    for status, out in (rerank(pop, keys["acme-eu"], "fresh bread", ["bread", "tide"]),
                        count(pop, keys["acme-eu"], "one two three")):
        assert status == 451, out
        error = json.loads(out)["error"]
        assert error["code"] == "residency_violation", out
        assert "tenant 'acme-eu' is pinned to region 'emea'" in error["message"], out
    assert len(sent_to(up, "/v1/rerank")) == reranks, "the upstream got no rerank"
    assert len(sent_to(up, *COUNTS)) == counts, "the upstream got no count"
    # unpinned: as it came
    status, out = rerank(pop, keys["globex"], "fresh bread", ["the tide", "fresh bread"])
    assert status == 200, out
    assert [r["index"] for r in json.loads(out)["results"]] == [1, 0]
    assert sent_to(up, "/v1/rerank")[-1][1]["documents"] == ["the tide", "fresh bread"]
    status, out = count(pop, keys["globex"], "one two three")
    assert (status, json.loads(out)) == (200, {"count": 3}), out


def test_rerank_and_counts_a_tenant_allows_to_leave_go_scrubbed(setup: tuple[
        Running, FakeUpstream, dict[str, str]]) -> None:
    pop, up, keys = setup
    mark = f"dsmark{uuid.uuid4().hex[:8]}"
    status, out = rerank(pop, keys["acme-ds"], f"mail {mark}@example.com",
                         [f"call +44 20 7946 0958 {mark}", "from 10.1.2.3"])
    assert status == 200, out
    headers, body = sent_to(up, "/v1/rerank")[-1]
    assert body["query"] == "mail [email]"
    assert body["documents"] == [f"call [phone] {mark}", "from [ip]"]
    assert headers["x-request-id"].startswith(DESENSITISED_RID)
    assert "x-edgefn-tenant" not in headers and "acme-ds" not in json.dumps(headers)
    status, out = count(pop, keys["acme-ds"], f"write to {mark}@example.com now")
    assert (status, json.loads(out)) == (200, {"count": 4}), out
    headers, body = sent_to(up, *COUNTS)[-1]
    assert body["prompt"] == "write to [email] now"
    assert headers["x-request-id"].startswith(DESENSITISED_RID)
    assert "acme-ds" not in json.dumps([headers, body]) and "example.com" not in \
        json.dumps(body)
