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
        raise from_validation(file, str(e), error) from None
    except msgspec.DecodeError as e:
        raise error(file, f"not valid TOML: {e}") from None


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
