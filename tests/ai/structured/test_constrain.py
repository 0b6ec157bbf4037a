"""The grammar a request's response_format and tools become (`constrain`), the
schema parts it refuses, and the API's checks of those fields (`structured`);
no model."""

from __future__ import annotations

from typing import Any

import pytest

from edgefn_core.errors import ApiError, EngineError, WorkerError
from gpu_worker.engines.constrain import grammar_for
from gpu_worker.protocol import Generate
from runtime.ai import structured

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
NOW = {"type": "function", "function": {"name": "now"}}


def fmt(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def rules(grammar: str | None) -> dict[str, str]:
    assert grammar is not None
    return dict(line.split(" ::= ", 1) for line in grammar.splitlines())


@pytest.mark.parametrize(("schema", "where"), [
    ({"type": "integer", "minimum": 1}, "minimum"),
    ({"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}]}}},
     "properties.a.oneOf"),
    ({"type": "string", "format": "email"}, "format"),
    ({"$ref": "https://example.com/s.json"}, "$ref"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "maxLength"),
    ({"type": "tuple"}, "type"),
    ({"type": "array", "items": [{"type": "string"}, {"not": {}}]}, "items[1].not"),
    ({"type": "object", "$defs": {"d": {"uniqueItems": True}}}, "$defs.d.uniqueItems"),
    ({"type": ["string", "null"], "maxLength": 3}, "maxLength"),
    ({"anyOf": [{"type": "string"}], "minLength": 2}, "minLength"),
    ({"$ref": "#/$defs/a", "$defs": {"a": {}}, "enum": [1]}, "enum"),
    ({"type": "string", "pattern": "no-anchors"}, ""),  # the converter refuses the pattern
    # what makes llama.cpp's grammar walk explode (seconds to minutes a token)
    ({"type": "string", "pattern": "^(q?){1000}q{5}$"}, "pattern"),
    ({"type": "string", "pattern": "^(a+)*$"}, "pattern"),
    ({"type": "string", "pattern": "^((ab)?c)+$"}, "pattern"),
    ({"type": "string", "pattern": "^a{65}$"}, "pattern"),
    ({"type": "string", "pattern": "^" + "a" * 1000 + "$"}, "pattern"),
    ({"type": "string", "pattern": 5}, "pattern"),
    ({"type": "string", "pattern": r"^(a)\1$"}, "pattern"),  # llama.cpp refused its grammar
    # what no value satisfies, or the converter drops: the answer did not validate
    ({"type": "object", "required": ["x"]}, "required"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "b"]},
     "required"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": "a"}, "required"),
    ({"type": "array", "minItems": 5, "maxItems": 2}, "minItems"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength"),
    ({"type": "integer", "const": "abc"}, "const"),
    ({"type": "object", "properties": {"u": {"type": "string", "enum": ["c", 1]}}},
     "properties.u.enum"),
    ({"type": "boolean", "const": 1}, "const"),
    ({"enum": []}, "enum"),
    ({"anyOf": []}, "anyOf"),
    ({"type": []}, "type"),
])
def test_schema_parts_the_grammar_cannot_enforce_are_refused(schema: dict[str, Any],
                                                             where: str) -> None:
    with pytest.raises(EngineError) as e:
        grammar_for(Generate(1, "m", response_format=fmt(schema)))
    path = "response_format.json_schema.schema" + (f".{where}" if where else "")
    assert e.value.status == 400 and e.value.code == "unsupported_schema"
    assert str(e.value).startswith(f"{path}: ")
    err = WorkerError(e.value.code, 400, str(e.value))
    assert structured.param_of(err) == path  # what the API answers in `param`


@pytest.mark.parametrize("pattern", [r"^[0-9a-f]{32}$", r"^\d{3}-\d{4}$", r"^(ab|cd){3}$",
                                     r"^[(?]{3}$", r"^a{64}$", r"^\(a+\)*$", r"^\\1$",
                                     r"^a\0$"])
def test_patterns_without_nested_or_long_repetition_make_a_grammar(pattern: str) -> None:
    assert grammar_for(Generate(1, "m", response_format=fmt({"type": "string",
                                                              "pattern": pattern})))


def _deep(n: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(n):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize("schema", [
    {"type": {}}, {"type": [["string"]]}, {"type": "string", "format": ["date"]},
    {"type": "array", "items": 5}, {"anyOf": {"type": "string"}},
    {"type": "string", "pattern": 5}, _deep(1000)])
def test_schemas_the_converter_trips_over_are_a_400_not_a_crash(schema: dict[str, Any]) -> None:
    """Each of these raised TypeError/RecursionError in the worker, which closed the
    PoP's connection to it: every model call failed until the PoP restarted."""
    for req in (Generate(1, "m", response_format=fmt(schema)),
                Generate(1, "m", tools=[{"type": "function", "function": {
                    "name": "f", "parameters": schema}}], tool_choice="auto")):
        try:
            grammar_for(req)
        except EngineError as e:
            assert (e.code, e.status) == ("unsupported_schema", 400)


def test_a_tool_schema_refusal_names_the_tool() -> None:
    bad = {"type": "function", "function": {"name": "n", "parameters": {
        "type": "object", "properties": {"n": {"type": "number", "multipleOf": 2}}}}}
    with pytest.raises(EngineError, match=r"^tools\[1\]\.function\.parameters\.properties\.n"
                                          r"\.multipleOf: "):
        grammar_for(Generate(1, "m", tools=[WEATHER, bad], tool_choice="auto"))


def test_json_object_and_schema_become_the_root() -> None:
    assert rules(grammar_for(Generate(1, "m", response_format={"type": "json_object"})))[
        "root"] == "answer"
    r = rules(grammar_for(Generate(1, "m", response_format=fmt({
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}))))
    assert '"\\"n\\""' in r["answer-n-kv"]
    assert grammar_for(Generate(1, "m", response_format={"type": "text"})) is None
    assert grammar_for(Generate(1, "m")) is None


@pytest.mark.parametrize(("choice", "parallel", "root", "calls", "names"), [
    ("auto", True, "calls | text", 'call ("\\n" call)*', ["get_weather", "now"]),
    (None, True, "calls | text", 'call ("\\n" call)*', ["get_weather", "now"]),
    ("required", True, "calls", 'call ("\\n" call)*', ["get_weather", "now"]),
    ("required", False, "calls", "call", ["get_weather", "now"]),
    ({"type": "function", "function": {"name": "now"}}, True, "calls", "call", ["now"]),
])
def test_tool_choice_shapes_the_grammar(choice: Any, parallel: bool, root: str, calls: str,
                                        names: list[str]) -> None:
    r = rules(grammar_for(Generate(1, "m", tools=[WEATHER, NOW], tool_choice=choice,
                                   parallel_tool_calls=parallel)))
    assert r["root"] == root and r["calls"] == calls
    named = [n for n in ("get_weather", "now") if f'\\"name\\": \\"{n}\\"' in r["call"]]
    assert named == names


def test_tool_choice_none_and_auto_with_a_format() -> None:
    assert grammar_for(Generate(1, "m", tools=[WEATHER], tool_choice="none")) is None
    r = rules(grammar_for(Generate(1, "m", tools=[WEATHER], tool_choice="auto",
                                   response_format={"type": "json_object"})))
    assert r["root"] == "calls | answer" and "text" not in r


@pytest.mark.parametrize(("fields", "param"), [
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}},
     "response_format.json_schema.name"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": 3}}},
     "response_format.json_schema.schema"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [WEATHER, {"type": "function", "function": {"name": "bad name"}}]},
     "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
     "tools[0].function.parameters"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "now"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"), ({"logit_bias": {"\u00b2": 1}}, "logit_bias"),
    ({"logit_bias": {"12": 101}}, "logit_bias"),
])
def test_bad_fields_are_refused_naming_them(fields: dict[str, Any], param: str) -> None:
    from runtime.ai.openai_api import ChatBody

    body = ChatBody(model="m", messages=[{"role": "user", "content": "x"}], **fields)
    with pytest.raises(ApiError) as e:
        structured.params_of(body)
    assert e.value.status == 400 and e.value.param == param


