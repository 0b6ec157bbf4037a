"""The OpenAI API's wire details against a real PoP and the real model worker,
driven by the official `openai` client, LangChain's `ChatOpenAI` and raw HTTP:
n choices, seed and system_fingerprint, stream usage chunks, models by id,
every request field honoured or refused, error types, CORS from a browser's
point of view, and the API's answers on a PoP without a model worker."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import openai
import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params

from gpu_worker.models import packaged_model
from runtime.observe.event import Event

from .support import Running, pop_thread

CHAT = "smollm2-135m"
HELLO = [{"role": "user", "content": "Say hello."}]
APP = "https://app.example"
PIPELINE = [{"stage": s} for s in ("health", "request_id", "events", "access_log")] + [
    {"stage": "cors", "allowed_origins": [APP], "max_age": 120}] + [
    {"stage": s} for s in ("waf", "bots", "auth", "ratelimit", "http_cache", "ai_cache",
                           "openai", "route", "dispatch")]


@pytest.fixture(scope="module")
def pop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with pop_thread(tmp_path_factory.mktemp("wire-pop"), ai=True, pipeline=PIPELINE) as r:
        yield r


@pytest.fixture(scope="module")
def client(pop: Running) -> Iterator[openai.OpenAI]:
    with pop.openai(timeout=60) as c:
        yield c


def post(pop: Running, path: str, body: dict[str, Any], **headers: str
         ) -> tuple[int, dict[str, str], bytes]:
    return pop.request("POST", path, json.dumps(body).encode(),
                       {"content-type": "application/json", **headers}, timeout=60)


def error_of(data: bytes) -> dict[str, Any]:
    err = json.loads(data)["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    return err  # type: ignore[no-any-return]


def sse_events(data: bytes) -> list[dict[str, Any]]:
    lines = [ln for ln in data.split(b"\n\n") if ln]
    assert lines[-1] == b"data: [DONE]"
    return [json.loads(ln.removeprefix(b"data: ")) for ln in lines[:-1]]


# -- n, seed, system_fingerprint ------------------------------------------------------------
def test_n_2_gives_two_choices_with_summed_usage(client: openai.OpenAI) -> None:
    one = client.chat.completions.create(model=CHAT, messages=HELLO,  # type: ignore[arg-type]
                                         max_tokens=6, temperature=0)
    two = client.chat.completions.create(model=CHAT, messages=HELLO,  # type: ignore[arg-type]
                                         max_tokens=6, temperature=0, n=2)
    assert [c.index for c in two.choices] == [0, 1]
    # temperature 0: both sequences are the greedy answer, as the single one
    assert {c.message.content for c in two.choices} == {one.choices[0].message.content}
    assert two.usage is not None and one.usage is not None
    assert two.usage.prompt_tokens == one.usage.prompt_tokens  # counted once, as OpenAI
    assert two.usage.completion_tokens == 2 * one.usage.completion_tokens


def test_same_seed_same_sampled_output_and_a_stable_fingerprint(client: openai.OpenAI) -> None:
    def sampled(seed: int) -> Any:
        return client.completions.create(model=CHAT, prompt="Once upon a time", max_tokens=8,
                                         temperature=1.0, seed=seed,
                                         extra_headers={"cache-control": "no-store"})

    a, b, c = sampled(7), sampled(7), sampled(8)
    assert a.choices[0].text == b.choices[0].text
    texts = {sampled(s).choices[0].text for s in (8, 9, 10)} | {c.choices[0].text}
    assert len(texts) > 1  # the seed does steer sampling
    fps = {a.system_fingerprint, b.system_fingerprint, c.system_fingerprint}
    assert len(fps) == 1 and next(iter(fps)).startswith("fp_")  # type: ignore[union-attr]


def test_an_ai_cache_hit_keeps_the_fingerprint_and_usage_nulls(pop: Running) -> None:
    body = {"model": CHAT, "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 3, "temperature": 0}
    _, _, miss = post(pop, "/v1/chat/completions", body)
    _, h, hit = post(pop, "/v1/chat/completions", body)
    assert h["x-edgefn-cache"] == "hit-exact"
    fp = json.loads(miss)["system_fingerprint"]
    assert fp.startswith("fp_") and json.loads(hit)["system_fingerprint"] == fp
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    post(pop, "/v1/chat/completions", streamed)
    _, h, data = post(pop, "/v1/chat/completions", streamed)
    events = sse_events(data)
    assert h["x-edgefn-cache"] == "hit-exact" and {e["system_fingerprint"] for e in events} == {fp}
    assert [e["usage"] is None for e in events] == [True] * (len(events) - 1) + [False]


def test_stream_with_include_usage_has_usage_null_until_the_end(pop: Running) -> None:
    status, _, data = post(pop, "/v1/chat/completions", {
        "model": CHAT, "messages": HELLO, "max_tokens": 5, "stream": True,
        "stream_options": {"include_usage": True}})
    assert status == 200
    events = sse_events(data)
    assert all(e["usage"] is None and e["choices"] for e in events[:-1])
    assert events[-1]["choices"] == [] and events[-1]["usage"]["total_tokens"] > 0
    assert len({e["system_fingerprint"] for e in events}) == 1
    _, _, plain = post(pop, "/v1/chat/completions", {"model": CHAT, "messages": HELLO,
                                                    "max_tokens": 3, "stream": True})
    assert all("usage" not in e for e in sse_events(plain))


def test_n_2_streams_both_choices_interleaved(client: openai.OpenAI) -> None:
    one = client.chat.completions.create(model=CHAT, messages=HELLO,  # type: ignore[arg-type]
                                         max_tokens=6, temperature=0)
    stream = client.chat.completions.create(
        model=CHAT, messages=HELLO, max_tokens=6, temperature=0, n=2,  # type: ignore[arg-type]
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    content = [c.choices[0].index for c in chunks if c.choices and c.choices[0].delta.content]
    texts = ["".join(c.choices[0].delta.content or "" for c in chunks
                     if c.choices and c.choices[0].index == i) for i in (0, 1)]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices
                and c.choices[0].finish_reason]
    assert texts == [one.choices[0].message.content] * 2
    assert content[:4] == [0, 1, 0, 1], content  # interleaved, not one after the other
    assert finishes == [one.choices[0].finish_reason] * 2
    usage, single = chunks[-1].usage, one.usage
    assert usage is not None and single is not None
    assert usage.completion_tokens == 2 * single.completion_tokens


def test_n_past_the_cap_is_a_400_naming_n(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=CHAT, messages=HELLO, n=9)  # type: ignore[arg-type]
    assert e.value.param == "n" and "[1, 8]" in e.value.message


def test_user_is_recorded_in_the_requests_event(pop: Running) -> None:
    rid = f"wire-user-{time.monotonic_ns()}"
    status, _, _ = post(pop, "/v1/chat/completions", {
        "model": CHAT, "messages": HELLO, "max_tokens": 2, "user": "user-1234"},
        **{"x-request-id": rid})
    assert status == 200
    event = _event(pop, rid)
    assert event.ai is not None and event.ai.user == "user-1234"


def _event(pop: Running, rid: str) -> Event:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = [e for e in pop.pop.ring.events.copy() if e.rid == rid]
        if found:
            return found[0]
        time.sleep(0.02)
    raise AssertionError(f"no event for {rid}")


# -- every request field: honoured or refused -----------------------------------------------
PLAUSIBLE: dict[str, Any] = {
    "audio": {"voice": "alloy", "format": "mp3"}, "frequency_penalty": 0.5,
    "function_call": "auto", "functions": [{"name": "f", "parameters": {"type": "object"}}],
    "logit_bias": {"1": 10}, "logprobs": True, "max_completion_tokens": 2, "max_tokens": 2,
    "metadata": {"k": "v"}, "modalities": ["text", "audio"], "moderation": {"mode": "on"},
    "n": 2, "parallel_tool_calls": True, "prediction": {"type": "content", "content": "x"},
    "presence_penalty": 0.5, "prompt_cache_key": "k", "prompt_cache_options": {},
    "prompt_cache_retention": "24h", "reasoning_effort": "low",
    "response_format": {"type": "json_object"}, "safety_identifier": "u-1", "seed": 3,
    "service_tier": "flex", "stop": ["\n"], "store": True,
    "stream_options": {"include_usage": True}, "temperature": 0.5,
    "tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f"}}],
    "top_logprobs": 2, "top_p": 0.9, "user": "u-1", "verbosity": "low",
    "web_search_options": {}, "best_of": 2, "echo": True, "suffix": "!",
}
NEEDS_STREAM = {"stream_options"}


def _sent(path: str, base: dict[str, Any], field: str, pop: Running) -> None:
    body = {**base, "max_tokens": 2, field: PLAUSIBLE[field],
            **({"stream": True} if field in NEEDS_STREAM else {})}
    status, _, data = post(pop, path, body)
    if status == 200:
        return
    err = error_of(data)
    assert status == 400 and err["param"] == field, (field, status, err)


@pytest.mark.parametrize("field", sorted(chat_params.CompletionCreateParamsBase.__annotations__))
def test_each_chat_field_of_the_official_client_is_honoured_or_refused_by_name(
        pop: Running, field: str) -> None:
    if field in ("model", "messages"):
        return
    _sent("/v1/chat/completions", {"model": CHAT, "messages": HELLO}, field, pop)


@pytest.mark.parametrize("field", sorted(completion_params.CompletionCreateParamsBase
                                         .__annotations__))
def test_each_completion_field_of_the_official_client_is_honoured_or_refused_by_name(
        pop: Running, field: str) -> None:
    if field in ("model", "prompt"):
        return
    _sent("/v1/completions", {"model": CHAT, "prompt": "Hi"}, field, pop)


def test_an_unknown_field_is_unrecognized(pop: Running) -> None:
    status, _, data = post(pop, "/v1/chat/completions", {"model": CHAT, "messages": HELLO,
                                                         "foo": 1})
    err = error_of(data)
    assert (status, err["param"], err["type"]) == (400, "foo", "invalid_request_error")
    assert err["message"] == "Unrecognized request argument supplied: foo"


def test_a_refused_field_is_named_to_the_client(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=CHAT, messages=HELLO,  # type: ignore[arg-type]
                                       reasoning_effort="low", max_tokens=2)
    assert (e.value.param, e.value.code) == ("reasoning_effort", "unsupported_parameter")


def test_a_wizard_message_is_refused_naming_its_role(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=CHAT, max_tokens=2,
            messages=[{"role": "user", "content": "hi"},
                      {"role": "wizard", "content": "abracadabra"}])  # type: ignore[list-item]
    assert e.value.param == "messages[1].role"


def test_a_nested_type_error_names_the_nested_param(pop: Running) -> None:
    status, _, data = post(pop, "/v1/chat/completions", {
        "model": CHAT, "messages": HELLO, "stream": True, "stream_options": {"include_usage": 3}})
    assert (status, error_of(data)["param"]) == (400, "stream_options.include_usage")


# -- models --------------------------------------------------------------------------------
def test_models_retrieve_and_a_stable_created(client: openai.OpenAI, pop: Running) -> None:
    listed = {m.id: m.created for m in client.models.list()}
    again = {m.id: m.created for m in client.models.list()}
    assert listed == again
    assert listed[CHAT] == int(packaged_model().stat().st_mtime)  # the weights file's
    one = client.models.retrieve(CHAT)
    assert (one.id, one.created, one.object) == (CHAT, listed[CHAT], "model")
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert (e.value.code, e.value.param) == ("model_not_found", "model")
    status, _, data = pop.get("/v1/models/" + quote("org/no-such", safe=""))
    assert status == 404 and "'org/no-such'" in error_of(data)["message"]


# -- error shape on every /v1/ path --------------------------------------------------------
@pytest.mark.parametrize(("method", "path", "status", "code"), [
    ("GET", "/v1/foo", 404, "unknown_url"), ("POST", "/v1/responses", 404, "unknown_url"),
    ("DELETE", "/v1/models/smollm2-135m", 405, "method_not_allowed"),
    ("GET", "/v1/chat/completions", 405, "method_not_allowed")])
def test_every_v1_path_answers_in_openais_shape(pop: Running, method: str, path: str,
                                                status: int, code: str) -> None:
    got, _, data = pop.request(method, path)
    err = error_of(data)
    assert (got, err["code"], err["type"]) == (status, code, "invalid_request_error")


def test_openai_client_gets_not_found_for_an_unknown_path(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.get("/nowhere", cast_to=object)
    assert e.value.code == "unknown_url"


# -- CORS from a browser's point of view ---------------------------------------------------
def test_a_browser_preflight_then_a_streamed_call(pop: Running) -> None:
    status, h, _ = pop.request("OPTIONS", "/v1/chat/completions", headers={
        "origin": APP, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type"})
    assert status == 204
    assert h["access-control-allow-origin"] == APP and h["access-control-max-age"] == "120"
    assert h["access-control-allow-headers"] == "authorization, content-type"
    status, h, data = post(pop, "/v1/chat/completions", {
        "model": CHAT, "messages": HELLO, "max_tokens": 2, "stream": True}, origin=APP)
    assert status == 200 and h["access-control-allow-origin"] == APP
    assert data.endswith(b"data: [DONE]\n\n")


def test_a_disallowed_origin_gets_no_cors_headers(pop: Running) -> None:
    status, h, _ = pop.request("OPTIONS", "/v1/models", headers={
        "origin": "https://evil.example", "access-control-request-method": "GET"})
    assert status == 403 and not [k for k in h if k.startswith("access-control")]
    status, h, _ = pop.get("/v1/models", headers={"origin": "https://evil.example"})
    assert status == 200 and not [k for k in h if k.startswith("access-control")]


# -- LangChain ----------------------------------------------------------------------------
def test_langchain_chat_openai_invokes_and_streams(pop: Running) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=CHAT, base_url=f"http://{pop.host}:{pop.port}/v1", api_key="unused",
                     max_tokens=6, temperature=0, max_retries=0, timeout=60)
    answer = llm.invoke("Say hello.")
    assert isinstance(answer.content, str) and answer.content
    assert answer.response_metadata["system_fingerprint"].startswith("fp_")
    streamed = "".join(str(c.content) for c in llm.stream("Say hello."))
    assert streamed == answer.content


# -- a PoP without the model worker --------------------------------------------------------
def test_without_a_worker_v1_says_the_api_is_off(tmp_path: Path) -> None:
    with pop_thread(tmp_path, ai=False) as off:
        for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                             ("GET", "/v1/foo")):
            status, h, data = off.request(method, path, b"{}")
            err = error_of(data)
            assert (status, err["code"], err["type"]) == (404, "api_disabled",
                                                          "invalid_request_error"), path
            assert h["x-edgefn-error"] == "api_disabled"  # what its event records
        status, _, data = off.get("/elsewhere")
        assert status == 404 and json.loads(data)["error"]["kind"] == "no_route"
