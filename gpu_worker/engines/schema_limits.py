"""Size limits on the schemas a grammar is built from (`constrain`).

llama.cpp matches every vocabulary token against each of the grammar's parse
stacks at every decode step, on the model's one scheduler thread, and the
converter runs on the worker's event loop. Measured with the 135M model
(helper 108's red team, per-token cost with the grammar applied to the whole
vocabulary vs a plain decode step, same run):

- each alternative open at once is a stack: ``enum`` of 500 values 5-10x a
  token, 5000 values 68-139x (5-10 s a token), 20000 past the 60 s step
  watchdog; ``anyOf`` of 100 objects 3x, 1000 objects 19-32x;
- an object's optional properties cost the converter ~n^2.3: 100 of them
  0.14 s, 300 1.8 s, 900 15 s (the worker's loop held throughout);
- an anyOf inside the branches of another multiplies: 4 levels of 10 branches
  reached through ``$ref`` (40 in all) cost 30 s a token once the model wrote
  ``{"k": {"k": {"k": {"k": ``, and a recursive ``$ref`` under two branches of
  an anyOf doubles the stacks at each level the model nests;
- each tool is an alternative too: 128 tools 4-6x a token, 1000 past 300 s for
  a few steps;
- ``maxItems``/``maxLength`` past ~1100 is refused by llama.cpp's parser with
  no reason given; up to 1000 costs 1.2-1.7x a token.

The limits follow OpenAI's structured outputs where they fit (100 properties an
object, 500 values an enum); the per-request totals cover ``response_format``
and every tool together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgefn_core.errors import EngineError

MAX_DEPTH = 32  # nested schemas (OpenAI: 10); the grammar text grows as its square
MAX_PROPERTIES = 100  # in one object (OpenAI's figure)
MAX_TOTAL_PROPERTIES = 500  # in the request's schemas together
MAX_ENUM = 500  # values of one enum (OpenAI's figure)
MAX_ANY_OF = 100  # branches of one anyOf; also alternatives open at once (`check_width`)
MAX_WIDTH_VISITS = 20_000  # schema nodes `check_width` walks, $refs expanded
MAX_TOTAL_CHOICES = 1000  # enum values, anyOf branches and tools together (OpenAI: 1000)
MAX_TOOLS = 128  # OpenAI's figure: each is an alternative of a call (128: 4-6x a token)
MAX_COUNT = 1000  # minItems, maxItems, minLength, maxLength
MAX_GRAMMAR_CHARS = 256 * 1024
COUNTS = ("minItems", "maxItems", "minLength", "maxLength")
_NESTED = ("properties", "$defs", "definitions")


@dataclass
class Budget:
    """What one request's schemas have used of the per-request totals."""

    properties: int = 0
    choices: int = 0

    def spend(self, where: str, properties: int = 0, choices: int = 0) -> None:
        """Raises `EngineError` (400) once a total passes its limit."""
        self.properties += properties
        self.choices += choices
        if self.properties > MAX_TOTAL_PROPERTIES:
            raise too_big(where, f"{self.properties} properties in the request's schemas "
                          f"(at most {MAX_TOTAL_PROPERTIES} together)")
        if self.choices > MAX_TOTAL_CHOICES:
            raise too_big(where, f"{self.choices} enum values, anyOf branches and tools in the "
                          f"request (at most {MAX_TOTAL_CHOICES} together)")


def check_size(schema: Any, where: str, budget: Budget, depth: int = 1) -> None:
    """Raises `EngineError` (400, ``unsupported_schema``) naming the first part of
    `schema` (at JSON path `where`) past a limit; spends `budget`."""
    if not isinstance(schema, dict):
        return  # `constrain.check_schema` refuses it
    if depth > MAX_DEPTH:
        raise too_big(where, f"schemas nested more than {MAX_DEPTH} deep")
    _check_counts(schema, where)
    props = schema.get("properties")
    if isinstance(props, dict):
        if len(props) > MAX_PROPERTIES:
            raise too_big(f"{where}.properties", f"an object of {len(props)} properties "
                          f"(at most {MAX_PROPERTIES})")
        budget.spend(f"{where}.properties", properties=len(props))
    for key, most in (("enum", MAX_ENUM), ("anyOf", MAX_ANY_OF)):
        if isinstance(schema.get(key), list):
            if len(schema[key]) > most:
                raise too_big(f"{where}.{key}", f"{key} of {len(schema[key])} (at most {most})")
            budget.spend(f"{where}.{key}", choices=len(schema[key]))
    for path, sub in subschemas(schema, where):
        check_size(sub, path, budget, depth + 1)