def test_good_fields_become_generate_fields() -> None:
    from runtime.ai.openai_api import ChatBody, CompletionBody

    body = ChatBody(model="m", messages=[], tools=[WEATHER], logprobs=True, top_logprobs=3,
                    presence_penalty=0.5, logit_bias={"42": -100})
    assert structured.params_of(body) == {
        "tools": [WEATHER], "tool_choice": None, "parallel_tool_calls": True, "logprobs": 3,
        "presence_penalty": 0.5, "logit_bias": {42: -100.0}}
    assert structured.params_of(CompletionBody(model="m", prompt="p", logprobs=2)) == {
        "logprobs": 2}
    with pytest.raises(ApiError, match="between 0 and 5"):
        structured.params_of(CompletionBody(model="m", prompt="p", logprobs=6))
    assert structured.shaped(body) and not structured.shaped(ChatBody(model="m", messages=[]))
    # plain text asked for in so many words is no shaping (the AI cache bypassed them)
    assert not structured.shaped(ChatBody(model="m", messages=[],
                                          response_format={"type": "text"}, tool_choice="none"))
    assert structured.shaped(ChatBody(model="m", messages=[], tools=[WEATHER],
                                      tool_choice="none"))
    assert structured.shaped(ChatBody(model="m", messages=[],
                                      response_format={"type": "json_object"}))


