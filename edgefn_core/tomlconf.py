"""Decode TOML into msgspec Structs with errors that name the file and the field.

Shared by the function manifest (``edgefn.toml``), the PoP config (``pop.toml``)
and the model worker's config. Needs msgspec: not for use inside isolates.
"""

from __future__ import annotations

import re

import msgspec

from edgefn_core.errors import InvalidConfig

_AT = re.compile(r"^(?P<msg>.*?)(?: - at (?P<key>`key` in )?`\$(?P<path>[^`]*)`)?$", re.S)
_UNKNOWN = re.compile(r"(?:unknown|missing required) field `(?P<name>[^`]+)`")


def decode[T](raw: bytes, kind: type[T], file: str,
              error: type[InvalidConfig] = InvalidConfig) -> T:
    """Decode and validate TOML bytes; `file` is only used in messages.

    Raises `error` (an `InvalidConfig`) naming the field and what was expected.
    """
    try:
        return msgspec.toml.decode(raw, type=kind)
    except msgspec.ValidationError as e:
        found = from_validation(file, str(e), error, kind)
        if found.field and "[...]" in found.field:  # a table's value: name its key
            named = _named(raw, found.field, found.reason)
            if named is not None:
                found = error(file, found.reason, named)
        raise found from None
    except msgspec.DecodeError as e:
        raise error(file, f"not valid TOML: {e}") from None


_GOT = re.compile(r"got `(?P<type>\w+)`")
_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "array": list, "object": dict}


def _named(raw: bytes, field: str, reason: str) -> str | None:
    """`field` (``env[...]``, msgspec's placeholder for a table's value) with the key
    of the first value of the type `reason` says it got (``env.PORT``), or None."""
    got = _GOT.search(reason)
    wanted = _TYPES.get(got.group("type")) if got else None
    try:
        node: object = msgspec.toml.decode(raw)
    except msgspec.DecodeError:
        return None
    out: list[str] = []
    for part in re.findall(r"[^.\[\]]+|\[[^\]]*\]", field):
        if part == "[...]" and isinstance(node, dict):
            key = next((k for k, v in node.items() if wanted is not None
                        and type(v) is wanted), None)
            if key is None:
                return None
            out.append(f".{key}")
            node = node[key]
        elif part.startswith("[") and isinstance(node, list):
            out.append(part)
            node = node[int(part[1:-1])] if part[1:-1].isascii() and part[1:-1].isdigit() else None
        elif isinstance(node, dict):
            out.append(f".{part}" if out else part)
            node = node.get(part)
        else:
            return None
    return "".join(out).lstrip(".")


def from_validation(file: str, text: str, error: type[InvalidConfig] = InvalidConfig,
                    kind: object = None) -> InvalidConfig:
    """Turn msgspec's ``Expected `int`, got `str` - at `$.a.b` `` into
    ``file: field `a.b`: expected `int`, got `str```; with the decoded type `kind`,
    a value not among a field's choices also lists them."""
    m = _AT.match(text)
    msg, path = (m.group("msg"), m.group("path")) if m else (text, None)
    if m and m.group("key"):
        msg += " (in a key)"
    elif kind is not None and path and _CHOICE.match(msg):
        choices = _choices(kind, path)
        if choices:
            msg += f" (expected {choices})"
    fieldname = path.lstrip(".") if path else None
    unknown = _UNKNOWN.search(msg)
    if unknown:
        name = unknown.group("name")
        fieldname = f"{fieldname}.{name}" if fieldname else name
    msg = msg[0].lower() + msg[1:] if msg else msg
    return error(file, msg, fieldname or None)


_CHOICE = re.compile(r"^Invalid (?:enum )?value ")


_KINDS = {"IntType": "an integer", "FloatType": "a number", "StrType": "a string",
          "BoolType": "a boolean"}


def _choices(kind: object, path: str) -> str:
    """What a field at msgspec's `path` (``.pipeline[0].stage``) of `kind` may be,
    when it has choices (a Literal's or an Enum's values, a tagged union's tags):
    ``one of: 'a', 'b'``, ``'auto' or an integer``; "" if it has none."""
    node: object = msgspec.inspect.type_info(kind)
    for part in re.findall(r"[^.\[\]]+|\[[^\]]*\]", path):
        node = _step(node, part)
        if node is None:
            return ""
    values = _values(node)
    if not values:
        return ""
    members = node.types if isinstance(node, msgspec.inspect.UnionType) else ()
    others = [_KINDS[type(t).__name__] for t in members if type(t).__name__ in _KINDS]
    listed = ", ".join(repr(v) for v in values)
    if others:
        return f"{listed if len(values) == 1 else 'one of: ' + listed} or {' or '.join(others)}"
    return f"one of: {listed}"


def _step(node: object, part: str) -> object:
    """The type one path part below `node` (a struct's field, a list's item, a
    table's value), looking through unions and optionals; None if lost."""
    i = msgspec.inspect
    if isinstance(node, i.UnionType):
        found = [n for n in (_step(t, part) for t in node.types) if n is not None]
        if len(found) <= 1:
            return found[0] if found else None
        if all(isinstance(n, _Tag) for n in found):  # a tagged union's tag field
            return _Tag(tuple(t for n in found for t in n.tags))  # type: ignore[attr-defined]
        return i.UnionType(tuple(n for n in found if isinstance(n, i.Type)))
    if part.startswith("["):
        if isinstance(node, (i.ListType, i.SetType, i.VarTupleType, i.FrozenSetType)):
            return node.item_type
        return node.value_type if isinstance(node, i.DictType) else None
    if isinstance(node, i.StructType):
        if node.tag_field == part:
            return _Tag((node.tag,))
        return next((f.type for f in node.fields if f.encode_name == part), None)
    return None


class _Tag:
    """A tagged union member's tag field: the tags are its choices."""

    def __init__(self, tags: tuple[object, ...]) -> None:
        self.tags = tags


def _values(node: object) -> list[object]:
    i = msgspec.inspect
    if isinstance(node, i.LiteralType):
        return list(node.values)
    if isinstance(node, i.EnumType):
        return [m.value for m in node.cls]
    if isinstance(node, _Tag):
        return list(node.tags)
    if isinstance(node, i.UnionType):
        return [v for t in node.types for v in _values(t)]
    return []

