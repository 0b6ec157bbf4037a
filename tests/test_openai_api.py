"""The PoP's OpenAI-compatible API, driven by the official `openai` client against
a real PoP running the real model worker; and the `ai` binding from functions."""

from __future__ import annotations

import base64
import http.client
import json
import re
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from gpu_worker.adapters import write_random_lora
from gpu_worker.models import packaged_model
from runtime.topology.load import metric_sum

from .support import Running, free_port, pop_thread

CHAT = "smollm2-135m"
EMBED = "all-minilm-l6-v2"
HELLO = [{"role": "user", "content": "Say hello."}]
METRICS_PORT = free_port()


@pytest.fixture(scope="module")
def pop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with pop_thread(tmp_path_factory.mktemp("ai-pop"), ai=True,
                    **{"metrics.listen": f"127.0.0.1:{METRICS_PORT}"}) as running:
        yield running


@pytest.fixture(scope="module")
def client(pop: Running) -> Iterator[openai.OpenAI]:
    with pop.openai(timeout=60) as c:
        yield c


def raw(pop: Running, method: str, path: str, body: bytes = b"") -> tuple[int, Any]:
    conn = http.client.HTTPConnection(pop.host, pop.port, timeout=60)
    try:
        conn.request(method, path, body, {"content-type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, data
    finally:
        conn.close()


def test_chat_completion(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=CHAT, messages=HELLO,  # type: ignore[arg-type]
                                       max_tokens=12, temperature=0)
    assert r.object == "chat.completion" and r.model == CHAT
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None and r.usage.total_tokens == (r.usage.prompt_tokens
                                                            + r.usage.completion_tokens)


def test_chat_stream_with_usage_matches_the_plain_answer(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(model=CHAT, messages=HELLO,  # type: ignore[arg-type]
                                           max_tokens=12, temperature=0)
    stream = client.chat.completions.create(
        model=CHAT, messages=HELLO, max_tokens=12, temperature=0,  # type: ignore[arg-type]
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] in ("stop", "length") and all(f is None for f in finals[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens  # type: ignore[union-attr]


def test_stream_ends_with_done_marker(pop: Running) -> None:
    body = json.dumps({"model": CHAT, "messages": HELLO, "max_tokens": 4, "stream": True})
    status, data = raw(pop, "POST", "/v1/chat/completions", body.encode())
    assert status == 200
    events = [e for e in data.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)


def test_completions(client: openai.OpenAI) -> None:
    r = client.completions.create(model=CHAT, prompt="The capital of France is",
                                  max_tokens=5, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    assert r.usage is not None and r.usage.completion_tokens <= 5
    s = list(client.completions.create(model=CHAT, prompt="The capital of France is",
                                       max_tokens=5, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in s) == r.choices[0].text


def test_embeddings_float_and_base64(client: openai.OpenAI, pop: Running) -> None:
    r = client.embeddings.create(model=EMBED, input=["hello world", "goodbye"])
    assert [d.index for d in r.data] == [0, 1] and len(r.data[0].embedding) == 384
    assert r.usage.prompt_tokens > 0
    body = json.dumps({"model": EMBED, "input": "hello world", "encoding_format": "base64"})
    status, data = raw(pop, "POST", "/v1/embeddings", body.encode())
    assert status == 200
    packed = base64.b64decode(json.loads(data)["data"][0]["embedding"])
    floats = struct.unpack(f"<{len(packed) // 4}f", packed)
    assert max(abs(a - b) for a, b in zip(floats, r.data[0].embedding, strict=True)) < 1e-6


def test_models_and_rerank(client: openai.OpenAI, pop: Running) -> None:
    ids = {m.id for m in client.models.list()}
    assert {CHAT, EMBED} <= ids
    body = {"model": EMBED, "query": "How do I bake bread?", "top_n": 2,
            "documents": ["Stock prices rose.", "Knead the dough and bake it.", "Cats purr."]}
    status, data = raw(pop, "POST", "/v1/rerank", json.dumps(body).encode())
    assert status == 200, data
    results = json.loads(data)["results"]
    assert len(results) == 2 and results[0]["index"] == 1
    assert results[0]["document"]["text"] == "Knead the dough and bake it."
    assert results[0]["relevance_score"] >= results[1]["relevance_score"]


def test_lora_added_at_run_time_is_listed_and_served(client: openai.OpenAI, pop: Running,
                                                     tmp_path: Path) -> None:
    path = tmp_path / "style.gguf"
    write_random_lora(packaged_model(), path, rank=8, seed=3, std=0.1)
    assert "style" not in {m.id for m in client.models.list()}  # listed a moment before
    info = pop.admin.request("POST", "/v1/ai/loras",
                             json.dumps({"name": "style", "path": str(path)}).encode())
    assert info["parent"] == CHAT
    listed = {m.id: m for m in client.models.list()}
    assert listed["style"].model_extra["parent"] == CHAT  # type: ignore[index]
    base = client.chat.completions.create(model=CHAT, messages=HELLO,  # type: ignore[arg-type]
                                          max_tokens=12, temperature=0)
    tuned = client.chat.completions.create(model="style", messages=HELLO,  # type: ignore[arg-type]
                                           max_tokens=12, temperature=0)
    assert tuned.choices[0].message.content != base.choices[0].message.content
    kept = {lo["name"]: lo for lo in json.loads((pop.data / "ai" / "loras.json").read_text())}
    assert kept["style"]["path"] == str(path.resolve())  # kept for restarts
    # another adapter under the name: its answers say so at once (they carried the old
    # one's fingerprint for the model listing's 5 s, and, cached, for the cache's TTL)
    other = tmp_path / "style2.gguf"
    write_random_lora(packaged_model(), other, rank=8, seed=4, std=0.1)
    pop.admin.request("DELETE", "/v1/ai/loras/style")
    pop.admin.request("POST", "/v1/ai/loras",
                      json.dumps({"name": "style", "path": str(other)}).encode())
    again = [client.chat.completions.create(model="style", messages=HELLO,  # type: ignore[arg-type]
                                            max_tokens=12, temperature=0) for _ in range(2)]
    assert again[0].system_fingerprint == again[1].system_fingerprint \
        != tuned.system_fingerprint


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-9", messages=HELLO)  # type: ignore[arg-type]
    assert e.value.code == "model_not_found" and "gpt-9" in e.value.message
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nope", input="x")


def test_unknown_models_are_named_in_the_event_not_in_metric_labels(pop: Running) -> None:
    """The code goes in x-edgefn-error (the request's event reads it there); a model
    name a client made up never becomes a metric label."""
    body = json.dumps({"model": "made-up-model", "messages": HELLO}).encode()
    status, headers, _ = pop.request("POST", "/v1/chat/completions", body)
    assert (status, headers.get("x-edgefn-error")) == (404, "model_not_found")
    pop.delivered()
    conn = http.client.HTTPConnection("127.0.0.1", METRICS_PORT, timeout=10)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        status, text = resp.status, resp.read().decode()
    finally:
        conn.close()
    assert status == 200 and "edgefn_requests_total" in text
    assert "made-up-model" not in text


@pytest.mark.parametrize(("body", "code", "param"), [
    (b"{not json", "invalid_json", None),
    (b"", "invalid_request", None),
    (json.dumps({"model": CHAT}).encode(), "invalid_value", "messages"),  # no messages
    (json.dumps({"model": CHAT, "messages": "hi"}).encode(), "invalid_value", "messages"),
    (json.dumps({"model": CHAT, "messages": HELLO, "temperature": 9}).encode(),
     "invalid_value", "temperature"),
    (json.dumps({"model": CHAT, "messages": HELLO, "n": 9}).encode(), "invalid_value", "n"),
    (json.dumps({"model": CHAT, "messages": []}).encode(), "invalid_request", "messages"),
    # past the worker wire's integers: a 400, not a 500 (OverflowError)
    (json.dumps({"model": CHAT, "messages": HELLO, "seed": 2**64}).encode(), "invalid_value",
     "seed"),
    (json.dumps({"model": CHAT, "messages": HELLO, "max_completion_tokens": 2**64}).encode(),
     "invalid_value", "max_completion_tokens"),
    (json.dumps({"model": CHAT, "messages": HELLO, "max_tokens": 10**9}).encode(),
     "invalid_value", "max_tokens"),
    (json.dumps({"model": CHAT, "messages": HELLO, "logit_bias": {"9" * 23: 1}}).encode(),
     "invalid_request", "logit_bias"),
    # refused by OpenAI too: usage options for an answer that is not streamed, and a
    # stream option nobody reads
    (json.dumps({"model": CHAT, "messages": HELLO,
                 "stream_options": {"include_usage": True}}).encode(),
     "invalid_value", "stream_options"),
    (json.dumps({"model": CHAT, "messages": HELLO, "stream": True,
                 "stream_options": {"bogus": True}}).encode(),
     "invalid_value", "stream_options.bogus"),
    # a tool call in the history that is not OpenAI's shape (it crashed the worker)
    (json.dumps({"model": CHAT, "messages": [*HELLO, {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "c1", "type": "function", "function": "get_weather"}]}]}
                ).encode(), "invalid_value", "messages[1].tool_calls[0].function"),
])
def test_bad_requests_get_openai_errors(pop: Running, body: bytes, code: str,
                                        param: str | None) -> None:
    status, data = raw(pop, "POST", "/v1/chat/completions", body)
    assert status == 400, data
    err = json.loads(data)["error"]
    assert err["message"], err
    assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", code, param)


def test_bad_parameters_raise_in_the_client(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=CHAT, messages=HELLO,  # type: ignore[arg-type]
                                       top_p=1.0000001)
    assert "top_p must be in [0, 1], got 1.0000001" in e.value.message  # it said "got 1"
    greedy = client.chat.completions.create(model=CHAT, messages=HELLO,  # type: ignore[arg-type]
                                            top_p=0, max_tokens=2)  # OpenAI's range
    assert greedy.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=EMBED, input=[""])


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("GET", "/v1/chat/completions", "POST"), ("PUT", "/v1/embeddings", "POST"),
    ("POST", "/v1/models", "GET")])
def test_wrong_method_is_405(pop: Running, method: str, path: str, allowed: str) -> None:
    status, data = raw(pop, method, path)
    assert status == 405, data
    err = json.loads(data)["error"]
    assert (err["type"], err["code"], err["param"]) == ("invalid_request_error",
                                                        "method_not_allowed", None)
    assert f"use {allowed} {path}" in err["message"]


@pytest.mark.parametrize(("method", "path", "status", "allow"), [
    ("HEAD", "/v1/models", 200, None), ("HEAD", f"/v1/models/{CHAT}", 200, None),
    ("DELETE", "/v1/models", 405, "GET, HEAD"), ("GET", "/v1/embeddings", 405, "POST")])
def test_head_is_get_without_a_body_and_a_405_says_what_is_allowed(
        pop: Running, method: str, path: str, status: int, allow: str | None) -> None:
    """RFC 9110: a GET resource answers HEAD (it was a 405), a 405 carries Allow."""
    conn = http.client.HTTPConnection(pop.host, pop.port, timeout=60)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    assert (resp.status, resp.getheader("allow")) == (status, allow)
    if method == "HEAD":
        assert body == b"" and int(resp.getheader("content-length") or 0) > 0


LONG = "word " * 9000  # more tokens than the model's 8192-token context


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}],
                              "stream": True}, "messages"),
    ("/v1/completions", {"prompt": LONG}, "prompt"),
    ("/v1/completions", {"prompt": LONG, "stream": True}, "prompt"),
])
def test_a_prompt_longer_than_the_context_is_context_length_exceeded(
        pop: Running, path: str, body: dict[str, Any], param: str) -> None:
    status, data = raw(pop, "POST", path, json.dumps({"model": CHAT, **body}).encode())
    assert status == 400, data  # a stream too: refused before its status line
    err = json.loads(data)["error"]
    assert (err["type"], err["code"], err["param"]) == ("invalid_request_error",
                                                        "context_length_exceeded", param)
    found = re.search(r"context is (\d+) tokens; the prompt has (\d+)", err["message"])
    assert found is not None and int(found[2]) > int(found[1]) > 0, err["message"]


