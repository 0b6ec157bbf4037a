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
from typing import Any

from llama_cpp.llama_grammar import RESERVED_NAMES, SchemaConverter

_END = ""  # a trie node's key marking that a text ends there (no character is "")
Trie = dict[str, "Trie"]


class TrieConverter(SchemaConverter):
    """`SchemaConverter` whose enums become tries (the grammar allows the same texts)."""

    def visit(self, schema: dict[str, Any], name: str) -> str:
        if not _plain_enum(schema):
            return str(super().visit(schema, name))
        rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
        texts = [json.dumps(value) for value in schema["enum"]]
        return str(self._add_rule(rule_name, trie_rule(texts, self._format_literal)))


def _plain_enum(schema: dict[str, Any]) -> bool:
    """Whether the converter would write `schema` as its enum (the keywords it
    follows first are absent)."""
    return (isinstance(schema.get("enum"), list) and bool(schema["enum"])
            and not any(k in schema for k in ("$ref", "oneOf", "anyOf", "const"))
            and not isinstance(schema.get("type"), list))


def trie_rule(texts: list[str], literal: Any) -> str:
    """A GBNF rule body matching exactly the non-empty `texts`; `literal(s)` writes
    the GBNF literal for `s`."""
    root: Trie = {}
    for text in texts:
        node = root
        for c in text:
            node = node.setdefault(c, {})
        node[_END] = {}
    return _branches(root, literal)


def _branches(node: Trie, literal: Any) -> str:
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
