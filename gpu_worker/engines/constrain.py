"""Grammars for constrained decoding: OpenAI's ``response_format`` and ``tools``
turned into one llama.cpp GBNF grammar, so that what the model writes always
parses (and validates against the schema it was given).

- ``{"type": "json_object"}``: any JSON object.
- ``{"type": "json_schema", "json_schema": {"schema": ...}}``: llama-cpp-python's
  JSON Schema converter (`llama_cpp.llama_grammar.SchemaConverter`; enums written as
  tries, `literal_trie`), within `schema_limits`. It enforces
  only part of JSON Schema; `check_schema` refuses every keyword outside that
  part (a 400 naming it) rather than produce output that may not validate.
- tools: each call is written as ``TOOL_CALL_OPEN{"name": "<name>", "arguments":
  <args>}TOOL_CALL_CLOSE`` (`gpu_worker.protocol`), with ``<args>`` held to that
  function's ``parameters`` schema. ``tool_choice`` ``auto`` also allows a plain
  answer (any text not starting with ``<``, or the ``response_format`` JSON),
  ``required`` only calls, a named function only that one; with
  ``parallel_tool_calls`` false, exactly one call.
"""

from __future__ import annotations

import json
from typing import Any

from llama_cpp.llama_grammar import STRING_FORMAT_RULES, SchemaConverter

from edgefn_core.errors import EngineError

from ..protocol import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, Generate
from .literal_trie import TrieConverter
from .schema_limits import (
    Budget,
    check_grammar_size,
    check_size,
    check_tools,
    check_width,
    subschemas,
)

ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id",
                         "$comment", "deprecated", "readOnly", "writeOnly", "strict"})
ENFORCED = frozenset({"type", "properties", "required", "additionalProperties", "items",
                      "prefixItems", "minItems", "maxItems", "enum", "const", "anyOf", "$ref",
                      "$defs", "definitions", "pattern", "format", "minLength", "maxLength"})
FORMATS = frozenset(name.removesuffix("-string") for name in STRING_FORMAT_RULES) | {
    "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"}
# the converter follows these and ignores the other keywords beside them
EXCLUSIVE = ("$ref", "anyOf")
BESIDE_EXCLUSIVE = ANNOTATIONS | {"$defs", "definitions", "type"}
TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
# a plain answer next to tool calls: anything that does not open a call
FREE_TEXT = 'text ::= [^<] [^\\x00]*'


def check_schema(schema: Any, where: str) -> None:
    """Raises `EngineError` (400, code ``unsupported_schema``) naming the first part
    of `schema` (at JSON path `where`) the grammar cannot enforce."""
    if not isinstance(schema, dict):
        raise _unsupported(where, f"a schema must be an object, got {type(schema).__name__}")
    for key, value in schema.items():
        if key not in ENFORCED and key not in ANNOTATIONS:
            raise _unsupported(f"{where}.{key}", f"JSON Schema keyword {key!r} is not supported "
                               "by constrained decoding; supported: " + ", ".join(sorted(ENFORCED)))
        _check_keyword(schema, key, value, where)
    for key, sub in _children(schema, where):
        check_schema(sub, key)


# A `pattern` becomes grammar rules that llama.cpp walks for every token of the
# vocabulary at every step, on the one scheduler thread. An ambiguous repetition
# multiplies its parse stacks: `^(q?){200}q{80}$` cost ~5 s a token, `{1000}` over
# 4 minutes (every request on the model waited; helper 104's red team). Refused:
# a quantified group holding a quantifier, and counts past MAX_PATTERN_REPEAT.
MAX_PATTERN_REPEAT = 64
MAX_PATTERN_CHARS = 1000
_QUANTIFIERS = frozenset("?*+{")


def _check_pattern(pattern: Any, where: str) -> None:
    """Raises `EngineError` (400) for a `pattern` that is not a string, longer than
    MAX_PATTERN_CHARS, with a count over MAX_PATTERN_REPEAT, or with a quantifier
    on a group that holds one (``(a+)*``, ``(q?){20}``)."""
    if not isinstance(pattern, str):
        raise _unsupported(where, "a pattern must be a string")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise _unsupported(where, f"a pattern of {len(pattern)} characters (at most "
                           f"{MAX_PATTERN_CHARS})")
    groups: list[bool] = []  # per open group: whether it holds a quantifier
    i, n, quantified = 0, len(pattern), False  # quantified: the atom just closed held one
    while i < n:
        c = pattern[i]
        if c == "\\":
            if pattern[i + 1:i + 2] in tuple("123456789"):
                raise _unsupported(where, "a backreference (\\1 ...): a grammar cannot "
                                   "hold one")
            i += 2
            quantified = False
            continue
        if c == "[":  # a class: its characters are literal
            i = _class_end(pattern, i)
            quantified = False
            continue
        if c in _QUANTIFIERS:
            if quantified:
                raise _unsupported(where, "a quantifier on a group that holds one (nested "
                                   "repetition is ambiguous: its grammar explodes)")
            if c == "{":
                i = _count(pattern, i, where)
            if groups:
                groups[-1] = True
            quantified = False
            i += 1
            continue
        if c == "(":
            groups.append(False)
        elif c == ")" and groups:
            quantified = groups.pop()
            if quantified and groups:
                groups[-1] = True
            i += 1
            continue
        quantified = False
        i += 1


