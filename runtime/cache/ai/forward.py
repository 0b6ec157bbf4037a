"""The query embedding a PoP's AI cache computed on a miss, handed to the tier above
with the model call it forwards (``x-edgefn-embedding``), so that tier looks up its own
semantic cache without embedding the same text again (~17 ms a miss per tier with
MiniLM on one thread).

The value is ``MODEL;VECTOR;TAG``: the embedding model, the vector as base64 of
little-endian float32, and an HMAC of both and the query text's SHA-256 under the
topology's shared secret (``[residency] secret``). A tier uses it only when the tag
checks, the model is its own embedding model and the query is the one it derived
from the same request: anything else (no secret, a client's own header, a query the
lower tier saw otherwise) is ignored and the tier embeds the text itself. A forged
vector could only steer a lookup, and it cannot be made without the secret. Pure
functions; nothing here raises.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

import numpy as np

from runtime.security.residency import mac

HEADER = b"x-edgefn-embedding"
MAX_DIM = 4096


def sign(secret: str, model: str, query: str, vector: np.ndarray) -> str | None:
    """The header value for `vector`, the embedding of `query` by `model`; None
    without a secret (nothing can be checked, so nothing is handed on)."""
    if not secret or ";" in model:
        return None
    data = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    return f"{model};{data};{_tag(secret, model, query, data)}"


def verify(secret: str, value: bytes, model: str, query: str) -> np.ndarray | None:
    """The vector `value` carries, if it was signed with `secret` for `query` embedded
    by `model` and holds 1..MAX_DIM finite floats; else None."""
    if not secret:
        return None
    try:
        named, data, tag = value.decode("ascii").split(";")
    except (UnicodeDecodeError, ValueError):
        return None
    if named != model or not hmac.compare_digest(tag, _tag(secret, model, query, data)):
        return None
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None
    if not raw or len(raw) % 4 or len(raw) > 4 * MAX_DIM:
        return None
    vector = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    return vector if bool(np.isfinite(vector).all()) else None


def _tag(secret: str, model: str, query: str, data: str) -> str:
    return mac(secret, "embedding", model, hashlib.sha256(query.encode()).hexdigest(), data)
