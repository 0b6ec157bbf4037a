"""llama-cpp-python's JSON Schema converter with ``enum`` written as a trie.

The converter writes an enum as one alternative a value (``"\\"a1\\"" | "\\"a2\\""
| ...``). llama.cpp keeps a parse stack for each alternative open at once and
matches the whole vocabulary against every stack at each step, so an enum of 500
values cost 5-17x a plain decode step and 5000 values 68-139x (helper 108's red
team). Written as a trie of the values' JSON texts (``"\\"a" ("1" | "2") "\\""``)
the same strings are allowed with as many stacks open as one character position
has choices.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from llama_cpp.llama_grammar import RESERVED_NAMES, BuiltinRule, SchemaConverter

_END = ""  # a trie node's key marking that a text ends there (no unit is "")
# a JSON text's units: a whole escape or one character. Parted inside an escape, a
# literal ended on a lone backslash or held a \u without its digits, which llama.cpp
# cannot parse (every enum of two CJK or accented values)
_UNIT = re.compile(r"\\u[0-9a-fA-F]{4}|\\.|.", re.DOTALL)
Trie = dict[str, "Trie"]


# A JSON string's character as llama.cpp's own converter writes it: no raw control
# character (U+0000-U+001F, and DEL), which JSON does not allow unescaped
# (RFC 8259 7). llama-cpp-python's rule, ``[^"\\]``, let the model write a raw
# newline inside a string: json_object answers `json.loads` refused ("Invalid
# control character"), and the openai client's `parse()` a ValidationError.
JSON_CHAR = BuiltinRule(r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] '
                        r'[0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])', [])


class TrieConverter(SchemaConverter):
    """`SchemaConverter` whose enums become tries (the grammar allows the same texts),
    whose literals escape a backslash (`gbnf_literal`), and whose strings hold no
    raw control character (`JSON_CHAR`)."""

    def _add_primitive(self, name: str, rule: BuiltinRule) -> str:
        return str(super()._add_primitive(name, JSON_CHAR if name == "char" else rule))

    def visit(self, schema: dict[str, Any], name: str) -> str:
        if not _plain_enum(schema):
            return str(super().visit(schema, name))
        rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
        texts = [json.dumps(value) for value in schema["enum"]]
        return str(self._add_rule(rule_name, trie_rule(texts, gbnf_literal)))

    def _format_literal(self, literal: str) -> str:
        return gbnf_literal(literal)


_GBNF_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r"}


def gbnf_literal(text: str) -> str:
    """The GBNF literal matching the JSON text `text` (as ``json.dumps`` writes it).

    llama-cpp-python's converter escapes only quotes and line ends, so a value
    holding a quote or a backslash (``"x\\"1"``) made a grammar llama.cpp cannot
    parse, and ``\\n`` matched a raw line end (JSON that does not parse). Here a
    backslash is escaped too, except that a ``\\uXXXX`` of a printable character
    is left for llama.cpp to read as that character (so the model writes
    ``"東京"``, as the converter let it), a surrogate pair as one ``\\U`` escape.
    """
    units = _UNIT.findall(text)
    out = []
    i = 0
    while i < len(units):
        unit = units[i]
        code = int(unit[2:], 16) if len(unit) == 6 and unit.startswith("\\u") else -1
        low = (int(units[i + 1][2:], 16) if i + 1 < len(units) and len(units[i + 1]) == 6
               and units[i + 1].startswith("\\u") else -1)
        if 0xD800 <= code <= 0xDBFF and 0xDC00 <= low <= 0xDFFF:
            out.append(f"\\U{0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00):08X}")
            i += 2
            continue
        if code >= 0x20 and not 0xD800 <= code <= 0xDFFF:
            out.append(unit)
        else:
            out.append("".join(_GBNF_ESCAPES.get(c, c) for c in unit))
        i += 1
    return '"' + "".join(out) + '"'


def _plain_enum(schema: dict[str, Any]) -> bool:
    """Whether the converter would write `schema` as its enum (the keywords it
    follows first are absent)."""
    return (isinstance(schema.get("enum"), list) and bool(schema["enum"])
            and not any(k in schema for k in ("$ref", "oneOf", "anyOf", "const"))
            and not isinstance(schema.get("type"), list))


def trie_rule(texts: list[str], literal: Callable[[str], str]) -> str:
    """A GBNF rule body matching exactly the non-empty `texts`, parted only between
    `_UNIT`s; `literal(s)` writes the GBNF literal for `s`."""
    root: Trie = {}
    for text in texts:
        node = root
        for unit in _UNIT.findall(text):
            node = node.setdefault(unit, {})
        node[_END] = {}
    return _branches(root, literal)


def _branches(node: Trie, literal: Callable[[str], str]) -> str:
    """The alternatives after `node`: each child with its run of single-child nodes
    as one literal, then what follows it (optional where a text ends)."""
    alts = []
    for c, child in node.items():
        if c == _END:
            continue
        run = c
        while len(child) == 1 and _END not in child:
            ((c, child),) = child.items()
            run += c
        if set(child) == {_END}:
            alts.append(literal(run))
        else:
            optional = "?" if _END in child else ""
            alts.append(f"{literal(run)} ({_branches(child, literal)}){optional}")
    return " | ".join(alts)
