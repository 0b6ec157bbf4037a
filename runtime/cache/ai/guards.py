"""Normalisation of prompts and the guards of the semantic cache.

INTERFACE ONLY (being written): `normalize` and `veto` keep these signatures.
"""

from __future__ import annotations

import unicodedata

DEFAULT_THRESHOLD = 0.9  # cosine similarity a semantic hit needs at least


def normalize(text: str) -> str:
    """`text` with case, whitespace, punctuation and unicode forms folded: what
    the exact and semantic caches hash and embed."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(text.split())


def veto(query: str, cached: str) -> str | None:
    """The name of the guard that refuses to serve `cached`'s answer for
    `query` (two prompts similar enough by embedding), or None to allow it."""
    return None