def _class_end(pattern: str, i: int) -> int:
    """The index after the character class opening at `i`."""
    j = i + 1
    if j < len(pattern) and pattern[j] == "^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":  # a leading ] is literal
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 2 if pattern[j] == "\\" else 1
    return j + 1


def _count(pattern: str, i: int, where: str) -> int:
    """The index of the closing brace of the count opening at `i`. Raises
    `EngineError` for a bound over MAX_PATTERN_REPEAT."""
    end = pattern.find("}", i)
    if end < 0:
        return i
    for bound in pattern[i + 1:end].split(","):
        if bound.strip().isdigit() and int(bound) > MAX_PATTERN_REPEAT:
            raise _unsupported(where, f"a repetition count of {int(bound)} (at most "
                               f"{MAX_PATTERN_REPEAT})")
    return end


def _check_keyword(schema: dict[str, Any], key: str, value: Any, where: str) -> None:
    """Raises `EngineError` for a keyword the converter would take but not enforce."""
    types = value if isinstance(value, list) else [value]
    if key == "type" and not all(t in TYPES for t in types):
        raise _unsupported(f"{where}.type", f"unknown type {value!r}")
    ignored = sorted(set(schema) - (BESIDE_EXCLUSIVE if key in EXCLUSIVE else ANNOTATIONS)
                     - {key})
    if (key in EXCLUSIVE or (key == "type" and isinstance(value, list))) and ignored:
        raise _unsupported(f"{where}.{ignored[0]}", f"{ignored[0]} beside {key} (a list of "
                           "types, $ref and anyOf take no other constraints; use anyOf)")
    if key == "format" and value not in FORMATS:
        raise _unsupported(f"{where}.format", f"format {value!r} is not supported; "
                           "supported: " + ", ".join(sorted(FORMATS)))
    if key == "pattern":
        _check_pattern(value, f"{where}.pattern")
    if key in ("minLength", "maxLength") and ("pattern" in schema or "format" in schema):
        raise _unsupported(f"{where}.{key}", f"{key} together with pattern or format")
    if key == "$ref" and not (isinstance(value, str) and value.startswith("#/")):
        raise _unsupported(f"{where}.$ref", "only local references (#/...) are supported")
    _check_satisfiable(schema, key, value, where)


# JSON types of a `const` or `enum` value, as `type` names them
_JSON_TYPES: tuple[tuple[type | tuple[type, ...], tuple[str, ...]], ...] = (
    (bool, ("boolean",)), (int, ("integer", "number")), (float, ("number",)),
    (str, ("string",)), (type(None), ("null",)), (list, ("array",)), (dict, ("object",)))


def _json_types(value: Any) -> tuple[str, ...]:
    for kind, names in _JSON_TYPES:
        if isinstance(value, kind):
            return names
    return ()


def _check_satisfiable(schema: dict[str, Any], key: str, value: Any, where: str) -> None:
    """Raises `EngineError` for a keyword the grammar would not hold the answer to:
    one no value satisfies (the converter wrote a grammar for part of it, and the
    answer did not validate), or a `required` property `properties` does not define
    (the converter drops it)."""
    at = f"{where}.{key}"
    if key in ("enum", "anyOf", "type") and isinstance(value, list) and not value:
        raise _unsupported(at, f"an empty {key}: no value satisfies it")
    if key in ("minItems", "minLength"):
        top = schema.get(key.replace("min", "max"))
        if isinstance(value, int) and isinstance(top, int) and value > top:
            raise _unsupported(at, f"{key} {value} is more than {key.replace('min', 'max')} "
                               f"{top}: no value satisfies it")
    if key == "required":
        defined = schema.get("properties") or {}
        missing = [n for n in value if n not in defined] if isinstance(value, list) else None
        if missing is None or not all(isinstance(n, str) for n in value):
            raise _unsupported(at, "required must be a list of property names")
        if missing:
            raise _unsupported(at, f"required names {missing[0]!r}, which properties does not "
                               "define (only properties it defines can be required)")
    if key in ("const", "enum") and isinstance(schema.get("type"), str):
        for v in value if key == "enum" and isinstance(value, list) else [value]:
            if schema["type"] not in _json_types(v):
                raise _unsupported(at, f"{key} value {v!r} is not of type {schema['type']!r}: "
                                   "no value satisfies both")