def test_the_ai_binding_checks_the_same_fields() -> None:
    from edgefn_core.errors import BindingError
    from runtime.bindings.ai import _shaping

    with pytest.raises(BindingError, match=r"\(param tools\[0\]\.function\.name\)"):
        _shaping("chat", {"model": "m", "tools": [{"type": "function",
                                                   "function": {"name": "bad name"}}]})
    with pytest.raises(BindingError, match=r"ai\.chat_stream takes no tools"):
        _shaping("chat_stream", {"model": "m", "tools": [WEATHER]})
    assert _shaping("chat", {"model": "m", "tools": [WEATHER], "tool_choice": "required",
                             "response_format": {"type": "json_object"}}) == {
        "tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": True,
        "response_format": {"type": "json_object"}}
    with pytest.raises(BindingError, match=r"ai\.complete takes no response_format"):
        _shaping("complete", {"model": "m", "response_format": {"type": "json_object"}})


def _nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for i in range(levels - 1):
        schema = {"type": "object", "properties": {f"k{i}": schema}, "required": [f"k{i}"]}
    return schema


def _props(n: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}}


def _objects(n: int, props: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"o{i}": _props(props) for i in range(n)}}


def _enums(n: int, values: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"e{i}": {"enum": list(range(values))}
                                             for i in range(n)}}


def _unions(outer: int, inner: int, levels: int = 2) -> dict[str, Any]:
    """`levels` of anyOf with `outer` objects whose "k" holds the next level (through
    $defs), the last an anyOf of `inner` consts."""
    defs: dict[str, Any] = {f"d{levels - 1}": {"anyOf": [{"const": i} for i in range(inner)]}}
    for d in range(levels - 1):
        defs[f"d{d}"] = {"anyOf": [{"type": "object", "properties": {
            "k": {"$ref": f"#/$defs/d{d + 1}"}, f"z{i}": {"type": "null"}},
            "required": ["k", f"z{i}"]} for i in range(outer)]}
    return {"type": "object", "properties": {"v": {"$ref": "#/$defs/d0"}}, "required": ["v"],
            "$defs": defs}


def _recursive(branches: int) -> dict[str, Any]:
    """A node that is null or one of `branches` objects whose "k" is a node."""
    objects = [{"type": "object", "properties": {"k": {"$ref": "#/$defs/n"}, f"z{i}": {
        "type": "null"}}, "required": ["k", f"z{i}"]} for i in range(branches)]
    return {"type": "object", "properties": {"v": {"$ref": "#/$defs/n"}}, "required": ["v"],
            "$defs": {"n": {"anyOf": [*objects, {"type": "null"}]}}}