def _check_counts(schema: dict[str, Any], where: str) -> None:
    for key in COUNTS:
        value = schema.get(key)
        if isinstance(value, int) and not 0 <= value <= MAX_COUNT:
            raise too_big(f"{where}.{key}", f"{key} of {value} (0 to {MAX_COUNT})")


def subschemas(schema: dict[str, Any], where: str) -> list[tuple[str, Any]]:
    """The subschemas of `schema` (mappings that are not objects are skipped), each
    with its JSON path."""
    out: list[tuple[str, Any]] = []
    for key in _NESTED:
        if isinstance(schema.get(key), dict):
            out += [(f"{where}.{key}.{k}", v) for k, v in schema[key].items()]
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            out.append((f"{where}.{key}", schema[key]))
    for key in ("prefixItems", "anyOf", "items"):
        if isinstance(schema.get(key), list):
            out += [(f"{where}.{key}[{i}]", v) for i, v in enumerate(schema[key])]
    return out


def check_width(schema: Any, where: str) -> None:
    """Raises `EngineError` (400) if more than MAX_ANY_OF alternatives of `schema`
    (anyOf branches and lists of types inside anyOf branches, $refs followed) may be
    open at once, or two branches of one anyOf recurse through the same $ref."""
    width, _ = _Widths(schema, where).of(schema, where, ())
    if width > MAX_ANY_OF:
        raise too_big(where, f"up to {width} anyOf alternatives open at once (anyOf inside "
                      f"anyOf, also through $ref; at most {MAX_ANY_OF})")


@dataclass
class _Widths:
    """One walk of `root` (at JSON path `where`) for `check_width`."""

    root: Any
    where: str
    visits: int = 0
    # a $ref whose schema reaches no $ref being expanded has one width wherever it is
    # used: walked once (a definition used twice at every level was walked 2**levels times)
    done: dict[str, int] = field(default_factory=dict)

    def of(self, node: Any, path: str, active: tuple[str, ...]) -> tuple[int, set[str]]:
        """(alternatives `node` may hold open at once, the $refs on `active` it reaches)."""
        self.visits += 1
        if self.visits > MAX_WIDTH_VISITS:
            raise too_big(self.where, f"a schema of over {MAX_WIDTH_VISITS} parts with its "
                          "$refs expanded")
        if not isinstance(node, dict):
            return 1, set()
        ref = node.get("$ref")
        if isinstance(ref, str):
            if ref in active:
                return 1, {ref}
            if ref in self.done:
                return self.done[ref], set()
            width, reached = self.of(_resolve(self.root, ref), path, (*active, ref))
            if not reached - {ref}:
                self.done[ref] = width
            return width, reached - {ref}
        parts = [self.of(sub, sub_path, active) for sub_path, sub in subschemas(node, path)
                 if not sub_path[len(path):].startswith((".$defs.", ".definitions."))]
        reached = set().union(*(r for _, r in parts)) if parts else set()
        # a list of types is a union of that many alternatives (the converter's)
        types = len(node["type"]) if isinstance(node.get("type"), list) else 1
        if not isinstance(node.get("anyOf"), list):
            return max(types - 1 + max((w for w, _ in parts), default=1), 1), reached
        if sum(1 for _, r in parts if r) > 1:
            raise too_big(f"{path}.anyOf", f"branches recursing through {sorted(reached)[0]} "
                          "(the model's nesting would multiply the grammar's work)")
        return sum(w for w, _ in parts), reached


def _resolve(root: Any, ref: str) -> Any:
    """The subschema local reference `ref` (``#/a/b``) names in `root`; None if none."""
    node = root
    for part in ref.removeprefix("#/").split("/"):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def check_tools(tools: list[Any]) -> None:
    """Raises `EngineError` (400) for more than MAX_TOOLS tools."""
    if len(tools) > MAX_TOOLS:
        raise too_big("tools", f"{len(tools)} tools (at most {MAX_TOOLS})")


def check_grammar_size(grammar: str, where: str) -> str:
    """`grammar`, or raises `EngineError` (400) if it is over MAX_GRAMMAR_CHARS."""
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise too_big(where, f"the schema makes a grammar of {len(grammar)} characters (at "
                      f"most {MAX_GRAMMAR_CHARS})")
    return grammar


def too_big(where: str, why: str) -> EngineError:
    return EngineError("unsupported_schema", 400, f"{where}: {why}")
