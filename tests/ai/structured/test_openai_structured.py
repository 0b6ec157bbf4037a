"""Structured output, tools, logprobs, penalties and logit_bias through a real
PoP and the real 135M chat model, driven with the official `openai` client over
loopback. Arguments and answers are checked with `jsonschema`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import llama_cpp as ll
import openai
import pydantic
import pytest

from gpu_worker.models import packaged_model
from tests.ai.structured.test_constrain import LIMITS
from tests.support import Running, pop_thread

CHAT = "smollm2-135m"
DATA = Path(__file__).resolve().parents[3] / "bench" / "data" / "structured_schemas.json"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                    "b": {"type": "number"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}  # type: ignore[index]
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def pop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with pop_thread(tmp_path_factory.mktemp("structured-pop"), ai=True) as running:
        yield running


@pytest.fixture(scope="module")
def client(pop: Running) -> Iterator[openai.OpenAI]:
    with pop.openai(timeout=300) as c:
        yield c


def chat(client: openai.OpenAI, **kw: Any) -> Any:
    kw.setdefault("messages", ASK)
    return client.chat.completions.create(model=CHAT, temperature=0, **kw)


def check_calls(calls: list[tuple[str, str]]) -> None:
    """Every call names a tool and its arguments validate against that tool."""
    assert calls
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), PARAMS[name])


def test_json_schema_sample_parses_and_validates(client: openai.OpenAI) -> None:
    data = json.loads(DATA.read_text())
    picked = {s["name"]: s for s in data["schemas"]}
    for name, prompt in [("person", 0), ("tags", 1), ("refs", 2), ("mixed", 3)]:
        spec = picked[name]
        r = chat(client, messages=[{"role": "user", "content": data["prompts"][prompt]}],
                 max_tokens=120, response_format={"type": "json_schema",
                                                  "json_schema": {**spec, "strict": True}})
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        jsonschema.validate(json.loads(r.choices[0].message.content), spec["schema"])


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    age: int


def test_beta_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    r = client.beta.chat.completions.parse(
        model=CHAT, temperature=0, max_tokens=60, response_format=Person,
        messages=[{"role": "user", "content": "Invent a person with a name and an age."}])
    person = r.choices[0].message.parsed
    assert isinstance(person, Person) and person.name


def test_json_object_is_an_object(client: openai.OpenAI) -> None:
    r = chat(client, max_tokens=60, response_format={"type": "json_object"},
             messages=[{"role": "user", "content": "Describe a cat."}])
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def raw_controls_in_strings(text: str) -> list[str]:
    """The raw control characters (U+0000-U+001F) inside the JSON strings of `text`,
    which JSON does not allow (RFC 8259 7); `text` may be cut short."""
    found, inside, escaped = [], False, False
    for ch in text:
        if inside and not escaped and ch < " ":
            found.append(ch)
        if escaped:
            escaped = False
        elif inside and ch == "\\":
            escaped = True
        elif ch == '"':
            inside = not inside
    return found


def test_json_strings_hold_no_raw_control_character(client: openai.OpenAI) -> None:
    """At temperature 1, seed 0, the model wrote raw newlines inside strings (the
    grammar's `char` was llama-cpp-python's ``[^"\\]``): `json.loads` refused it."""
    for seed in range(3):
        r = client.chat.completions.create(
            model=CHAT, temperature=1.0, seed=seed, max_tokens=120,
            response_format={"type": "json_object"},
            messages=[{"role": "user", "content": "Reply with JSON"}])
        content = r.choices[0].message.content
        assert raw_controls_in_strings(content) == [], (seed, content)
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(content), dict)


def test_tools_round_trip(client: openai.OpenAI) -> None:
    r = chat(client, max_tokens=60, tools=TOOLS, tool_choice="required",
             parallel_tool_calls=False)
    choice = choice0 = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert len(calls) == 1 and calls[0].id.startswith("call_") and calls[0].type == "function"
    check_calls([(c.function.name, c.function.arguments) for c in calls])
    history = [*ASK, choice0.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny, 21 C"}]
    again = chat(client, messages=history, tools=TOOLS, tool_choice="none", max_tokens=24)
    assert again.choices[0].message.content and not again.choices[0].message.tool_calls


def test_streamed_tool_calls_reassemble(client: openai.OpenAI) -> None:
    calls: dict[int, dict[str, str]] = {}
    firsts, finish = [], None
    for chunk in chat(client, max_tokens=60, tools=TOOLS, tool_choice="required",
                      parallel_tool_calls=False, stream=True):
        finish = chunk.choices[0].finish_reason or finish
        for d in chunk.choices[0].delta.tool_calls or []:
            if d.id is not None:
                firsts.append(d)
            call = calls.setdefault(d.index, {"name": "", "arguments": ""})
            call["name"] += d.function.name or ""
            call["arguments"] += d.function.arguments or ""
    assert finish == "tool_calls" and len(firsts) == len(calls) == 1
    assert firsts[0].type == "function" and firsts[0].function.name in PARAMS
    check_calls([(c["name"], c["arguments"]) for c in calls.values()])


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "add"}},
                                    "auto", "none"])