def _children(schema: dict[str, Any], where: str) -> list[tuple[str, Any]]:
    """The subschemas of `schema`, each with its JSON path. Raises `EngineError` for
    a ``properties`` or ``$defs`` that is not an object."""
    for key in ("properties", "$defs", "definitions"):
        _mapping(schema, key, where)
    return subschemas(schema, where)


def _mapping(schema: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = schema.get(key, {})
    if not isinstance(value, dict):
        raise _unsupported(f"{where}.{key}", f"{key} must be an object")
    return value


def _unsupported(where: str, why: str) -> EngineError:
    return EngineError("unsupported_schema", 400, f"{where}: {why}")


def grammar_for(req: Generate) -> str | None:
    """The GBNF grammar that `req`'s ``response_format`` and tools ask for, or None
    for free text. Raises `EngineError` (400) for a schema the grammar cannot
    enforce or one past a size limit (`schema_limits`), also one the converter trips
    over (a value of the wrong type where it expects a schema, nesting past Python's
    recursion limit)."""
    try:
        return _grammar_for(req)
    except EngineError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RecursionError) as e:
        where = "tools" if req.tools and req.tool_choice != "none" else "response_format"
        raise EngineError("unsupported_schema", 400, f"{where}: the schema cannot be turned "
                          f"into a grammar ({type(e).__name__}: {str(e)[:200]})") from None


def _grammar_for(req: Generate) -> str | None:
    conv = TrieConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    budget = Budget()  # the size limits hold for response_format and the tools together
    answer = _answer_rule(conv, req.response_format, budget)
    tools = req.tools if req.tools and req.tool_choice != "none" else []
    if not tools:
        return None if answer is None else _grammar(conv, answer, "response_format")
    calls = _calls_rule(conv, tools, req.tool_choice, req.parallel_tool_calls, budget)
    if req.tool_choice in (None, "auto"):
        if answer is None:
            conv._rules["text"] = FREE_TEXT.split(" ::= ", 1)[1]
            answer = "text"
        return _grammar(conv, f"{calls} | {answer}", "tools")
    return _grammar(conv, calls, "tools")


def _answer_rule(conv: SchemaConverter, fmt: dict[str, Any] | None, budget: Budget
                 ) -> str | None:
    """The rule a plain answer follows (None: free text). Raises `EngineError`."""
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return _visit(conv, {"type": "object"}, "answer", "response_format")
    schema = (fmt.get("json_schema") or {}).get("schema", {"type": "object"})
    check_size(schema, "response_format.json_schema.schema", budget)
    check_schema(schema, "response_format.json_schema.schema")
    check_width(schema, "response_format.json_schema.schema")
    return _visit(conv, schema, "answer", "response_format.json_schema.schema")


def _calls_rule(conv: SchemaConverter, tools: list[dict[str, Any]], choice: Any,
                parallel: bool, budget: Budget) -> str:
    """The rule for the tool calls `choice` allows. Raises `EngineError`."""
    check_tools(tools)
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    alts = []
    for i, tool in enumerate(tools):
        fn = tool["function"]
        if named is not None and fn["name"] != named:
            continue
        where = f"tools[{i}].function.parameters"
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        budget.spend(f"tools[{i}]", choices=1)  # each tool is one alternative of a call
        check_size(params, where, budget)
        check_schema(params, where)
        check_width(params, where)
        args = _visit(conv, params, f"args-{i}", where)
        head = f'{TOOL_CALL_OPEN}{{"name": "{fn["name"]}", "arguments": '
        alts.append(f'{conv._format_literal(head)} {args} '
                    f'{conv._format_literal("}" + TOOL_CALL_CLOSE)}')
    conv._rules["call"] = " | ".join(alts)
    # a named choice forces exactly one call of that function (OpenAI's "forced function"):
    # with parallel calls allowed it could repeat it
    conv._rules["calls"] = 'call ("\\n" call)*' if parallel and named is None else "call"
    return "calls"


def _visit(conv: SchemaConverter, schema: dict[str, Any], name: str, where: str) -> str:
    """The converter's rule for `schema`. Raises `EngineError` where it fails."""
    try:
        resolved = conv.resolve_refs(json.loads(json.dumps(schema)), name)
        return str(conv.visit(resolved, name))
    except (ValueError, AssertionError, KeyError, TypeError, RecursionError) as e:
        raise _unsupported(where, f"cannot be turned into a grammar ({e})") from None


def _grammar(conv: SchemaConverter, root: str, where: str) -> str:
    """The grammar text. Raises `EngineError` if it is too long (`where` names the
    field it came from)."""
    conv._rules["root"] = root
    return check_grammar_size(str(conv.format_grammar()), where)
