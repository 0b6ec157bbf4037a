"""Values across the binding boundary: bytes travel as base64 in JSON."""

from __future__ import annotations

import base64
from typing import Any


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    """Raises ValueError (binascii.Error) for text that is not base64."""
    return base64.b64decode(text.encode(), validate=True)


def integer(args: dict[str, Any], name: str, default: int) -> int:
    """``args[name]`` (`default` when absent), a JSON integer. Raises ValueError for
    anything else (``1.9`` was cut to 1, ``"2"`` read as 2, ``true`` as 1)."""
    value = args.get(name, default)
    if type(value) is not int:
        raise ValueError(f"{name} must be an integer, got {value!r:.40}")
    return value


def text(args: dict[str, Any], name: str) -> str:
    """``args[name]``, a JSON string. Raises KeyError when absent, ValueError for
    anything else (``"key": null`` said "'NoneType' object has no attribute
    'encode'")."""
    value = args[name]
    if type(value) is not str:
        raise ValueError(f"{name} must be a string, got {json_kind(value)}")
    return value


def base64_bytes(args: dict[str, Any], name: str) -> bytes:
    """``args[name]``, bytes sent as a base64 string (what ``call`` carries for
    values: JSON has no bytes). Raises KeyError when absent, ValueError otherwise
    (it said "Incorrect padding")."""
    value = text(args, name)
    try:
        return unb64(value)
    except ValueError:
        raise ValueError(f"{name} must be base64 (the bytes, base64-encoded), got "
                         f"{value!r:.40}") from None


def seconds(args: dict[str, Any], name: str) -> float | None:
    """``args[name]``, a JSON number or null (absent: None). Raises ValueError for
    anything else (``"ttl": "soon"`` said "'<' not supported between ...")."""
    value = args.get(name)
    if value is not None and type(value) not in (int, float):
        raise ValueError(f"{name} must be a number of seconds, got {json_kind(value)}")
    return value


def known(args: dict[str, Any], allowed: frozenset[str], what: str) -> None:
    """Raises ValueError naming an argument `what` does not take (a misspelt
    ``tiemout_ms`` was dropped without a word)."""
    unknown = sorted(set(args) - allowed)
    if unknown:
        raise ValueError(f"{what} takes no argument {unknown[0]!r} (it takes "
                         f"{', '.join(sorted(allowed))})")


def json_kind(value: Any) -> str:
    """What a JSON value is, in JSON's words (the messages name it so)."""
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(value),
                                                                        type(value).__name__)
