"""The vectors capability: a function's declared indexes on the PoP's vector store.

`run` is the operation codec shared with the admin API; only `VectorsBinding`
checks what a function declared.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgefn_core.errors import BindingError
from kv.quota import Quota
from kv.vectors import GRAPH_LIMITS, IndexConfig, VectorStore, as_vector
from runtime.bindings import owners
from runtime.bindings.codec import integer, known, text

if TYPE_CHECKING:
    from runtime.bindings import Stores

WRITES = frozenset({"upsert", "delete"})
# each operation's arguments: an unknown one is refused by name (a misspelt ``filtr``
# was dropped, and the query answered unfiltered: another user's documents)
ARGS = {"query": frozenset({"index", "vector", "k", "filter"}),
        "upsert": frozenset({"index", "items"}), "delete": frozenset({"index", "ids"})}
ITEM = frozenset({"id", "vector", "metadata"})
SLOW = WRITES | {"query"}  # run off the PoP's event loop (see `Bindings.call`)


class VectorsBinding:
    def __init__(self, stores: Stores, owner: str, indexes: frozenset[str],
                 tenant: str | None = None) -> None:
        """`owner`: the function (named in errors); `tenant`: who it binds for."""
        self.stores = stores
        self.owner = owner
        self.indexes = indexes
        self.tenant = tenant or owner

    @property
    def store(self) -> VectorStore:
        return self.stores.vectors

    def index(self, name: str, write: bool = False) -> str:
        """`name` if the function declared it and its owner lets the function's owner
        read it (or write it, for a `write`). Raises `BindingError`: the one check."""
        if name not in self.indexes:
            raise BindingError(f"function {self.owner!r} did not declare vector index "
                               f"{name!r} (add it to [bindings] vectors in edgefn.toml)")
        denied = owners.denied(self.stores.owners, "vectors", name, self.tenant, write)
        if denied:
            raise BindingError(denied)
        return name

    def call(self, op: str, args: dict[str, Any]) -> Any:
        """Raises `BindingError`, `StoreError` (`LimitExceeded` past the owner's
        quota), KeyError/TypeError/ValueError."""
        if op not in ARGS:
            raise BindingError(f"unknown vectors operation {op!r}")
        known(args, ARGS[op], f"vectors.{op}")
        index = self.index(text(args, "index"), op in WRITES)
        return run(self.store, op, index, args, self.quota(index) if op == "upsert" else None)

    def quota(self, index: str) -> Quota | None:
        """The quota an upsert to `index` is held to (`quota_for`)."""
        return quota_for(self.stores, index, self.tenant)


def quota_for(stores: Stores, index: str, tenant: str) -> Quota | None:
    """The quota (`Stores.vectors_quota`) an upsert to `index` is held to, for a
    function or key of `tenant`: its owner's, over all that owner's indexes (the
    vector store, and the PoP's memory every index lives in, are shared, and one
    tenant could fill them). The store checks it inside the write's transaction; an
    upsert of ids it holds counts as new (delete first, near the quota)."""
    limit = stores.vectors_quota
    if not limit:
        return None
    owners = stores.owners
    owner = owners.owner("vectors", index) or tenant
    return Quota(tuple(owners.names("vectors", owner) or [index]), limit, owner, "vectors")


def run(vs: VectorStore, op: str, index: str, a: dict[str, Any],
        quota: Quota | None = None) -> Any:
    """One vector operation on `index` (an upsert held to `quota`). Raises
    `BindingError` for an unknown one, `StoreError` from the store,
    KeyError/TypeError/ValueError for bad args."""
    match op:
        case "query":
            matches = vs.query(index, a["vector"], integer(a, "k", 10), a.get("filter"))
            return [{"id": m.id, "distance": m.distance, "metadata": m.metadata}
                    for m in matches]
        case "upsert":
            items = a["items"]
            if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
                raise ValueError("items must be an array of objects {\"id\", \"vector\", "
                                 "\"metadata\"}")
            for item in items:
                known(item, ITEM, "a vectors.upsert item")
            if not all(isinstance(i.get("id"), str) for i in items):
                raise ValueError("each item's id must be a string")
            rows = [(i["id"], i["vector"], i.get("metadata")) for i in items]
            if rows and index not in vs.names():  # first write: the dimension is known now
                dim = len(as_vector(index, rows[0][1]))
                if quota is not None:  # refused before the index is made
                    quota.check(vs.held(quota.names), len(rows) * dim * 4)
                vs.check(IndexConfig(index, dim), rows)  # and so are its items
                vs.create(index, dim)
            return vs.upsert(index, rows, quota)
        case "delete":
            return vs.delete(index, a["ids"])
        case "create":
            config = vs.create(index, int(a["dim"]), a.get("metric", "cos"), a.get("dtype"),
                               **{k: a[k] for k in GRAPH_LIMITS if a.get(k) is not None})
            return config.__dict__
        case "stats":
            return vs.stats(index)
    raise BindingError(f"unknown vectors operation {op!r}")
