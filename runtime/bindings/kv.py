"""The KV capability: a function's declared namespaces on the PoP's KV store.

`run` is the operation codec (JSON-ish arguments in, JSON-ish results out, values
as base64) that both `KVBinding` and the admin API use; only `KVBinding` checks
what a function declared. A Python isolate's values travel raw (`wire.CALL_VALUE`,
`wire.REPLY_VALUE`): a value written may come as bytes, and its reads ask for them
as bytes (``raw``), never base64 on the PoP's loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgefn_core.errors import BindingError
from kv import KVStore
from kv.quota import Quota
from kv.store import Entry, Page
from runtime.bindings import owners
from runtime.bindings.codec import b64, base64_bytes, integer, known, seconds, text

if TYPE_CHECKING:
    from runtime.bindings import Stores

WRITES = frozenset({"put", "delete", "increment", "cas"})
OPS = WRITES | {"get", "list"}  # what a function may call ("create" is the operator's)
# run off the PoP's event loop (see `Bindings.call`): writes wait for fsync, and a list
# reads past up to 1000 expired keys (`Limits.max_list_expired`) besides its page
SLOW = WRITES | {"list"}


class KVBinding:
    def __init__(self, stores: Stores, owner: str, namespaces: frozenset[str],
                 tenant: str | None = None) -> None:
        """`owner`: the function (named in errors); `tenant`: who it binds for
        (`Manifest.tenant`, the function's name by default)."""
        self.stores = stores
        self.owner = owner
        self.namespaces = namespaces
        self.tenant = tenant or owner

    @property
    def store(self) -> KVView:
        """The store as this function sees it: every call checks its namespace."""
        return KVView(self)

    def namespace(self, ns: str, write: bool = False) -> str:
        """`ns` if the function declared it and its owner lets the function's owner
        read it (or write it, for a `write`). Raises `BindingError`: the one check."""
        if ns not in self.namespaces:
            raise BindingError(f"function {self.owner!r} did not declare KV namespace {ns!r} "
                               "(add it to [bindings] kv in edgefn.toml)")
        denied = owners.denied(self.stores.owners, "kv", ns, self.tenant, write)
        if denied:
            raise BindingError(denied)
        return ns

    def quota(self, ns: str) -> Quota | None:
        """The quota a write to namespace `ns` is held to (`quota_for`)."""
        return quota_for(self.stores, ns, self.tenant)

    def readable(self) -> dict[str, Any]:
        """The declared namespaces the function may read now, with the owners'
        generation they were checked at (read first: if the claims change meanwhile,
        the generation has moved on and the answer is stale at once)."""
        generation = self.stores.owners.generation.value
        names = []
        for ns in sorted(self.namespaces):
            try:
                names.append(self.namespace(ns))
            except BindingError:
                continue
        return {"generation": generation, "namespaces": names}

    def call(self, op: str, args: dict[str, Any], raw: bool = False) -> Any:
        """`raw`: a value read comes as bytes (see `run`). Raises `BindingError`,
        `StoreError`, KeyError/TypeError/ValueError."""
        if op not in OPS:
            raise BindingError(f"unknown KV operation {op!r}")
        return run(self.store, op, self.namespace(args["namespace"], op in WRITES), args, raw)


def quota_for(stores: Stores, ns: str, tenant: str) -> Quota | None:
    """The quota (`Stores.kv_quota`) a write to namespace `ns` is held to, for a
    function or key of `tenant`: its owner's, over all that owner's namespaces (one
    tenant filled the store every tenant shares: MDB_MAP_FULL for all). The store
    checks it inside the write's transaction."""
    limit = stores.kv_quota
    if not limit:
        return None
    owners = stores.owners
    owner = owners.owner("kv", ns) or tenant
    return Quota(tuple(owners.names("kv", owner) or [ns]), limit, owner)


class KVView:
    """The KV store as one function sees it, for the host calls that reach the store
    directly (``kv_get``, ``kv_put``, ...): each call checks its namespace with
    `KVBinding.namespace`, reads for reading and writes for writing."""

    def __init__(self, binding: KVBinding) -> None:
        self.binding = binding
        self.kv = binding.stores.kv

    def get(self, ns: str, key: bytes) -> bytes | None:
        return self.kv.get(self.binding.namespace(ns), key)

    def get_entry(self, ns: str, key: bytes) -> Entry | None:
        return self.kv.get_entry(self.binding.namespace(ns), key)

    def list(self, ns: str, *args: Any) -> Page:
        return self.kv.list(self.binding.namespace(ns), *args)

    def put(self, ns: str, key: bytes, value: bytes, **kw: Any) -> int:
        quota = self.binding.quota(self.binding.namespace(ns, True))
        return self.kv.put(ns, key, value, quota=quota, **kw)

    def delete(self, ns: str, key: bytes) -> bool:
        return self.kv.delete(self.binding.namespace(ns, True), key)

    def increment(self, ns: str, key: bytes, delta: int = 1) -> int:
        quota = self.binding.quota(self.binding.namespace(ns, True))
        return self.kv.increment(ns, key, delta, quota=quota)

    def cas(self, ns: str, key: bytes, expected: int | None, value: bytes,
            **kw: Any) -> int | None:
        quota = self.binding.quota(self.binding.namespace(ns, True))
        return self.kv.cas(ns, key, expected, value, quota=quota, **kw)


_KEY = frozenset({"namespace", "key", "key_b64"})
_VALUE = frozenset({"value", "ttl", "metadata"})
ARGS = {"get": _KEY, "delete": _KEY, "put": _KEY | _VALUE, "increment": _KEY | {"delta"},
        "cas": _KEY | _VALUE | {"expected_version"},
        "list": frozenset({"namespace", "prefix", "cursor", "limit"})}


def run(kv: KVStore | KVView, op: str, ns: str, a: dict[str, Any], raw: bool = False,
        quota: Quota | None = None) -> Any:
    """One KV operation on namespace `ns`; `raw`: a value read comes as bytes, not
    base64 (for a REPLY_VALUE frame); `quota`: what a write to the store itself is
    held to (a `KVView` holds its own). Raises `BindingError` for an unknown one,
    `StoreError` from the store, KeyError/TypeError/ValueError/AttributeError for
    bad args (a number where a string belongs)."""
    held: dict[str, Any] = {} if quota is None else {"quota": quota}
    if op in ARGS:
        known(a, ARGS[op], f"kv.{op}")
    key = _key(a) if op in ("get", "put", "delete", "increment", "cas") else b""
    match op:
        case "get":
            entry = kv.get_entry(ns, key)
            if entry is None:
                return None
            value = entry.value if raw else b64(entry.value)
            return {"value": value, "metadata": entry.metadata, "version": entry.version,
                    "expires_at": entry.expires_at}
        case "put":
            return kv.put(ns, key, _value(a), ttl=seconds(a, "ttl"),
                          metadata=a.get("metadata"), **held)
        case "delete":
            return kv.delete(ns, key)
        case "increment":
            return kv.increment(ns, key, integer(a, "delta", 1), **held)
        case "cas":
            expected = a.get("expected_version")
            if expected is not None and type(expected) is not int:  # "1" matched nothing
                raise ValueError(f"expected_version must be an integer or null, got "
                                 f"{expected!r:.40}")
            return kv.cas(ns, key, expected, _value(a),
                          ttl=seconds(a, "ttl"), metadata=a.get("metadata"), **held)
        case "create" if isinstance(kv, KVStore):  # the operator's only
            kv.create_namespace(ns)
            return None
        case "list":
            prefix = text(a, "prefix") if "prefix" in a else ""
            cursor = text(a, "cursor") if a.get("cursor") is not None else None
            page = kv.list(ns, prefix.encode(), cursor, integer(a, "limit", 100))
            return {"keys": [_listed(k) for k in page.keys], "cursor": page.cursor}
    raise BindingError(f"unknown KV operation {op!r}")


def _key(a: dict[str, Any]) -> bytes:
    """The key an op names: ``key`` (text, UTF-8) or ``key_b64`` (any bytes, as
    `kv.list` gives a key that is not UTF-8). Raises KeyError when neither is there,
    ValueError when both are."""
    if "key_b64" in a:
        if "key" in a:  # (key_b64 was ignored)
            raise ValueError("give key or key_b64, not both")
        return base64_bytes(a, "key_b64")
    return text(a, "key").encode()


def _value(a: dict[str, Any]) -> bytes:
    """The value a put or cas writes: bytes a Python isolate sent raw (a CALL_VALUE
    frame's, a view of it: copied here, off the loop; JSON holds no bytes), else
    base64 text. Raises KeyError when absent, ValueError for text that is not base64."""
    value = a["value"]
    if isinstance(value, bytes | memoryview):
        return bytes(value)
    return base64_bytes(a, "value")


def _listed(k: Any) -> dict[str, Any]:
    """A `kv.list` entry: a key that is not UTF-8 (a WASM guest's raw bytes) comes as
    ``key_b64`` too, for the get or delete that names it (its ``key`` is lossy)."""
    try:
        return {"key": k.key.decode(), "metadata": k.metadata, "expires_at": k.expires_at}
    except UnicodeDecodeError:
        return {"key": k.key.decode("utf-8", "replace"), "metadata": k.metadata,
                "expires_at": k.expires_at, "key_b64": b64(k.key)}
