"""Request fields the OpenAI API honours or refuses by name, never ignores, without
sockets: a message's keys (``name``, a typo), ``stream_options.include_obfuscation``,
``metadata`` and its bounds, ``dimensions`` checked before any embedding, and the
texts of an embedding, a rerank and a completion refused before the worker."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from edgefn_core.errors import ApiError
from runtime.ai.openai_api import (
    ChatBody,
    CompletionBody,
    EmbeddingsBody,
    OpenAIApi,
    RerankBody,
    _decode,
    _one_prompt,
)
from runtime.ai.openai_checks import check_messages
from runtime.ai.openai_errors import worker_param
from runtime.ai.openai_fields import check_fields
from runtime.pipeline.stages.ai_cache import _asked

HI = {"role": "user", "content": "Hi"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "now", "arguments": "{}"}}


def refused(messages: list[dict[str, Any]]) -> ApiError:
    with pytest.raises(ApiError) as e:
        check_messages(messages)
    assert e.value.status == 400
    return e.value


# -- a message's keys ----------------------------------------------------------------------
@pytest.mark.parametrize("role", ["system", "developer", "user", "assistant"])
def test_a_messages_name_is_refused_by_name(role: str) -> None:
    """The chat template takes a role and a text: a name read as "Hi" alone."""
    e = refused([{"role": role, "content": "Hi", "name": "bob"}])
    assert (e.code, e.param) == ("unsupported_parameter", "messages[0].name")
    assert "participant's name" in str(e) and "set it to null" in str(e)


@pytest.mark.parametrize(("message", "param"), [
    ({**HI, "foo": "bob"}, "messages[0].foo"),
    ({**HI, "foo": None}, "messages[0].foo"),  # unknown: null too, as at the top level
    ({**HI, "tool_call_id": "call_1"}, "messages[0].tool_call_id"),  # a tool message's
    ({**HI, "tool_calls": [CALL]}, "messages[0].tool_calls"),  # an assistant message's
    ({"role": "tool", "content": "1", "tool_call_id": "call_1", "name": "now"},
     "messages[0].name"),  # OpenAI's tool message has no name
    ({"role": "user", "foo": 1}, "messages[0].foo"),  # named before the missing content
])
def test_a_key_the_role_does_not_take_is_unrecognized(message: dict[str, Any], param: str
                                                      ) -> None:
    e = refused([message])
    assert (e.code, e.param) == ("unrecognized_argument", param)
    assert str(e).startswith(f"Unrecognized request argument supplied: {param}")


@pytest.mark.parametrize(("message", "param"), [
    ({"role": "assistant", "content": None, "refusal": "I can't"}, "messages[0].refusal"),
    ({"role": "assistant", "content": None, "audio": {"id": "a1"}}, "messages[0].audio"),
    ({"role": "assistant", "content": "x", "annotations": [{"type": "url_citation"}]},
     "messages[0].annotations"),
])
def test_an_assistant_field_that_is_not_read_is_refused(message: dict[str, Any], param: str
                                                        ) -> None:
    e = refused([HI, message])
    assert (e.code, e.param) == ("unsupported_parameter", param.replace("[0]", "[1]"))


def test_the_fields_each_role_takes_and_nulls_are_accepted() -> None:
    """A history as clients replay it: null for OpenAI's fields asks for nothing."""
    check_messages([
        {"role": "system", "content": "Be terse.", "name": None},
        {**HI, "name": None, "tool_call_id": None, "tool_calls": None},
        {"role": "assistant", "content": None, "tool_calls": [CALL], "refusal": None,
         "audio": None, "function_call": None, "name": None},
        {"role": "tool", "content": "12:00", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "Noon.", "refusal": None, "annotations": []}])


def test_a_message_key_is_refused_through_the_chat_body() -> None:
    body = json.dumps({"model": "m", "messages": [{**HI, "foo": "bob"}]}).encode()
    messages = _decode(body, ChatBody).messages
    assert refused(messages).param == "messages[0].foo"


