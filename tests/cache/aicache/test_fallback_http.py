"""When the model origin fails, over real HTTP: a real PoP whose model worker
forwards ``echo`` and ``breaks`` to an OpenAI-compatible upstream (a fake server
on loopback that can be told to answer 503) and runs the packaged smollm2-135m
itself. ``[ai] fallback`` makes smollm2-135m answer for ``echo`` (marked, never
cached as ``echo``'s answer); ``[ai_cache] stale_if_error_s`` makes an expired
entry answer for ``breaks`` (marked ``stale``), to the OpenAI API and to a
function's ``ai`` binding alike."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

import pytest

from runtime.security.keys import KeyStore
from tests.gpu_worker.test_upstream_engine import FakeUpstream
from tests.residency.test_egress_http import upstream
from tests.support import Running, pop_thread

LOCAL = "smollm2-135m"


def worker_config(folder: Path, up: FakeUpstream) -> Path:
    worker = folder / "worker.toml"
    worker.write_text(f'[[models]]\nname = "far"\nengine = "openai"\nurl = "{up.url}"\n'
                      'models = ["echo", "breaks"]\n'
                      f'[[models]]\nname = "{LOCAL}"\nengine = "llamacpp"\nthreads = 1\n'
                      'context = 512\n')
    return worker


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, FakeUpstream]]:
    tmp = tmp_path_factory.mktemp("fallback")
    with upstream() as up, pop_thread(tmp / "data", ai=True,
                                      ai_config=str(worker_config(tmp, up)),
                                      **{"ai.fallback": {"echo": LOCAL},
                                         "ai_cache.stale_if_error_s": 600.0}) as pop:
        pop.deploy(asker(tmp / "asker"))
        yield pop, up


def asker(folder: Path) -> Path:
    """A Python function that asks ?m= (default ``breaks``) ?q= through its ai
    binding (entries live 1 s) and answers the binding's result as JSON."""
    folder.mkdir()
    (folder / "edgefn.toml").write_text(
        'name = "asker"\nruntime = "python"\nentry = "main.py"\nroutes = ["/ask"]\n'
        '[bindings]\nai = true\n[cache.ai]\nttl_seconds = 1\n')
    (folder / "main.py").write_text(
        "from edgefn import Response\n\n\ndef handle(request, env):\n"
        "    messages = [{'role': 'user', 'content': request.query['q']}]\n"
        "    try:\n"
        "        model = request.query.get('m', 'breaks')\n"
        "        said = env.ai().chat(messages, model=model, max_tokens=3, temperature=0)\n"
        "    except Exception as e:\n"
        "        return Response(str(e), status=502)\n"
        "    return Response.json(said)\n")
    return folder