def test_a_call_refused_for_its_input_is_no_model_error_in_the_metrics(pop: Running) -> None:
    """A client's 400 counted as the model worker's error (its errors_total, and
    edgefn_ai_request_success_total{finished_reason="error"}): alerts on errors fired
    on bad input."""
    def counts() -> tuple[float, int]:
        text = pop.admin.metrics()
        return (metric_sum(text, "edgefn_ai_request_success_total", finished_reason="error"),
                pop.admin.request("GET", "/v1/ai/metrics")["errors_total"])

    before = counts()
    for stream in (False, True):
        body = {"model": CHAT, "messages": [{"role": "user", "content": LONG}], "stream": stream}
        assert raw(pop, "POST", "/v1/chat/completions", json.dumps(body).encode())[0] == 400
    assert counts() == before


def test_more_than_four_stop_strings_is_a_400_naming_stop(pop: Running,
                                                          client: openai.OpenAI) -> None:
    five = ["a1", "b2", "c3", "d4", "e5"]
    for stream in (False, True):
        body = {"model": CHAT, "messages": HELLO, "stop": five, "stream": stream}
        status, data = raw(pop, "POST", "/v1/chat/completions", json.dumps(body).encode())
        assert status == 400, data
        err = json.loads(data)["error"]
        assert (err["type"], err["code"], err["param"]) == ("invalid_request_error",
                                                            "invalid_request", "stop")
        assert "at most 4" in err["message"] and "got 5" in err["message"], err
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=CHAT, prompt="Hi", stop=five, max_tokens=2)
    assert (e.value.status_code, e.value.code, e.value.param) == (400, "invalid_request", "stop")
    four = client.chat.completions.create(model=CHAT, messages=HELLO,  # type: ignore[arg-type]
                                          stop=five[:4], max_tokens=2)
    assert four.choices[0].finish_reason in ("stop", "length")