# -- stream_options.include_obfuscation --------------------------------------------------
def _chat(**fields: Any) -> bytes:
    return json.dumps({"model": "m", "messages": [HI], **fields}).encode()


@pytest.mark.parametrize("value", [False, None])
def test_include_obfuscation_false_asks_for_nothing(value: bool | None) -> None:
    for kind, base in ((ChatBody, {"messages": [HI]}), (CompletionBody, {"prompt": "x"})):
        body = json.dumps({"model": "m", **base, "stream": True, "stream_options":
                           {"include_usage": True, "include_obfuscation": value}}).encode()
        assert _decode(body, kind).stream_options.include_usage is True  # type: ignore[union-attr]


def test_include_obfuscation_true_is_refused_naming_it_and_never_a_cache_hit() -> None:
    body = _chat(stream=True, stream_options={"include_obfuscation": True})
    with pytest.raises(ApiError) as e:
        _decode(body, ChatBody)
    assert (e.value.status, e.value.code, e.value.param) == (
        400, "unsupported_parameter", "stream_options.include_obfuscation")
    assert "set it to false" in str(e.value)
    assert _asked("chat", body, None) is None  # the cache answers only what the API takes
    assert _asked("chat", _chat(stream=True, stream_options={"include_obfuscation": False}),
                  None) is not None


def test_include_obfuscation_of_another_type_is_the_typed_400() -> None:
    with pytest.raises(ApiError) as e:
        _decode(_chat(stream=True, stream_options={"include_obfuscation": "yes"}), ChatBody)
    assert (e.value.code, e.value.param) == ("invalid_value",
                                             "stream_options.include_obfuscation")


# -- metadata -------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [{"a": "b"}, {str(i): "v" * 512 for i in range(16)},
                                   {"k" * 64: ""}, {}, None])
def test_metadata_within_openais_bounds_is_taken(value: Any) -> None:
    check_fields(_chat(metadata=value), ChatBody)
    check_fields(json.dumps({"model": "m", "prompt": "x", "metadata": value}).encode(),
                 CompletionBody)


@pytest.mark.parametrize(("value", "says"), [
    ({str(i): "v" for i in range(17)}, "17 keys; at most 16"),
    ({"k" * 65: "v"}, "65 characters; at most 64"),
    ({"k": "v" * 513}, "513 characters; at most 512"),
    ({"k": 1}, "string values"), (["k"], "an object"), ("k", "an object")])
def test_metadata_past_openais_bounds_is_a_400_naming_it(value: Any, says: str) -> None:
    with pytest.raises(ApiError) as e:
        check_fields(_chat(metadata=value), ChatBody)
    assert (e.value.status, e.value.param) == (400, "metadata")
    assert says in str(e.value)
    assert _asked("chat", _chat(metadata=value), None) is None


# -- dimensions before any work ----------------------------------------------------------
class _Worker:
    def __init__(self) -> None:
        self.embedded: list[list[str]] = []

    async def models(self) -> list[dict[str, Any]]:
        return [{"id": "e", "kind": "embed", "engine": "onnx", "details": {"dim": 4}},
                {"id": "far", "kind": "chat", "engine": "upstream", "details": {}}]

    async def embed(self, model: str, inputs: list[str], client: str | None = None,
                    **hop: Any) -> dict[str, Any]:
        self.embedded.append(inputs)
        return {"embeddings": [[0.5] * 4 for _ in inputs], "tokens": len(inputs)}

    async def rerank(self, model: str, query: str, documents: list[str], top_n: int | None,
                     client: str | None = None, **hop: Any) -> dict[str, Any]:
        self.embedded.append([query, *documents])
        return {"results": [{"index": i, "relevance_score": 0.5}
                            for i in range(len(documents))], "tokens": 1}


class _AI:
    def __init__(self) -> None:
        self.client = _Worker()
        self.models_version = 0
        self.loras: list[Any] = []
        self.fallback: dict[str, str] = {}


