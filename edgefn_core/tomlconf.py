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
        found = from_validation(file, str(e), error)
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
            node = node[int(part[1:-1])] if part[1:-1].isdigit() else None
        elif isinstance(node, dict):
            out.append(f".{part}" if out else part)
            node = node.get(part)
        else:
            return None
    return "".join(out).lstrip(".")


def from_validation(file: str, text: str,
                    error: type[InvalidConfig] = InvalidConfig) -> InvalidConfig:
    """Turn msgspec's ``Expected `int`, got `str` - at `$.a.b` `` into
    ``file: field `a.b`: expected `int`, got `str```."""
    m = _AT.match(text)
    msg, path = (m.group("msg"), m.group("path")) if m else (text, None)
    if m and m.group("key"):
        msg += " (in a key)"
    fieldname = path.lstrip(".") if path else None
    unknown = _UNKNOWN.search(msg)
    if unknown:
        name = unknown.group("name")
        fieldname = f"{fieldname}.{name}" if fieldname else name
    msg = msg[0].lower() + msg[1:] if msg else msg
    return error(file, msg, fieldname or None)