EXAMPLES = Path(__file__).resolve().parent.parent / "functions" / "examples"


@pytest.fixture(scope="module")
def ai_functions(pop: Running) -> Running:
    for name in ("ai-py", "ai-c"):
        pop.admin.deploy(EXAMPLES / name)
    return pop


def test_python_function_streams_a_chat_into_its_response(ai_functions: Running,
                                                          client: openai.OpenAI) -> None:
    q = "Why is the sky blue?"
    conn = http.client.HTTPConnection(ai_functions.host, ai_functions.port, timeout=60)
    conn.request("GET", "/ai-py?q=Why+is+the+sky+blue%3F&max_tokens=16")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("transfer-encoding") == "chunked"
    streamed = resp.read().decode()
    conn.close()
    direct = client.chat.completions.create(
        model=CHAT, max_tokens=16, temperature=0,
        messages=[{"role": "system", "content": "Answer in one short sentence."},
                  {"role": "user", "content": q}])
    assert streamed and streamed == direct.choices[0].message.content
    status, _, body = ai_functions.request("GET", "/ai-py?q=hi&stream=0&max_tokens=4",
                                           timeout=60)
    out = json.loads(body)
    assert status == 200 and out["usage"]["completion_tokens"] <= 4 and out["text"]


def test_python_function_reranks(ai_functions: Running) -> None:
    body = json.dumps({"query": "fruit", "documents": ["a red car", "a ripe banana"]})
    status, _, data = ai_functions.request("POST", "/ai-py/rank", body.encode(), timeout=60)
    assert status == 200, data
    assert json.loads(data)[0]["index"] == 1
    for bad in (b"", b"not json", b'{"query": "fruit"}'):  # a 400 that says what to send
        status, _, data = ai_functions.request("POST", "/ai-py/rank", bad, timeout=60)
        assert status == 400 and "documents" in json.loads(data)["error"], data


def test_wasm_function_calls_chat_and_embed(ai_functions: Running) -> None:
    args = {"model": CHAT, "messages": HELLO, "max_tokens": 6, "temperature": 0}
    status, _, data = ai_functions.request("POST", "/ai-c", json.dumps(args).encode(),
                                           timeout=60)
    assert status == 200, data
    out = json.loads(data)
    assert out["text"] and out["usage"]["completion_tokens"] <= 6
    # a result larger than the guest's first 4 KiB buffer: fetched again, not recomputed
    status, _, data = ai_functions.request(
        "POST", "/ai-c", json.dumps({"model": EMBED, "input": ["one", "two"]}).encode(),
        {"x-ai-op": "ai.embed"}, timeout=60)
    assert status == 200, data
    assert [len(v) for v in json.loads(data)["embeddings"]] == [384, 384]


