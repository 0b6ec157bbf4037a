"""The OpenAI API's wire rules without sockets: error types and params, the field
policy against the official client's request fields, messages, the stream
chunks, fingerprints and the `cors` stage."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params

from edgefn_core.errors import ApiError, InvalidConfig
from runtime import config
from runtime.ai.openai_api import ChatBody, CompletionBody, EmbeddingsBody, decode_body
from runtime.ai.openai_checks import check_messages
from runtime.ai.openai_errors import error_type, param_of, validation_error
from runtime.ai.openai_fields import _INERT, check_fields
from runtime.ai.openai_models import fingerprint
from runtime.net.message import Request, Response
from runtime.net.openai_sse import Chunks
from runtime.observe.event import AIUsage, Event
from runtime.observe.redact import MASK, Redactor
from runtime.pipeline.stage import Context
from runtime.pipeline.stages.cors import Cors

CHAT_FIELDS = sorted(chat_params.CompletionCreateParamsBase.__annotations__)
COMPLETION_FIELDS = sorted(completion_params.CompletionCreateParamsBase.__annotations__)


@pytest.mark.parametrize(("status", "kind"), [
    (400, "invalid_request_error"), (404, "invalid_request_error"),
    (405, "invalid_request_error"), (413, "invalid_request_error"),
    (415, "invalid_request_error"), (422, "invalid_request_error"),
    (401, "authentication_error"), (403, "permission_error"), (429, "rate_limit_error"),
    (500, "server_error"), (503, "server_error"), (504, "server_error")])
def test_each_status_gets_openais_error_type(status: int, kind: str) -> None:
    assert error_type(status) == kind


def _validation(body: dict[str, Any]) -> str:
    with pytest.raises(msgspec.ValidationError) as e:
        msgspec.convert(body, ChatBody)
    return str(e.value)


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "m"}, "messages"),
    ({"model": "m", "messages": "hi"}, "messages"),
    ({"model": "m", "messages": ["hi"]}, "messages[0]"),
    ({"model": "m", "messages": [], "temperature": "hot"}, "temperature"),
    ({"model": "m", "messages": [], "stream_options": {"include_usage": 1}},
     "stream_options.include_usage"),
    ({"messages": []}, "model"),
])
def test_a_validation_error_names_its_field_nested_too(body: dict[str, Any], param: str
                                                      ) -> None:
    assert param_of(_validation(body)) == param


class Inner(msgspec.Struct, forbid_unknown_fields=True):
    a: int = 0


class Outer(msgspec.Struct):
    items: list[Inner]


def test_an_unknown_nested_field_is_joined_to_its_place() -> None:
    with pytest.raises(msgspec.ValidationError) as e:
        msgspec.convert({"items": [{"a": 1}, {"b": 2}]}, Outer)
    assert param_of(str(e.value)) == "items[1].b"
    err = validation_error(str(e.value))
    assert (err.code, err.param) == ("invalid_value", "items[1].b")


@pytest.mark.parametrize(("kind", "names"), [(ChatBody, CHAT_FIELDS),
                                             (CompletionBody, COMPLETION_FIELDS)])
def test_every_field_of_the_official_client_is_honoured_or_has_a_policy(
        kind: type[msgspec.Struct], names: list[str]) -> None:
    unknown = [n for n in names if n not in kind.__struct_fields__ and n not in _INERT]
    assert not unknown, f"fields of openai's params with no policy here: {unknown}"


@pytest.mark.parametrize(("field", "value"), [
    ("service_tier", "flex"), ("store", True), ("modalities", ["text", "audio"]),
    ("reasoning_effort", "low"), ("audio", {"voice": "alloy", "format": "mp3"}),
    ("functions", [{"name": "f"}]), ("function_call", "auto")])
def test_a_field_asking_for_what_is_not_implemented_is_a_400_naming_it(field: str,
                                                                       value: Any) -> None:
    body = json.dumps({"model": "m", "messages": [], field: value}).encode()
    with pytest.raises(ApiError) as e:
        check_fields(body, ChatBody)
    assert (e.value.status, e.value.code, e.value.param) == (400, "unsupported_parameter", field)


@pytest.mark.parametrize(("field", "value"), [
    ("logprobs", False), ("logprobs", None), ("tools", []), ("tool_choice", "none"),
    ("presence_penalty", 0), ("logit_bias", {}), ("service_tier", "auto"), ("store", False),
    ("response_format", {"type": "text"}), ("modalities", ["text"])])
def test_the_value_that_asks_for_nothing_is_accepted(field: str, value: Any) -> None:
    check_fields(json.dumps({"model": "m", "messages": [], field: value}).encode(), ChatBody)


@pytest.mark.parametrize(("kind", "field", "value"), [
    (ChatBody, "logprobs", True), (ChatBody, "top_logprobs", 3),
    (ChatBody, "tools", [{"type": "function", "function": {"name": "f"}}]),
    (ChatBody, "tool_choice", "required"), (ChatBody, "response_format", {"type": "json_object"}),
    (ChatBody, "presence_penalty", 0.5), (ChatBody, "frequency_penalty", -1),
    (ChatBody, "logit_bias", {"50": 5}), (ChatBody, "parallel_tool_calls", False),
    (CompletionBody, "logprobs", 0)])
def test_what_structured_output_tools_and_logprobs_take_passes_the_field_policy(
        kind: type[msgspec.Struct], field: str, value: Any) -> None:
    base = {"model": "m", "messages": []} if kind is ChatBody else {"model": "m", "prompt": "x"}
    check_fields(json.dumps({**base, field: value}).encode(), kind)


def test_an_unknown_field_is_unrecognized_as_openai_says() -> None:
    with pytest.raises(ApiError) as e:
        check_fields(b'{"model": "m", "input": "x", "foo": 1}', EmbeddingsBody)
    assert (e.value.status, e.value.param) == (400, "foo")
    assert str(e.value) == "Unrecognized request argument supplied: foo"


def call(n: int) -> dict[str, Any]:
    return {"id": f"call_{n}", "type": "function",
            "function": {"name": "now", "arguments": "{}"}}


ANSWERED = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call(1), call(2)]},
            {"role": "tool", "content": "12:00", "tool_call_id": "call_1"}]


@pytest.mark.parametrize(("messages", "param"), [
    ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
    ([{"role": "user", "content": "hi"}, {"content": "x"}], "messages[1].role"),
    ([{"role": "function", "content": "42", "name": "f"}], "messages[0].role"),
    ([{"role": "user", "content": 7}], "messages[0].content"),
    ([{"role": "assistant", "content": "x", "function_call": {"name": "f"}}],
     "messages[0].function_call"),
    ([{"role": "system"}], "messages[0].content"),
    ([], "messages"),
    # a tool message answers a call of the assistant message before it (OpenAI: a 400)
    ([{"role": "user", "content": "hi"}, {"role": "tool", "content": "12"}],
     "messages[1].tool_call_id"),
    ([{"role": "user", "content": "hi"}, {"role": "tool", "content": "12",
                                           "tool_call_id": "call_1"}], "messages[1].role"),
    ([*ANSWERED[:2], {"role": "tool", "content": "12", "tool_call_id": "zzz"}],
     "messages[2].tool_call_id"),
    ([*ANSWERED, {"role": "user", "content": "and?"}, {"role": "tool", "content": "1",
                                                        "tool_call_id": "call_1"}],
     "messages[4].role")])
def test_a_bad_message_is_refused_naming_it(messages: list[dict[str, Any]], param: str
                                           ) -> None:
    with pytest.raises(ApiError) as e:
        check_messages(messages)
    assert (e.value.status, e.value.param) == (400, param)


def test_tool_messages_that_answer_the_calls_before_them_are_accepted() -> None:
    check_messages(ANSWERED)
    check_messages([*ANSWERED[:3], {"role": "tool", "content": "2", "tool_call_id": "call_2"}])


def test_more_messages_than_any_context_holds_are_refused_before_they_are_read() -> None:
    from runtime.ai.openai_checks import MAX_MESSAGES

    check_messages([{"role": "user", "content": "x"}] * MAX_MESSAGES)
    with pytest.raises(ApiError) as e:
        check_messages([{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1))
    assert (e.value.status, e.value.param, e.value.code) == (
        400, "messages", "context_length_exceeded")
    assert f"at most {MAX_MESSAGES} are taken" in str(e.value)


def test_every_openai_role_with_text_is_accepted() -> None:
    check_messages([{"role": r, "content": "x"} for r in
                    ("system", "developer", "user", "assistant")]
                   + [{"role": "assistant", "content": None},
                      {"role": "user", "content": [{"type": "text", "text": "x"}]}])


def _events(raw: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(e.removeprefix(b"data: ")) for e in raw]


def test_chunks_carry_usage_null_until_the_usage_chunk_and_the_fingerprint() -> None:
    c = Chunks("id", "m", True, "fp_0123456789", include_usage=True)
    out = _events([*c.opening(2), c.chunk("a", index=1), c.closing("stop", 1),
                   c.usage({"total_tokens": 3})])
    assert [e["usage"] for e in out] == [None, None, None, None, {"total_tokens": 3}]
    assert {e["system_fingerprint"] for e in out} == {"fp_0123456789"}
    assert [ch["index"] for e in out[:4] for ch in e["choices"]] == [0, 1, 1, 1]
    assert out[-1]["choices"] == []
    plain = _events([Chunks("id", "m", True).chunk("a")])[0]
    assert "usage" not in plain and "system_fingerprint" not in plain


def test_a_fingerprint_follows_the_model_build_only() -> None:
    model = {"id": "m", "engine": "llamacpp",
             "details": {"file": "a.gguf", "bytes": 10, "mtime": 5}}
    same = fingerprint(json.loads(json.dumps(model)))
    assert fingerprint(model) == same and same.startswith("fp_") and len(same) == 13
    touched = {**model, "details": {**model["details"], "mtime": 6}}
    assert fingerprint(touched) != same
    adapter = {"id": "a", "engine": "llamacpp", "details": {"path": "x.gguf", "scale": 1.0}}
    assert fingerprint(adapter, model) != fingerprint(adapter, touched)


def test_user_is_recorded_and_blanked_by_redact() -> None:
    event = Event(ts=0.0, rid="r", pop="p", tier="edge", client="c", method="POST", host="h",
                  path="/v1/chat/completions", status=200, ai=AIUsage(operation="chat", model="m",
                                                       user="alice@example.com"))
    assert Redactor([])(event).ai.user == "alice@example.com"  # type: ignore[union-attr]
    assert Redactor(["user"])(event).ai.user == MASK  # type: ignore[union-attr]


# -- the cors stage ------------------------------------------------------------------------
def _request(method: bytes, path: bytes, headers: list[tuple[bytes, bytes]]) -> Request:
    return Request(method, path, b"", headers, b"localhost", "1.1", True, "127.0.0.1:1")


def _through(stage: Cors, request: Request, downstream: Response | None = None) -> Response:
    passed: list[Request] = []

    def call_next(req: Request, ctx: Context) -> Response:
        passed.append(req)
        return downstream or Response(200, [], b"ok")

    out = stage(request, Context("127.0.0.1:1"), call_next)
    assert isinstance(out, Response)
    return out


ORIGIN = (b"origin", b"https://app.example")
PREFLIGHT = [ORIGIN, (b"access-control-request-method", b"POST"),
             (b"access-control-request-headers", b"authorization, content-type")]


def test_a_preflight_from_an_allowed_origin_is_answered() -> None:
    cors = Cors(config.CorsStage(allowed_origins=("https://app.example",), max_age=60))
    r = _through(cors, _request(b"OPTIONS", b"/v1/chat/completions", PREFLIGHT))
    h = dict(r.headers)
    assert r.status == 204
    assert h[b"access-control-allow-origin"] == b"https://app.example"
    assert h[b"access-control-allow-methods"] == b"POST"
    assert h[b"access-control-allow-headers"] == b"authorization, content-type"
    assert h[b"access-control-max-age"] == b"60" and h[b"vary"] == b"origin"


def test_a_disallowed_origin_gets_no_cors_headers() -> None:
    cors = Cors(config.CorsStage(allowed_origins=("https://app.example",)))
    evil = [(b"origin", b"https://evil.example"), *PREFLIGHT[1:]]
    refused = _through(cors, _request(b"OPTIONS", b"/v1/models", evil))
    plain = _through(cors, _request(b"GET", b"/v1/models", evil[:1]))
    assert refused.status == 403 and plain.status == 200
    for r in (refused, plain):
        assert not [k for k, _ in r.headers if k.startswith(b"access-control")]


def test_listed_methods_and_headers_bound_a_preflight() -> None:
    cors = Cors(config.CorsStage(allowed_methods=("GET",), allowed_headers=("content-type",)))
    assert _through(cors, _request(b"OPTIONS", b"/v1/x", PREFLIGHT)).status == 403
    get = [ORIGIN, (b"access-control-request-method", b"GET")]
    h = dict(_through(cors, _request(b"OPTIONS", b"/v1/x", get)).headers)
    assert (h[b"access-control-allow-origin"], h[b"access-control-allow-headers"]) == (
        b"*", b"content-type")


def test_responses_and_streams_get_the_origin_header_only_on_its_paths() -> None:
    cors = Cors(config.CorsStage())

    async def body() -> Any:
        yield b"data: x\n\n"

    stream = _through(cors, _request(b"POST", b"/v1/chat/completions", [ORIGIN]),
                      Response(200, [], body()))
    assert (b"access-control-allow-origin", b"*") in stream.headers
    other = _through(cors, _request(b"GET", b"/hello", [ORIGIN]))
    assert not [k for k, _ in other.headers if k.startswith(b"access-control")]


def test_an_awaited_response_is_tagged_too() -> None:
    cors = Cors(config.CorsStage(allowed_origins=("https://app.example",),
                                 allow_credentials=True))

    async def later(req: Request, ctx: Context) -> Response:
        return Response(200)

    out = cors(_request(b"GET", b"/v1/models", [ORIGIN]), Context("127.0.0.1:1"), later)
    r = asyncio.run(out)  # type: ignore[arg-type]
    assert (b"access-control-allow-credentials", b"true") in r.headers


@pytest.mark.parametrize(("pipeline", "field"), [
    ([{"stage": "auth"}, {"stage": "cors"}], "pipeline[1].stage"),
    ([{"stage": "cors", "allow_credentials": True}], "pipeline[0].allow_credentials"),
    ([{"stage": "cors", "allowed_origins": ["app.example"]}], "pipeline[0].allowed_origins"),
    ([{"stage": "cors", "max_age": -1}], "pipeline[0].max_age"),
])
def test_a_bad_cors_config_names_the_field(tmp_path: Any, pipeline: list[dict[str, Any]],
                                           field: str) -> None:
    path = tmp_path / "pop.toml"
    path.write_text("".join("[[pipeline]]\n" + "".join(f"{k} = {json.dumps(v)}\n"
                                                       for k, v in s.items())
                            for s in pipeline))
    with pytest.raises(InvalidConfig) as e:
        config.load(path)
    assert field in str(e.value) and "pop.toml" in str(e.value)


@pytest.mark.parametrize(("raw", "param"), [
    (b'{"model": "m", "messages": [], "max_tokens": 1e400}', "max_tokens"),
    (b'{"model": "m", "messages": [], "temperature": -1e999}', "temperature"),
])
def test_a_number_out_of_range_names_its_field(raw: bytes, param: str) -> None:
    """It said `$[...]`: the untyped decode (for top-level nulls) lost the path."""
    with pytest.raises(msgspec.ValidationError) as e:
        decode_body(raw, ChatBody)
    assert param_of(str(e.value)) == param


@pytest.mark.parametrize("where", [b'"messages":[{"role":"user","content":"x","zz":%s}]',
                                   b'"messages":[{"role":"user","content":"x"}],"user":%s',
                                   b'"messages":[{"role":"user","content":"x"}],"metadata":%s'])
def test_json_nested_past_the_recursion_limit_is_a_400_not_a_500(where: bytes) -> None:
    """msgspec raises RecursionError for it: the API answered 500 with a traceback
    in the log, and the AI cache stage raised it before the API saw the body."""
    from runtime.ai.openai_api import _decode
    from runtime.pipeline.stages.ai_cache import _asked

    body = b'{"model":"m",' + where % (b"[" * 100_000 + b"]" * 100_000) + b"}"
    with pytest.raises(ApiError) as e:
        _decode(body, ChatBody)
    assert e.value.status == 400
    assert _asked("chat", body, None) is None