def test_tool_choice_forms(client: openai.OpenAI, choice: Any) -> None:
    r = chat(client, max_tokens=60, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False)
    msg = r.choices[0].message
    if choice == "none":
        assert msg.content and msg.tool_calls is None
    elif isinstance(choice, dict):
        assert [c.function.name for c in msg.tool_calls] == ["add"]
    if msg.tool_calls:  # auto: a call or an answer, whichever the model takes, well formed
        check_calls([(c.function.name, c.function.arguments) for c in msg.tool_calls])
    else:
        assert msg.content and "<tool_call>" not in msg.content


def test_logprobs_shape_and_values(client: openai.OpenAI) -> None:
    r = chat(client, max_tokens=6, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and bytes(t.bytes).decode() == t.token and len(t.top_logprobs) == 3
        tops = [a.logprob for a in t.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob
    streamed = chat(client, max_tokens=6, logprobs=True, top_logprobs=3, stream=True)
    entries = [t for ch in streamed if ch.choices and ch.choices[0].logprobs
               for t in ch.choices[0].logprobs.content]
    assert [(t.token, round(t.logprob, 4)) for t in entries] == [
        (t.token, round(t.logprob, 4)) for t in content]


def test_logprobs_end_where_a_stop_string_cut_the_answer(client: openai.OpenAI) -> None:
    """The tokens of the stop string were listed after the answer's own."""
    full = chat(client, max_tokens=12, logprobs=True).choices[0]
    tokens = [t.token for t in full.logprobs.content]
    at = next(i for i in range(2, len(tokens)) if tokens[i].strip() and "".join(
        tokens[:i + 1]).find(tokens[i]) == len("".join(tokens[:i])))  # first occurs there
    cut = chat(client, max_tokens=12, logprobs=True, stop=[tokens[at]]).choices[0]
    assert cut.finish_reason == "stop" and cut.message.content == "".join(tokens[:at])
    assert [t.token for t in cut.logprobs.content] == tokens[:at]


def test_completion_logprobs(client: openai.OpenAI) -> None:
    r = client.completions.create(model=CHAT, prompt="The sky is", max_tokens=5,
                                  temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.top_logprobs) == len(lp.tokens)
    assert all(x <= 0 for x in lp.token_logprobs) and lp.text_offset[0] == len("The sky is")
    assert all(len(alts) == 2 for alts in lp.top_logprobs)


def greedy_token(client: openai.OpenAI, **kw: Any) -> tuple[str, float]:
    r = chat(client, max_tokens=1, logprobs=True, top_logprobs=1, **kw)
    t = r.choices[0].logprobs.content[0]
    return t.token, t.logprob


class Vocab:
    """The chat model's vocabulary alone (no weights), to find token ids."""

    def __init__(self) -> None:
        params = ll.llama_model_default_params()
        params.vocab_only = True
        self.model = ll.llama_model_load_from_file(str(packaged_model()).encode(), params)
        self.vocab = ll.llama_model_get_vocab(self.model)

    def token(self, text: str) -> int:
        """The id of `text`, which must be one token."""
        buf = (ll.llama_token * 8)()
        n = ll.llama_tokenize(self.vocab, text.encode(), len(text.encode()), buf, 8, False, False)
        assert n == 1, f"{text!r} is {n} tokens"
        return int(buf[0])


@pytest.fixture(scope="module")
def vocab() -> Iterator[Vocab]:
    v = Vocab()
    yield v
    ll.llama_model_free(v.model)


def test_logit_bias_bans_and_forces_tokens(client: openai.OpenAI, vocab: Vocab) -> None:
    first, _ = greedy_token(client)
    banned, _ = greedy_token(client, logit_bias={str(vocab.token(first)): -100})
    assert banned != first
    forced, logprob = greedy_token(client, logit_bias={str(vocab.token(" banana")): 100})
    assert forced == " banana" and logprob > -0.01


def test_penalties_change_the_output(client: openai.OpenAI) -> None:
    ask = [{"role": "user", "content": "Say 'yes yes yes yes yes yes yes yes'"}]
    plain = chat(client, messages=ask, max_tokens=12).choices[0].message.content
    penalized = chat(client, messages=ask, max_tokens=12, presence_penalty=2,
                     frequency_penalty=2).choices[0].message.content
    assert plain.lower().count("yes") >= 6  # the model repeats, unpenalized
    assert penalized.lower().count("yes") < plain.lower().count("yes") / 2


@pytest.mark.parametrize(("fields", "param"), [
    ({"tools": [{"type": "function", "function": {"name": "x y"}}]}, "tools[0].function.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}}}}},
     "response_format.json_schema.schema.properties.n.maximum"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "patternProperties": {}}}}]},
     "tools[0].function.parameters.patternProperties"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]},
     "tools"),
    ({"logit_bias": {"999999": 5}}, "logit_bias"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_bad_inputs_are_400_with_param(client: openai.OpenAI, fields: dict[str, Any],
                                       param: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, max_tokens=4, **fields)
    body: Any = e.value.body
    assert e.value.status_code == 400 and body["param"] == param
    assert body["type"] == "invalid_request_error" and body["message"]


@pytest.mark.parametrize(("inside", "past", "where", "message"), LIMITS,
                         ids=[m.split(" (")[0] for *_, m in LIMITS])
def test_schema_size_limits_through_the_api(client: openai.OpenAI, inside: dict[str, Any],
                                            past: dict[str, Any], where: str | None,
                                            message: str) -> None:
    """Just inside a limit the model answers (llama.cpp takes the grammar); just past
    it the API answers 400 naming the limit and the schema part past it."""
    def fmt(schema: dict[str, Any]) -> dict[str, Any]:
        return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}

    r = chat(client, max_tokens=3, response_format=fmt(inside))
    assert r.choices[0].finish_reason in ("length", "stop")
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, max_tokens=3, response_format=fmt(past))
    body: Any = e.value.body
    param = "response_format" if where == "" else "response_format.json_schema.schema" + (
        f".{where}" if where else "")
    assert body["param"] == param and body["code"] == "unsupported_schema"
    assert body["message"].startswith(f"{param}: {message}")