def test_ai_binding_errors_reach_the_function(ai_functions: Running, tmp_path: Path) -> None:
    status, headers, data = ai_functions.request(
        "POST", "/ai-c", json.dumps({"model": "nope", "messages": HELLO}).encode(), timeout=60)
    assert status == 500 and headers.get("x-edgefn-error") == "binding", data
    assert b"does not exist" in data
    d = tmp_path / "no-ai"
    d.mkdir()
    (d / "main.py").write_text("def handle(request, env):\n"
                               "    return env.ai().chat([{'role': 'user', 'content': 'x'}])\n")
    (d / "edgefn.toml").write_text('name = "no-ai"\nruntime = "python"\nentry = "main.py"\n'
                                   'routes = ["/no-ai"]\n[pool]\nstandby = false\n')
    ai_functions.admin.deploy(d)
    status, _, data = ai_functions.request("GET", "/no-ai", timeout=60)
    assert status == 500 and b"did not declare the AI binding" in data, data


def test_upstream_engine_forwards_to_another_edgefn(pop: Running, client: openai.OpenAI,
                                                    tmp_path: Path) -> None:
    """A second PoP whose worker serves `smollm2-135m` by forwarding to the first
    PoP's OpenAI API: how edgefn goes past one box."""
    config = tmp_path / "worker.toml"
    config.write_text(f'[[models]]\nname = "first-pop"\nengine = "openai"\n'
                      f'url = "http://{pop.host}:{pop.port}/v1"\nmodels = ["{CHAT}"]\n')
    with pop_thread(tmp_path / "second", ai=True, ai_config=str(config)) as second:
        remote = second.openai()
        try:
            assert [m.id for m in remote.models.list()] == [CHAT]
            chunks = list(remote.chat.completions.create(
                model=CHAT, messages=HELLO, max_tokens=10, temperature=0,  # type: ignore[arg-type]
                stream=True, stream_options={"include_usage": True}))
            direct = client.chat.completions.create(model=CHAT, messages=HELLO,  # type: ignore[arg-type]
                                                    max_tokens=10, temperature=0)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text == direct.choices[0].message.content
            assert chunks[-1].usage.completion_tokens == direct.usage.completion_tokens  # type: ignore[union-attr]
            with pytest.raises(openai.NotFoundError):
                remote.chat.completions.create(model="nope", messages=HELLO)  # type: ignore[arg-type]
        finally:
            remote.close()


