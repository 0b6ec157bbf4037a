"""A second process holding a `VectorStore`, driven over stdin/stdout, so tests can
interleave its calls with their own store's on the same directory (LMDB must not
be opened twice in one process). One JSON list a line in (an operation and its
arguments), one JSON object a line out: ``{"ok": result}`` or ``{"error": "..."}``.

    python -m tests.kv.vector_peer
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

import kv.vectors
from kv.vectors import VectorStore

store: VectorStore | None = None


def keys(vs: VectorStore, name: str) -> dict[str, int]:
    """Every id of index `name` and the usearch key LMDB gave it."""
    o = vs._get(name)
    with vs.env.begin() as txn:
        return {k.decode(): kv.vectors._KEY.unpack(v)[0] for k, v in txn.cursor(db=o.ids)}


def fill(vs: VectorStore, name: str, prefix: str, n: int, dim: int) -> None:
    """`n` single-id upserts; id ``{prefix}{i}``'s vector is `vector(prefix, i, dim)`."""
    for i in range(n):
        vs.upsert(name, [(f"{prefix}{i}", vector(prefix, i, dim), {"i": i})])


def vector(prefix: str, i: int, dim: int) -> list[float]:
    """A vector of its own for each (prefix, i), the same in every process."""
    rand = random.Random(f"{prefix}{i}")  # a str seed is hashed the same in every process
    return [rand.uniform(-1, 1) for _ in range(dim)]


def run(op: str, args: list[Any]) -> Any:
    global store
    if op == "open":
        store = VectorStore(args[0], sync=False)
        return None
    if op == "save_every":
        kv.vectors.SAVE_EVERY = args[0]
        return None
    assert store is not None
    vs = store
    match op:
        case "close":
            vs.close()
            store = None
            return None
        case "create":
            return vs.create(*args).__dict__
        case "upsert":
            return vs.upsert(args[0], [tuple(i) for i in args[1]])
        case "delete":
            return vs.delete(args[0], args[1])
        case "query":  # exact: the answer is the model's, not HNSW's approximation
            return [[m.id, m.distance, m.metadata]
                    for m in vs.query(args[0], args[1], args[2], exact=True)]
        case "stats":
            return vs.stats(args[0])
        case "save":
            return vs.save(args[0])
        case "keys":
            return keys(vs, args[0])
        case "fill":
            return fill(vs, *args)
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    for line in sys.stdin:
        op, *args = json.loads(line)
        try:
            reply = {"ok": run(op, args)}
        except Exception as e:  # the test reads it; the peer keeps serving
            reply = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