def _embed(model: str, dimensions: int | None, n: int = 2048) -> tuple[_AI, Any]:
    ai = _AI()
    api = OpenAIApi(ai)  # type: ignore[arg-type]
    body = EmbeddingsBody(model, [f"text {i}" for i in range(n)], dimensions=dimensions)
    try:
        return ai, asyncio.run(api.embeddings(body))
    except ApiError as e:
        return ai, e


def test_dimensions_the_model_cannot_make_are_refused_before_any_embedding() -> None:
    ai, e = _embed("e", 3)
    assert isinstance(e, ApiError) and (e.status, e.param) == (400, "dimensions")
    assert "makes embeddings of 4 dimensions and cannot shorten them" in str(e)
    assert ai.client.embedded == []  # nothing computed (nor charged: admitted after)


def test_the_models_own_dimensions_and_an_unlisted_size_still_embed() -> None:
    ai, ok = _embed("e", 4, n=2)
    assert ok.status == 200 and ai.client.embedded == [["text 0", "text 1"]]
    ai, e = _embed("far", 3, n=2)  # no size listed: checked on the answer, as before
    assert isinstance(e, ApiError) and e.param == "dimensions" and len(ai.client.embedded) == 1


# -- texts refused before the worker, said plainly ---------------------------------------
@pytest.mark.parametrize(("inputs", "param", "message"), [
    (["a", ""], "input[1]", "input[1] is an empty string"),
    ([], "input", "'input' must not be empty"), ("", "input", "input is an empty string")])
def test_an_empty_input_is_refused_before_the_worker(inputs: str | list[str], param: str,
                                                     message: str) -> None:
    ai = _AI()
    with pytest.raises(ApiError) as e:
        asyncio.run(OpenAIApi(ai).embeddings(  # type: ignore[arg-type]
            EmbeddingsBody("e", inputs)))
    assert (e.value.param, str(e.value)) == (param, message)
    assert ai.client.embedded == []


@pytest.mark.parametrize(("documents", "param", "says"), [
    ([{"title": "a"}], "documents[0].text", "documents[0] has no 'text'"),
    (["a", ""], "documents[1]", "documents[1] is an empty string"),
    (["a", {"text": ""}], "documents[1].text", "documents[1].text is an empty string"),
    ([{"text": 3}], "documents[0].text", "documents[0].text must be a string"),
    ([], "documents", "'documents' must not be empty")])
def test_a_rerank_document_without_text_says_so(documents: list[Any], param: str, says: str
                                                ) -> None:
    ai = _AI()
    with pytest.raises(ApiError) as e:
        asyncio.run(OpenAIApi(ai).rerank(RerankBody("e", "q", documents)))  # type: ignore[arg-type]
    assert (e.value.status, e.value.param) == (400, param)
    assert str(e.value).startswith(says)
    assert ai.client.embedded == []  # the worker never saw it


def test_rerank_documents_as_strings_and_objects() -> None:
    ai = _AI()
    out = asyncio.run(OpenAIApi(ai).rerank(  # type: ignore[arg-type]
        RerankBody("e", "q", ["a", {"text": "b"}])))
    assert out.status == 200 and ai.client.embedded == [["q", "a", "b"]]
    assert [r["document"]["text"] for r in json.loads(out.body)["results"]] == ["a", "b"]


@pytest.mark.parametrize("prompt", ["", [""]])
def test_an_empty_prompt_is_refused_saying_why(prompt: str | list[str]) -> None:
    with pytest.raises(ApiError) as e:
        _one_prompt(prompt)
    assert (e.value.status, e.value.param) == (400, "prompt")
    assert str(e.value).startswith("the prompt is empty: ") and "no" in str(e.value)


@pytest.mark.parametrize(("message", "param"), [
    ("messages[0].content[1] is not a text part: this model reads text only",
     "messages[0].content[1]"),
    ("messages[2] needs a string 'role' and a string (or text parts) 'content'", "messages[2]"),
    ("logit_bias: token 99999999 is not in the vocabulary", "logit_bias"),
    ("'input'[3] is an empty string", "input[3]"), ("input[0] is an empty string", "input[0]")])
def test_a_worker_refusal_names_its_whole_path(message: str, param: str) -> None:
    assert worker_param(message) == param