def test_cli_lora_and_metrics(pop: Running, tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "cli.gguf"
    write_random_lora(packaged_model(), path, rank=4, seed=9, std=0.1)

    def edgefn(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "runtime.cli", *args, "--data",
                              str(pop.data)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert "added cli-lora (parent smollm2-135m" in edgefn("lora", "add", "cli-lora", str(path))
    assert "cli-lora" in edgefn("lora", "ls") and "LoRA on smollm2-135m" in edgefn("lora", "ls")
    status, data = raw(pop, "GET", "/v1/models/cli-lora")
    assert (status, json.loads(data)["created"]) == (200, int(path.stat().st_mtime))  # its file's
    before = json.loads(edgefn("ai", "metrics"))["requests_total"]
    body = json.dumps({"model": "cli-lora", "messages": HELLO, "max_tokens": 2,
                       "temperature": 0}).encode()  # deterministic: the AI cache keeps it

    def cached(status: int = 200) -> str:
        conn = http.client.HTTPConnection(pop.host, pop.port, timeout=60)
        try:
            conn.request("POST", "/v1/chat/completions", body,
                         {"content-type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            assert resp.status == status, data
            return resp.getheader("x-edgefn-cache") or ""
        finally:
            conn.close()

    assert (cached(), cached()) == ("miss", "hit-exact")
    from tests.observe.metrics.support import samples

    labels = {dict(k[1]).get("adapter"): v for k, v in samples(pop.admin.metrics()).items()
              if k[0] == "edgefn_ai_generation_tokens_total" and dict(k[1])["model"] == "cli-lora"}
    # the generated tokens under its parent, though it was added without --base, and
    # the AI-cache hit in that same series (it made one of its own, adapter="")
    assert labels == {CHAT: 2.0}, labels
    metrics = json.loads(edgefn("ai", "metrics"))
    assert metrics["requests_total"] == before + 1 and "busy_fraction" in metrics
    bad = subprocess.run([sys.executable, "-m", "runtime.cli", "lora", "add", "x",
                          str(tmp_path / "missing.gguf"), "--data", str(pop.data)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "does not exist" in bad.stderr
    # lora rm: unlisted, no longer served, forgotten across restarts, base models refused
    assert "removed cli-lora" in edgefn("lora", "rm", "cli-lora")
    assert "cli-lora" not in edgefn("lora", "ls")
    status, data = raw(pop, "POST", "/v1/chat/completions", body)  # its answers went too
    assert status == 404 and json.loads(data)["error"]["code"] == "model_not_found"
    kept = json.loads((pop.data / "ai" / "loras.json").read_text())
    assert "cli-lora" not in [lo["name"] for lo in kept]
    for name, code in (("cli-lora", "model_not_found"), (CHAT, "invalid_request")):
        again = subprocess.run([sys.executable, "-m", "runtime.cli", "lora", "rm", name,
                                "--json", "--data", str(pop.data)], capture_output=True,
                               text=True, timeout=60)
        assert again.returncode == 1 and json.loads(again.stderr)["error"]["code"] == code
    # another adapter under the name: none of the old one's answers
    other = tmp_path / "other.gguf"
    write_random_lora(packaged_model(), other, rank=4, seed=10, std=0.1)
    edgefn("lora", "add", "cli-lora", str(path))
    assert cached() == "miss"
    edgefn("lora", "rm", "cli-lora")
    edgefn("lora", "add", "cli-lora", str(other))
    assert cached() == "miss"
    edgefn("lora", "rm", "cli-lora")
    # a name with a slash or a space is removed as it was added (the path was not quoted)
    for name in ("org/pirate", "Bad Name"):
        edgefn("lora", "add", name, str(path))
        assert f"removed {name}" in edgefn("lora", "rm", name)
    assert "pirate" not in edgefn("lora", "ls")


def py_ai_function(root: Path, name: str, source: str) -> Path:
    d = root / name
    d.mkdir()
    (d / "main.py").write_text(source)
    (d / "edgefn.toml").write_text(f'name = "{name}"\nruntime = "python"\nentry = "main.py"\n'
                                   f'routes = ["/{name}"]\n[limits]\nwall_ms = 60000\n'
                                   '[bindings]\nai = true\n[pool]\nstandby = false\n')
    return d


def test_an_ai_stream_belongs_to_the_function_that_opened_it(pop: Running,
                                                             tmp_path: Path) -> None:
    pop.admin.deploy(py_ai_function(tmp_path, "opener", """
from edgefn import Response


def handle(request, env):
    call = env._call
    sid = call("ai.chat_stream", {"model": "smollm2-135m", "max_tokens": 8,
               "messages": [{"role": "user", "content": "hi"}]}, True)["stream"]
    if request.query.get("read"):
        return Response(str(call("ai.chat_next", {"stream": sid}, True)["chunks"]))
    if request.query.get("close"):  # its own, one it has not, and no stream id at all
        closed = [call("ai.chat_close", {"stream": sid}, True),
                  call("ai.chat_close", {"stream": sid + 1000}, True)]
        try:
            call("ai.chat_close", {"stream": "x"}, True)
        except RuntimeError as e:
            closed.append(str(e))
        return Response(repr(closed))
    return Response(str(sid))
"""))
    pop.admin.deploy(py_ai_function(tmp_path, "thief", """
from edgefn import Response


def handle(request, env):
    try:
        return Response(str(env._call("ai.chat_next", {"stream": int(request.query["sid"])},
                                      True)))
    except RuntimeError as e:
        return Response(str(e))
"""))
    status, _, sid = pop.request("GET", "/opener", timeout=60)
    assert status == 200 and sid.isdigit()
    status, _, body = pop.request("GET", f"/thief?sid={sid.decode()}", timeout=60)
    assert status == 200 and b"no AI stream" in body and b"not its own" in body, body
    status, _, body = pop.request("GET", "/opener?read=1", timeout=60)  # its owner reads
    assert status == 200 and body.startswith(b"[") and body != b"[]", body
    status, _, body = pop.request("GET", "/opener?close=1", timeout=60)
    assert body == (b"[True, False, \"bad arguments to ai.chat_close: stream must be a stream id "
                    b"(an integer), got 'x'\"]"), body


def test_a_function_route_may_not_cover_a_builtin_endpoint(pop: Running, tmp_path: Path
                                                           ) -> None:
    from runtime.admin.client import AdminError

    for route in ("/v1", "/v1/chat/completions", "/v1/models"):
        d = tmp_path / route.strip("/").replace("/", "-")
        d.mkdir()
        (d / "main.py").write_text("from edgefn import Response\n\n"
                                   "def handle(request, env):\n    return Response('mine')\n")
        (d / "edgefn.toml").write_text(f'name = "squat"\nruntime = "python"\nentry = "main.py"\n'
                                       f'routes = ["{route}"]\n[pool]\nstandby = false\n')
        with pytest.raises(AdminError) as err:
            pop.admin.deploy(d)
        assert (err.value.status, err.value.code) == (409, "route_conflict")
        assert "would cover the built-in endpoint /v1/" in str(err.value)
        assert "field `routes[0]`" in str(err.value)
    names = [f["name"] for f in pop.admin.request("GET", "/v1/functions")["functions"]]
    assert "squat" not in names


def test_v1_asks_for_a_key_once_one_exists_and_scopes_pick_the_models(
        pop: Running, tmp_path: Path) -> None:
    """A second PoP on the same model worker, with keys: the official client gets
    OpenAI's 401/403 errors and only the models its key's scopes name."""
    from runtime.security.keys import KeyStore

    assert pop.pop.ai is not None
    with pop_thread(tmp_path / "keyed", ai=True,
                    **{"ai.socket": pop.pop.ai.client.socket_path}) as keyed:
        store = KeyStore(keyed.data)
        chat_only, _ = store.create("acme", ("model:smollm2*",))
        keyed.admin.request("POST", "/v1/keys/reload")
        base = f"http://{keyed.host}:{keyed.port}/v1"
        with openai.OpenAI(base_url=base, api_key="efn_nope", max_retries=0) as anon:
            with pytest.raises(openai.AuthenticationError) as err:
                anon.models.list()
            assert err.value.status_code == 401
            assert err.value.body["code"] == "unauthorized"  # type: ignore[index]
        with openai.OpenAI(base_url=base, api_key=chat_only, max_retries=0,
                           timeout=60) as acme:
            assert [m.id for m in acme.models.list()] == [CHAT]
            r = acme.chat.completions.create(model=CHAT, messages=HELLO,  # type: ignore[arg-type]
                                             max_tokens=4)
            assert r.choices[0].message.content
            with pytest.raises(openai.PermissionDeniedError) as denied:
                acme.embeddings.create(model=EMBED, input="hi")
            assert denied.value.body["param"] == "model"  # type: ignore[index]
            assert f"model {EMBED!r}" in denied.value.body["message"]  # type: ignore[index]


def test_model_calls_carry_the_caller_as_the_workers_fair_share(pop: Running,
                                                                 tmp_path: Path) -> None:
    """Each tenant is a client of its own to the model worker (its fair share,
    `protocol.Generate.client`): an API key's tenant (never the key; a second key of
    the tenant shares its share), a function's owner; the AI cache's lookups too.
    What the PoP sends is read off its worker client, on the way to the real worker."""
    from gpu_worker import protocol as p
    from runtime.security.keys import KeyStore

    assert pop.pop.ai is not None
    with pop_thread(tmp_path / "fair", ai=True,
                    **{"ai.socket": pop.pop.ai.client.socket_path}) as fair:
        assert fair.pop.ai is not None
        store = KeyStore(fair.data)
        (acme, acme_key), (globex, globex_key), (acme2, _) = (
            store.create("acme", ("*",)), store.create("globex", ("*",)),
            store.create("acme", ("*",)))
        fair.admin.request("POST", "/v1/keys/reload")
        for owner in ("o1", "o2"):
            d = py_ai_function(tmp_path, f"fair-{owner}", """
from edgefn import Response


def handle(request, env):
    call = env._call
    call("ai.chat", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, True)
    call("ai.embed", {"input": ["fair share " + request.query["n"]]}, True)
    return Response("ok")
""")
            toml = d / "edgefn.toml"
            toml.write_text(f'owner = "{owner}"\n' + toml.read_text())
            fair.admin.deploy(d)
        sent: list[Any] = []
        real_send = fair.pop.ai.client.send

        def spy(msg: Any) -> None:
            sent.append(msg)
            real_send(msg)

        fair.pop.ai.client.send = spy  # type: ignore[method-assign]
        base = f"http://{fair.host}:{fair.port}/v1"
        for n, (key, record) in enumerate(((acme, acme_key), (globex, globex_key),
                                           (acme2, acme_key))):
            with openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=60) as c:
                c.chat.completions.create(model=CHAT, messages=HELLO,  # type: ignore[arg-type]
                                          max_tokens=2)
                c.embeddings.create(model=EMBED, input=f"fair share {record.id} {n}")
        for owner in ("o1", "o2"):
            assert fair.get(f"/fair-{owner}?n={owner}", timeout=60,
                            headers={"authorization": f"Bearer {acme}"})[:3:2] == (200, b"ok")
    clients = [(type(m).__name__, m.client) for m in sent
               if isinstance(m, p.Generate | p.Embed | p.Rerank | p.CountTokens)]
    shares = ("tenant:acme", "tenant:globex", "tenant:o1", "tenant:o2")
    for who in shares:
        asked = {kind for kind, c in clients if c == who}
        assert {"Generate", "Embed"} <= asked, (who, clients)
    assert {c for _, c in clients} == set(shares), clients  # acme's two keys: one share
    assert not any(key in repr(sent) for key in (acme, globex, acme2))


def test_the_ai_binding_refuses_unknown_arguments_and_bad_roles(pop: Running,
                                                                tmp_path: Path) -> None:
    """As /v1/chat/completions does: a typo (`max_token`) ran uncapped until the wall
    limit, and a role the API refuses went to the model. An argument of another kind
    is named (a null input was embedded, and a number completed, as its `str()`:
    "None", "12345"); a null one takes its default."""
    from tests.support import python_function

    pop.deploy(python_function(tmp_path, "aiargs", """
import edgefn
from edgefn import Response

def handle(request, env):
    ai = env.ai()
    case = request.query["case"]
    try:
        if case == "typo":
            ai.chat([{"role": "user", "content": "hi"}], max_token=4)
        elif case == "role":
            ai.chat([{"role": "robot", "content": "hi"}], max_tokens=2)
        elif case == "embed":  # raw arguments, as a WASM guest passes them
            ai._call("ai.embed", {"model": "all-minilm-l6-v2", "input": "x", "dims": 3}, True)
        elif case == "no-model":  # a WASM guest's call without one: the SDK's defaults
            out = ai._call("ai.embed", {"input": "x"}, True)
            chat = ai._call("ai.chat", {"messages": [{"role": "user", "content": "hi"}],
                                        "max_tokens": 1}, True)
            return Response(f"{len(out['embeddings'][0])} {chat['finish_reason']}")
        elif case == "null-input":
            ai._call("ai.embed", {"input": [None]}, True)
        elif case == "number-prompt":
            ai._call("ai.complete", {"prompt": 12345, "max_tokens": 2}, True)
        elif case == "text-cap":
            ai.chat([{"role": "user", "content": "hi"}], max_tokens="5")
        elif case.startswith("top-n"):  # -2 answered all but the last two documents
            ai._call("ai.rerank", {"query": "q", "documents": ["a", "b", "c"],
                                   "top_n": int(case[5:])}, True)
        elif case == "huge-seed":  # past /v1's int64: a serializer's error, unnamed
            ai._call("ai.chat", {"messages": [{"role": "user", "content": "hi"}],
                                 "max_tokens": 1, "seed": 2 ** 64 - 1}, True)
        elif case == "null-model":  # null takes its default, as in the OpenAI API
            chat = ai._call("ai.chat", {"model": None, "messages": [
                {"role": "user", "content": "hi"}], "max_tokens": 1, "seed": None}, True)
            return Response(chat["finish_reason"])
        else:
            return Response(ai.chat([{"role": "user", "content": "hi"}], max_tokens=2,
                                    temperature=0)["finish_reason"])  # sampled: it could stop
    except edgefn.BindingError as e:
        return Response(str(e), status=400)
    return Response("no error")
""", extra="[bindings]\nai = true"))
    for case, words in (("typo", "ai.chat: unrecognized argument 'max_token'; it takes"),
                        ("role", "ai.chat: messages[0].role must be one of"),
                        ("embed", "ai.embed: unrecognized argument 'dims'"),
                        ("null-input", "ai.embed: input must be a string or a list of "
                                       "strings (not empty), got a list holding null"),
                        ("number-prompt", "ai.complete: prompt must be a string, got a "
                                          "number (12345)"),
                        ("text-cap", "ai.chat: max_tokens must be an integer, got a string"),
                        ("top-n0", "ai.rerank: top_n must be at least 1, got 0"),
                        ("top-n-2", "ai.rerank: top_n must be at least 1, got -2"),
                        ("huge-seed", "ai.chat: seed must be a 64-bit signed integer, got "
                                      "18446744073709551615")):
        status, _, body = pop.get(f"/aiargs?case={case}")
        assert status == 400 and words.encode() in body, (case, body)
    assert pop.get("/aiargs?case=ok")[:3:2] == (200, b"length")
    assert pop.get("/aiargs?case=no-model")[:3:2] == (200, b"384 length")
    assert pop.get("/aiargs?case=null-model")[:3:2] == (200, b"length")


def test_null_reads_as_the_default_as_openai_reads_it(client: openai.OpenAI) -> None:
    """The official client sends ``"temperature": null`` for ``temperature=None``."""
    out = client.chat.completions.create(model=CHAT, messages=HELLO, max_tokens=2,  # type: ignore[arg-type]
                                         temperature=None, top_p=None, n=None,
                                         presence_penalty=None, frequency_penalty=None)
    assert out.choices[0].finish_reason == "length"
    emb = client.embeddings.create(model=EMBED, input="null format",
                                   encoding_format=None)  # type: ignore[arg-type]
    assert len(emb.data[0].embedding) == 384


def test_n_choices_with_a_seed_differ_and_repeat(client: openai.OpenAI) -> None:
    """A seed makes the whole answer reproducible; it once made n identical choices."""
    def ask() -> list[str | None]:
        out = client.chat.completions.create(
            model=CHAT, messages=[{"role": "user", "content": "Write a short poem about the sea."}],
            temperature=1, seed=7, n=3, max_tokens=12, extra_headers={"cache-control": "no-store"})
        return [c.message.content for c in out.choices]

    first = ask()
    assert len(set(first)) > 1 and ask() == first


def test_an_embedding_cache_hit_is_validated_as_a_miss_is(pop: Running) -> None:
    body = {"model": EMBED, "input": "probe one"}
    assert raw(pop, "POST", "/v1/embeddings", json.dumps(body).encode())[0] == 200  # cached
    status, data = raw(pop, "POST", "/v1/embeddings",
                       json.dumps({**body, "encoding_format": "hex"}).encode())
    assert status == 400 and json.loads(data)["error"]["param"] == "encoding_format"
    for dimensions in (128, 0):  # the cached entry is 384 wide: never served for these
        status, data = raw(pop, "POST", "/v1/embeddings",
                           json.dumps({**body, "dimensions": dimensions}).encode())
        assert status == 400 and json.loads(data)["error"]["param"] == "dimensions", data


def test_dimensions_may_name_the_models_own_size(client: openai.OpenAI) -> None:
    """The official client sends what its caller gives; OpenAI's older models refuse any
    `dimensions`, its text-embedding-3 models shorten. This model cannot shorten."""
    r = client.embeddings.create(model=EMBED, input="sized", dimensions=384)
    assert len(r.data[0].embedding) == 384
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=EMBED, input="sized", dimensions=128)
    assert e.value.body["param"] == "dimensions"  # type: ignore[index]
    assert "makes embeddings of 384 dimensions and cannot shorten them" in e.value.message


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/embeddings", {"model": EMBED, "input": []}, "input"),
    ("/v1/embeddings", {"model": EMBED, "input": ["a", ""]}, "input[1]"),
    ("/v1/embeddings", {"model": CHAT, "input": "x"}, "model"),
    ("/v1/rerank", {"model": EMBED, "query": "q", "documents": []}, "documents"),
    ("/v1/completions", {"model": CHAT, "prompt": ""}, "prompt"),
])
def test_a_worker_refusal_names_its_field_in_param(pop: Running, path: str,
                                                   body: dict[str, Any], param: str) -> None:
    """OpenAI names the field; these worker refusals had `param: null`."""
    status, data = raw(pop, "POST", path, json.dumps(body).encode())
    assert status == 400, data
    assert json.loads(data)["error"]["param"] == param, data


# -- never ignored: message keys, stream_options, metadata, dimensions, empty texts ----------
def _error(status: int, data: bytes) -> dict[str, Any]:
    assert status == 400, data
    err = json.loads(data)["error"]
    assert set(err) == {"message", "type", "param", "code"} and \
        err["type"] == "invalid_request_error", err
    return err  # type: ignore[no-any-return]


@pytest.mark.parametrize(("extra", "param", "code"), [
    ({"name": "bob"}, "messages[0].name", "unsupported_parameter"),
    ({"foo": "bob"}, "messages[0].foo", "unrecognized_argument")])
def test_a_message_key_the_model_would_not_read_is_a_400_naming_it(
        pop: Running, client: openai.OpenAI, extra: dict[str, str], param: str,
        code: str) -> None:
    """Both read as "Hi" alone: the same prompt, silently."""
    body = {"model": CHAT, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi",
                                                          **extra}]}
    for path, sent in (("/v1/chat/completions", body),
                       ("/v1/tokenize", {"model": CHAT, "messages": body["messages"]})):
        err = _error(*raw(pop, "POST", path, json.dumps(sent).encode()))
        assert (err["param"], err["code"]) == (param, code), err
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=CHAT, max_tokens=2, messages=[
            {"role": "user", "content": "Hi", **extra}])  # type: ignore[list-item,misc]
    assert (e.value.param, e.value.code) == (param, code)


