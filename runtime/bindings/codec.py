"""Values across the binding boundary: bytes travel as base64 in JSON."""

from __future__ import annotations

import base64


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    """Raises ValueError (binascii.Error) for text that is not base64."""
    return base64.b64decode(text.encode(), validate=True)