AGENT = Path(__file__).resolve().parents[3] / "functions" / "examples" / "agent-py"


def test_agent_example_calls_a_tool_and_answers_with_its_result(pop: Running) -> None:
    pop.admin.deploy(AGENT)
    facts = {"capital_of_norway": "Oslo", "boiling_point_of_water": "100 degrees Celsius"}
    status, _, _ = pop.request("POST", "/agent-py/facts", json.dumps(facts).encode(),
                               timeout=60)
    assert status == 201
    status, _, body = pop.request("GET", "/agent-py?q=What+is+the+capital+of+Norway%3F",
                                  timeout=300)
    out = json.loads(body)
    assert status == 200, out
    [call] = out["calls"]  # the grammar allows exactly one call, naming a stored key
    key = json.loads(call["function"]["arguments"])["key"]
    assert call["function"]["name"] == "lookup" and key in facts
    assert out["results"] == [{"key": key, "value": facts[key]}]
    assert out["answer"]  # the second turn saw the tool's result and answered in text



def test_langchain_structured_output_and_bound_tools(pop: Running) -> None:
    from langchain_core.messages import AIMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=CHAT, base_url=f"http://{pop.host}:{pop.port}/v1", api_key="unused",
                     temperature=0, max_tokens=60, max_retries=0, timeout=300)
    person = llm.with_structured_output(Person, method="json_schema", strict=True).invoke(
        "Invent a person with a name and an age.")
    assert isinstance(person, Person) and person.name
    reply = llm.bind_tools(TOOLS, tool_choice="get_weather",
                           parallel_tool_calls=False).invoke("What is the weather in Oslo?")
    assert isinstance(reply, AIMessage) and [c["name"] for c in reply.tool_calls] == [
        "get_weather"]
    jsonschema.validate(reply.tool_calls[0]["args"], PARAMS["get_weather"])