def test_a_replayed_assistant_message_with_null_fields_is_taken(client: openai.OpenAI) -> None:
    """The answer's message as the official client gives it back, and as its
    `model_dump()` (every field: refusal, audio, annotations... null)."""
    first = client.chat.completions.create(model=CHAT, messages=HELLO,  # type: ignore[arg-type]
                                           max_tokens=4, temperature=0)
    said = first.choices[0].message
    assert {"refusal", "audio", "annotations"} <= set(said.model_dump())
    for replayed in (said, said.model_dump()):
        history = [*HELLO, replayed, {"role": "user", "content": "Again."}]
        r = client.chat.completions.create(model=CHAT, messages=history,  # type: ignore[arg-type]
                                           max_tokens=4, temperature=0)
        assert r.choices[0].message.content


def test_include_obfuscation_false_streams_and_true_is_refused(pop: Running,
                                                               client: openai.OpenAI) -> None:
    for create, kw in ((client.chat.completions.create, {"messages": HELLO}),
                       (client.completions.create, {"prompt": "Hi"})):
        chunks = list(create(model=CHAT, max_tokens=3, stream=True,  # type: ignore[operator]
                             stream_options={"include_usage": True,
                                             "include_obfuscation": False}, **kw))
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    body = {"model": CHAT, "messages": HELLO, "max_tokens": 3, "stream": True,
            "stream_options": {"include_obfuscation": True}}
    err = _error(*raw(pop, "POST", "/v1/chat/completions", json.dumps(body).encode()))
    assert (err["param"], err["code"]) == ("stream_options.include_obfuscation",
                                           "unsupported_parameter")


