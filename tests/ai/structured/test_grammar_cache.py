"""`Grammars`: a schema set is built into a grammar and checked once, then served
from the cache (refusals too); the key covers every field the grammar depends on."""

from __future__ import annotations

from typing import Any

import pytest

from edgefn_core.errors import EngineError
from gpu_worker.engines import grammar_cache
from gpu_worker.engines.constrain import grammar_for
from gpu_worker.engines.grammar_cache import Grammars
from gpu_worker.protocol import Generate

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def fmt(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


class Counted:
    """The real `grammar_for` and a check that records what it was asked."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.built = 0
        self.checked: list[str] = []

        def build(req: Generate) -> str | None:
            self.built += 1
            return grammar_for(req)
        monkeypatch.setattr(grammar_cache, "grammar_for", build)

    def check(self, grammar: str) -> None:
        self.checked.append(grammar)


def test_the_same_schema_is_built_and_checked_once(monkeypatch: pytest.MonkeyPatch) -> None:
    counted = Counted(monkeypatch)
    grammars = Grammars(counted.check)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    first = grammars.for_request(Generate(1, "m", response_format=fmt(schema)))
    again = grammars.for_request(Generate(2, "m", response_format=fmt(dict(schema))))
    assert first is not None and again == first == grammar_for(
        Generate(3, "m", response_format=fmt(schema)))
    assert (counted.built, counted.checked) == (1, [first])


def test_free_text_has_no_grammar_to_check(monkeypatch: pytest.MonkeyPatch) -> None:
    counted = Counted(monkeypatch)
    grammars = Grammars(counted.check)
    assert grammars.for_request(Generate(1, "m")) is None
    assert (counted.built, counted.checked) == (1, [])


def test_a_refusal_is_kept_and_raised_again(monkeypatch: pytest.MonkeyPatch) -> None:
    counted = Counted(monkeypatch)
    grammars = Grammars(counted.check)
    req = Generate(1, "m", response_format=fmt({"type": "string", "maxItems": 5000}))
    errors = []
    for _ in range(2):
        with pytest.raises(EngineError) as e:
            grammars.for_request(req)
        errors.append((e.value.code, e.value.status, str(e.value)))
    assert errors[0] == errors[1] and errors[0][:2] == ("unsupported_schema", 400)
    assert (counted.built, counted.checked) == (1, [])


def test_a_grammar_llama_cpp_refuses_is_refused_again_without_parsing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[str] = []

    def refuse(grammar: str) -> None:
        parsed.append(grammar)
        raise EngineError("unsupported_schema", 400, "llama.cpp cannot parse it")
    grammars = Grammars(refuse)
    req = Generate(1, "m", response_format={"type": "json_object"})
    for _ in range(2):
        with pytest.raises(EngineError, match="cannot parse"):
            grammars.for_request(req)
    assert len(parsed) == 1


@pytest.mark.parametrize("other", [
    {"tool_choice": "required"},
    {"tool_choice": "none"},
    {"parallel_tool_calls": False},
    {"tools": [WEATHER, {**WEATHER, "function": {**WEATHER["function"], "name": "w2"}}]},
    {"response_format": {"type": "json_object"}},
])
def test_each_field_the_grammar_reads_is_in_the_key(other: dict[str, Any],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    counted = Counted(monkeypatch)
    grammars = Grammars(counted.check)
    base: dict[str, Any] = {"tools": [WEATHER], "tool_choice": "auto"}
    first = grammars.for_request(Generate(1, "m", **base))
    second = grammars.for_request(Generate(2, "m", **{**base, **other}))
    assert counted.built == 2
    assert second == grammar_for(Generate(3, "m", **{**base, **other})) != first


def test_the_least_recently_used_is_dropped_past_its_size(
        monkeypatch: pytest.MonkeyPatch) -> None:
    counted = Counted(monkeypatch)
    grammars = Grammars(counted.check, size=2)
    reqs = [Generate(i, "m", response_format=fmt({"type": "string", "maxLength": i}))
            for i in (1, 2, 3)]
    for req in (reqs[0], reqs[1], reqs[0], reqs[2]):  # 1 is used again: 2 goes
        grammars.for_request(req)
    assert counted.built == 3
    grammars.for_request(reqs[0])
    assert counted.built == 3
    grammars.for_request(reqs[1])
    assert counted.built == 4