def _fanout(levels: int, recursive: bool = False) -> dict[str, Any]:
    """2**`levels` strings: each level an object of two properties holding the next;
    `recursive`: the last one may hold the first again (a recursive $ref is expanded
    at each use, not once: the walk takes 2**`levels` steps)."""
    last: dict[str, Any] = {"type": "string"}
    if recursive:
        last = {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/d0"}]}
    defs: dict[str, Any] = {f"d{levels}": last}
    for d in range(levels):
        defs[f"d{d}"] = {"type": "object", "properties": {
            k: {"$ref": f"#/$defs/d{d + 1}"} for k in "ab"}, "required": ["a", "b"]}
    return {"$defs": defs, **defs["d0"]}


# (a schema just inside a limit, one just past it, the refused part (None: the schema,
# "": response_format), its message)
LIMITS = [
    (_nested(32), _nested(33), ".".join(f"properties.k{i}" for i in range(31, -1, -1)),
     "schemas nested more than 32 deep"),
    (_props(100), _props(101), "properties", "an object of 101 properties (at most 100)"),
    (_objects(5, 99), _objects(5, 100), "properties.o4.properties",
     "505 properties in the request's schemas (at most 500 together)"),
    ({"enum": list(range(500))}, {"enum": list(range(501))}, "enum",
     "enum of 501 (at most 500)"),
    ({"anyOf": [{"const": i} for i in range(100)]}, {"anyOf": [{"const": i} for i in range(101)]},
     "anyOf", "anyOf of 101 (at most 100)"),
    (_enums(2, 500), _enums(3, 334), "properties.e2.enum",
     "1002 enum values, anyOf branches and tools in the request (at most 1000 together)"),
    ({"type": "array", "maxItems": 1000}, {"type": "array", "maxItems": 1001}, "maxItems",
     "maxItems of 1001 (0 to 1000)"),
    ({"type": "array", "minItems": 1000}, {"type": "array", "minItems": 1001}, "minItems",
     "minItems of 1001 (0 to 1000)"),
    ({"type": "string", "maxLength": 1000}, {"type": "string", "maxLength": 1001}, "maxLength",
     "maxLength of 1001 (0 to 1000)"),
    ({"type": "string", "minLength": 1000}, {"type": "string", "minLength": 1001}, "minLength",
     "minLength of 1001 (0 to 1000)"),
    (_unions(10, 10), _unions(11, 10), None, "up to 110 anyOf alternatives open at once"),
    (_recursive(1), _recursive(2), "properties.v.anyOf", "branches recursing through #/$defs/n"),
    (_fanout(12, True), _fanout(13, True), None, "a schema of over 20000 parts"),
    ({"const": "x" * 250_000}, {"const": "x" * 270_000}, "",
     "the schema makes a grammar of 270"),
]


@pytest.mark.parametrize(("inside", "past", "where", "message"), LIMITS)
def test_schemas_past_a_size_limit_are_refused_naming_it(inside: dict[str, Any],
                                                         past: dict[str, Any],
                                                         where: str | None,
                                                         message: str) -> None:
    assert grammar_for(Generate(1, "m", response_format=fmt(inside)))
    with pytest.raises(EngineError) as e:
        grammar_for(Generate(1, "m", response_format=fmt(past)))
    path = "response_format" if where == "" else "response_format.json_schema.schema" + (
        f".{where}" if where else "")
    assert (e.value.code, e.value.status) == ("unsupported_schema", 400)
    assert str(e.value).startswith(f"{path}: {message}"), str(e.value)


def test_the_totals_count_the_tools_and_the_format_together() -> None:
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": _props(100)}}
             for i in range(4)]
    req = Generate(1, "m", tools=tools, tool_choice="auto", response_format=fmt(_props(100)))
    assert grammar_for(req)
    more = [*tools, {"type": "function", "function": {"name": "g", "parameters": _props(1)}}]
    with pytest.raises(EngineError, match=r"^tools\[4\]\.function\.parameters\.properties: "
                                          r"501 properties"):
        grammar_for(Generate(1, "m", tools=more, tool_choice="auto",
                             response_format=fmt(_props(100))))
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {
        "enum": list(range(7))}}} for i in range(125)]
    assert grammar_for(Generate(1, "m", tools=tools, tool_choice="auto"))  # 125 + 875
    with pytest.raises(EngineError, match=r"^tools\[124\]\.function\.parameters\.enum: 1001 "
                                          r"enum values, anyOf branches and tools"):
        grammar_for(Generate(1, "m", tools=tools, tool_choice="auto",
                             response_format=fmt({"enum": [1]})))


def test_at_most_128_tools() -> None:
    tools = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]
    assert grammar_for(Generate(1, "m", tools=tools[:128], tool_choice="auto"))
    with pytest.raises(EngineError, match=r"^tools: 129 tools \(at most 128\)$"):
        grammar_for(Generate(1, "m", tools=tools, tool_choice="auto"))


def test_a_list_of_types_counts_as_that_many_alternatives() -> None:
    """``"type": [7 types]`` is a union of 7: 100 of them in an anyOf held ~700
    alternatives open past the limit of 100 (helper 110's review)."""
    seven = {"type": ["string", "number", "integer", "boolean", "null", "object", "array"]}
    assert grammar_for(Generate(1, "m", response_format=fmt({"anyOf": [seven] * 14})))
    with pytest.raises(EngineError, match="alternatives open at once"):
        grammar_for(Generate(1, "m", response_format=fmt({"anyOf": [seven] * 15})))


def test_a_definition_reused_at_every_level_is_walked_once() -> None:
    """Each level's definition used twice by the one above: 2**40 uses, 41 rules in
    the grammar (the converter writes a $ref once); refused for its size before."""
    assert grammar_for(Generate(1, "m", response_format=fmt(_fanout(40))))