def test_metadata_is_taken_within_openais_bounds(pop: Running, client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=CHAT, messages=HELLO,  # type: ignore[arg-type]
                                       max_tokens=2, metadata={"a": "b"})
    assert r.choices[0].message.content is not None
    for metadata in ({str(i): "v" for i in range(17)}, {"k": "v" * 513}, {"k": 1}):
        body = {"model": CHAT, "messages": HELLO, "max_tokens": 2, "metadata": metadata}
        err = _error(*raw(pop, "POST", "/v1/chat/completions", json.dumps(body).encode()))
        assert err["param"] == "metadata", err


def test_dimensions_are_checked_before_any_embedding_is_made(pop: Running) -> None:
    """2048 texts were all embedded (and charged) before the 400 said the size."""
    from gpu_worker import protocol as p

    assert pop.pop.ai is not None
    worker = pop.pop.ai.client
    sent: list[Any] = []
    real_send = worker.send

    def spy(msg: Any) -> None:
        sent.append(msg)
        real_send(msg)

    worker.send = spy  # type: ignore[method-assign]
    try:
        body = {"model": EMBED, "dimensions": 128,
                "input": [f"text number {i} of a long list to embed" for i in range(2048)]}
        err = _error(*raw(pop, "POST", "/v1/embeddings", json.dumps(body).encode()))
    finally:
        del worker.send
    assert err["param"] == "dimensions"
    assert "makes embeddings of 384 dimensions and cannot shorten them" in err["message"]
    assert not [m for m in sent if isinstance(m, p.Embed)], "an embedding was computed"