def chat(pop: Running, model: str, text: str, stream: bool = False,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    body = {"model": model, "max_tokens": 3, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": text}]}
    return pop.request("POST", "/v1/chat/completions", json.dumps(body).encode(),
                       {"content-type": "application/json", **(headers or {})}, timeout=60)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_smaller_model_answers_when_the_origin_fails_and_is_not_cached(
        setup: tuple[Running, FakeUpstream], stream: bool) -> None:
    pop, up = setup
    text = f"one two three {uuid.uuid4().hex[:6]}"
    up.unavailable = [False]  # a 503 on a kept connection: not tried again upstream
    status, headers, out = chat(pop, "echo", text, stream)
    assert status == 200, out
    assert headers["x-edgefn-fallback"] == f"model={LOCAL}; origin=overloaded"
    assert headers["x-edgefn-cache"] == "miss"
    said = out.decode()
    assert f'"model":"{LOCAL}"' in said and text not in said  # smollm2's, not an echo
    assert up.unavailable == []
    status, headers, out = chat(pop, "echo", text, stream)  # the origin is back
    assert status == 200, out
    assert (headers["x-edgefn-cache"], "x-edgefn-fallback" in headers) == ("miss", False)
    assert '"model":"echo"' in out.decode()


def test_an_expired_entry_answers_when_the_origin_fails(
        setup: tuple[Running, FakeUpstream]) -> None:
    pop, up = setup
    text = f"alpha beta {uuid.uuid4().hex[:6]}"
    status, headers, first = chat(pop, "breaks", text, headers={"x-edgefn-cache-ttl": "1"})
    assert (status, headers["x-edgefn-cache"]) == (200, "miss"), first
    entry = headers["x-edgefn-cache-entry"]
    time.sleep(1.05)  # expired
    up.unavailable = [False]
    status, headers, out = chat(pop, "breaks", text)
    assert status == 200, out
    assert (headers["x-edgefn-cache"], headers["x-edgefn-cache-entry"]) == ("stale", entry)
    assert headers["x-edgefn-fallback"] == "stale; origin=503"
    assert float(headers["x-edgefn-cache-expired"]) >= 0.05
    answer = json.loads(out)["choices"][0]["message"]["content"]
    assert answer == json.loads(first)["choices"][0]["message"]["content"]
    up.unavailable = [False]  # a new question has no entry: the origin's 503 stands
    status, headers, out = chat(pop, "breaks", f"gamma {uuid.uuid4().hex[:6]}")
    assert status == 503 and "x-edgefn-fallback" not in headers, out


def test_an_expired_entry_answers_a_functions_call_when_the_origin_fails(
        setup: tuple[Running, FakeUpstream]) -> None:
    pop, up = setup
    q = quote(f"delta epsilon {uuid.uuid4().hex[:6]}")
    status, _, first = pop.get(f"/ask?q={q}", timeout=60)
    assert status == 200, first
    assert json.loads(first)["cache"]["outcome"] == "miss"
    time.sleep(1.05)  # expired
    up.unavailable = [False]
    status, _, out = pop.get(f"/ask?q={q}", timeout=60)
    assert status == 200, out
    said = json.loads(out)
    assert said["cache"]["outcome"] == "stale" and said["cache"]["expired_s"] > 0
    assert said["text"] == json.loads(first)["text"]
    up.unavailable = [False]
    status, _, out = pop.get(f"/ask?q=zeta+{uuid.uuid4().hex[:6]}", timeout=60)
    assert status == 502 and b"ai.chat" in out, out


def test_a_smaller_model_answers_a_functions_call_and_is_not_cached(
        setup: tuple[Running, FakeUpstream]) -> None:
    pop, up = setup
    q = quote(f"one two {uuid.uuid4().hex[:6]}")
    up.unavailable = [False]
    status, _, out = pop.get(f"/ask?m=echo&q={q}", timeout=60)
    assert status == 200, out
    said = json.loads(out)
    assert said["fallback"] == {"model": LOCAL, "origin": "overloaded"}
    assert said["cache"]["outcome"] == "miss"
    status, _, out = pop.get(f"/ask?m=echo&q={q}", timeout=60)  # the origin is back
    again = json.loads(out)
    assert status == 200 and again["cache"]["outcome"] == "miss", out  # nothing was stored
    assert "fallback" not in again and again["text"] == unquote(q)  # the echo


def test_no_fallback_to_a_model_the_callers_key_may_not_use(tmp_path: Path) -> None:
    with upstream() as up, pop_thread(tmp_path / "data", ai=True,
                                      ai_config=str(worker_config(tmp_path, up)),
                                      **{"ai.fallback": {"echo": LOCAL}}) as pop:
        store = KeyStore(pop.data)
        only_echo, both = (store.create("acme", scopes)[0]
                           for scopes in (("model:echo",), ("model:echo", f"model:{LOCAL}")))
        pop.admin.request("POST", "/v1/keys/reload")
        for key, status in ((only_echo, 503), (both, 200)):
            up.unavailable = [False]
            got, headers, out = chat(pop, "echo", f"x {uuid.uuid4().hex[:6]}",
                                     headers={"authorization": f"Bearer {key}"})
            assert got == status, out
            assert ("x-edgefn-fallback" in headers) is (status == 200)
