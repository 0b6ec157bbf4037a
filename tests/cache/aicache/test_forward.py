"""`runtime.cache.ai.forward`: the signed query embedding one tier hands the next."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from runtime.cache.ai import forward

SECRET = "s" * 32
MODEL = "all-minilm-l6-v2"
QUERY = "what is the capital of france"
VECTOR = np.linspace(-1, 1, 384, dtype=np.float32)


def signed(**kw: object) -> bytes:
    args: dict[str, object] = {"secret": SECRET, "model": MODEL, "query": QUERY,
                               "vector": VECTOR, **kw}
    value = forward.sign(**args)  # type: ignore[arg-type]
    assert value is not None
    return value.encode()


def test_a_signed_vector_comes_back_bit_for_bit() -> None:
    got = forward.verify(SECRET, signed(), MODEL, QUERY)
    assert got is not None and got.dtype == np.float32 and np.array_equal(got, VECTOR)


def test_without_a_secret_nothing_is_signed_or_taken() -> None:
    assert forward.sign("", MODEL, QUERY, VECTOR) is None
    assert forward.verify("", signed(), MODEL, QUERY) is None


@pytest.mark.parametrize(("secret", "model", "query"), [
    ("t" * 32, MODEL, QUERY),                   # another topology's secret
    (SECRET, "other-embedder", QUERY),           # another embedding model
    (SECRET, MODEL, "what is the capital of spain"),  # another query
])
def test_a_vector_for_anything_else_is_refused(secret: str, model: str, query: str) -> None:
    assert forward.verify(secret, signed(), model, query) is None


def test_a_changed_vector_or_tag_is_refused() -> None:
    model, data, tag = signed().decode().split(";")
    other = base64.b64encode((VECTOR + 1).astype("<f4").tobytes()).decode()
    for value in (f"{model};{other};{tag}", f"{model};{data};{'0' * len(tag)}",
                  f"{model};{data}", f"{model};{data};{tag};x", "\xff"):
        assert forward.verify(SECRET, value.encode("latin-1"), MODEL, QUERY) is None, value


@pytest.mark.parametrize("vector", [np.array([np.nan, 1.0], dtype=np.float32),
                                    np.zeros(forward.MAX_DIM + 1, dtype=np.float32),
                                    np.zeros(0, dtype=np.float32)])
def test_signed_but_unusable_vectors_are_refused(vector: np.ndarray) -> None:
    assert forward.verify(SECRET, signed(vector=vector), MODEL, QUERY) is None