@pytest.mark.parametrize(("path", "body", "param", "says"), [
    ("/v1/completions", {"model": CHAT, "prompt": ""}, "prompt",
     "the prompt is empty: this server generates from a prompt's tokens"),
    ("/v1/embeddings", {"model": EMBED, "input": ["a", ""]}, "input[1]",
     "input[1] is an empty string"),
    ("/v1/tokenize", {"model": EMBED, "input": ["", "a"]}, "input[0]",
     "input[0] is an empty string"),
    ("/v1/rerank", {"model": EMBED, "query": "q", "documents": ["b", {"title": "a"}]},
     "documents[1].text", "documents[1] has no 'text'"),
    ("/v1/chat/completions", {"model": CHAT, "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                     {"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[1]", "messages[0].content[1] is not a text part"),
])
def test_a_refused_text_is_named_plainly(pop: Running, path: str, body: dict[str, Any],
                                         param: str, says: str) -> None:
    err = _error(*raw(pop, "POST", path, json.dumps(body).encode()))
    assert err["param"] == param and err["message"].startswith(says), err


def test_a_body_of_numbers_near_1e308_is_refused_unread(pop: Running) -> None:
    """msgspec parses a number of 1e288..1e308 in ~10 us (1.5: 0.05 us): a chat whose
    tool parameters held 1.2 million of them (7 MB, under max_body_bytes) held the PoP's
    loop ~10 s, for any client, key or none. Refused before any decode, the AI cache's
    included; a body with a few such numbers is read as before."""
    def chat(n: int) -> bytes:
        schema = b'{"type": "object", "x": [' + b",".join([b"1e300"] * n) + b"]}"
        return (b'{"model": "smollm2-135m", "max_tokens": 1, "messages": [{"role": "user", '
                b'"content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", '
                b'"parameters": ' + schema + b"}}]}")

    started = time.monotonic()
    status, data = raw(pop, "POST", "/v1/chat/completions", chat(1_200_000))
    took = time.monotonic() - started
    body = json.loads(data)
    assert status == 400 and body["error"]["type"] == "invalid_request_error", body
    assert "numbers with exponents of 100 or more" in body["error"]["message"], body
    assert took < 2.0, took  # the scan of 7 MB and its transfer; ~10 s parsed
    status, data = raw(pop, "POST", "/v1/chat/completions", chat(3))
    assert b"exponents" not in data, data  # (its own answer: what the model made of it)
