"""One scope's vectors: an in-memory usearch index (cosine) of its entries'
query embeddings, labelled by entry number. Scopes never share an index, so a
search can only find entries of its own scope."""

from __future__ import annotations

import numpy as np
from usearch.index import Index

SEARCH_K = 8  # candidates checked against the threshold and the guards


class ScopeIndex:
    def __init__(self, ndim: int) -> None:
        self.ndim = ndim
        self.index = Index(ndim=ndim, metric="cos", dtype="f32")

    def __len__(self) -> int:
        return len(self.index)

    def add(self, label: int, vector: np.ndarray) -> None:
        """Raises `ValueError` for a vector of another dimension."""
        if vector.shape != (self.ndim,):
            raise ValueError(f"vector of dimension {vector.shape} in an index of {self.ndim}")
        self.index.add(label, vector)

    def remove(self, label: int) -> None:
        self.index.remove(label)

    def nearest(self, vector: np.ndarray, k: int = SEARCH_K) -> list[tuple[int, float]]:
        """Up to `k` (label, cosine similarity), most similar first."""
        if len(self.index) == 0 or vector.shape != (self.ndim,):
            return []
        found = self.index.search(vector, min(k, len(self.index)))
        return [(int(label), 1.0 - float(d)) for label, d in zip(found.keys, found.distances,
                                                                 strict=True)]


def as_vector(values: list[float]) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b) / denom if denom else 0.0
