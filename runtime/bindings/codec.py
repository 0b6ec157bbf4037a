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
