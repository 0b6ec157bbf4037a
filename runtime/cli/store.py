"""`edgefn kv ...` and `edgefn vectors ...`: through the running PoP's admin API
when one serves the data dir (it holds the vector indexes in memory), else on
the data dir directly. JSON arguments arrive parsed and checked by the parser."""

from __future__ import annotations

import argparse
import base64
import collections
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from edgefn_core.errors import EdgefnError, InvalidConfig, InvalidValue, KeyNotFound, NotFound
from runtime.cli.parser import no_json_constant

if TYPE_CHECKING:
    from runtime.admin.client import AdminClient
    from runtime.bindings import Stores

IMPORT_BATCH = 1000
RECORD_FIELDS = ("id", "vector", "metadata")  # of a JSONL line `vectors import` reads
# what the store refuses, checked for every line before any is written (not imported
# from kv.vectors, which loads usearch: tests/kv/test_cli.py checks they agree)
F32_MAX = 3.4028234663852886e38
MAX_ID_BYTES = 256


class StoreAccess:
    """The running PoP's admin API if one serves `data_dir`, else the stores in it
    (opened only then: they load LMDB, usearch and numpy)."""

    def __init__(self, data_dir: str, reading: bool = False) -> None:
        """`reading`: only reads follow (get, list, query, stats): a data dir that is
        not there is an error, not one made (a typo'd --data made LMDB files).
        Raises `NotFound` for that, what `AdminClient` raises for a PoP that runs."""
        from runtime.admin.client import AdminClient, running

        self.client: AdminClient | None = None
        self.stores: Stores | None = None
        if running(data_dir):  # never beside a running PoP, behind its back
            self.client = AdminClient(data_dir)
        else:  # none runs (one killed -9 left its pop.json: not a running one)
            if Path(data_dir).exists() and not Path(data_dir).is_dir():
                raise InvalidConfig("--data", f"{data_dir} is not a directory")
            if reading and not Path(data_dir).is_dir():
                raise NotFound(f"{data_dir}: no such data dir (pass --data, or set "
                               "EDGEFN_DATA)")
            from runtime.bindings import Stores

            self.stores = Stores(Path(data_dir))

    def call(self, kind: str, target: str, op: str, args: dict[str, Any]) -> Any:
        """Raises `AdminError` (through the PoP) or `BindingError` (on the data dir)
        with the store's message."""
        if self.client is not None:
            body = json.dumps(args).encode()
            # quoted: a name with a space, "/" or "?" reaches the store's own check
            path = f"/v1/{kind}/{quote(target, safe='')}/{op}"
            return self.client.request("POST", path, body)["result"]
        from runtime.bindings import operate

        assert self.stores is not None
        return operate(self.stores, kind, target, op, args)

    def close(self) -> None:
        if self.stores is not None:
            self.stores.close()


def kv_command(args: argparse.Namespace) -> None:
    """`edgefn kv OP`. Raises `EdgefnError`; `KeyNotFound` from `get` of a missing key."""
    access = StoreAccess(args.data, reading=args.op in ("get", "list"))
    try:
        a = _kv_args(args)
        try:
            result = access.call("kv", args.namespace, args.op, a)
        except EdgefnError as e:
            # a put or an increment makes its namespace, once nothing else is wrong (it
            # was made first: a refused put left an empty namespace behind)
            if e.code != "unknown_namespace" or args.op not in ("put", "increment"):
                raise
            access.call("kv", args.namespace, "create", {})
            result = access.call("kv", args.namespace, args.op, a)
    finally:
        access.close()
    _print_kv(args, result)


def _kv_args(args: argparse.Namespace) -> dict[str, Any]:
    if args.op == "list":
        return {"prefix": args.prefix, "limit": args.limit, "cursor": args.cursor}
    a: dict[str, Any] = {"key": args.key}
    if args.op in ("put", "increment"):
        from kv.store import Limits

        most = Limits().max_key_bytes
        if not 0 < len(args.key.encode()) <= most:
            # checked before the namespace is made for it (the store checks it again)
            raise InvalidValue(f"a key is 1 to {most} UTF-8 bytes, got "
                               f"{len(args.key.encode())}")
    if args.op == "put":
        raw = sys.stdin.buffer.read() if args.value == "-" else args.value.encode()
        a.update(value=base64.b64encode(raw).decode(), ttl=args.ttl, metadata=args.metadata)
    return a


def _print_kv(args: argparse.Namespace, result: Any) -> None:
    if args.op == "get" and result is None:
        raise KeyNotFound(f"no key {args.key!r} in namespace {args.namespace!r}")
    if args.json or args.op not in ("get", "list"):
        print(json.dumps(result))
    elif args.op == "get":
        value = base64.b64decode(result["value"])
        sys.stdout.buffer.write(value)
        if sys.stdout.isatty() and not value.endswith(b"\n"):  # as redis-cli: the next
            sys.stdout.buffer.write(b"\n")  # line starts apart; a pipe gets the bytes as stored
    else:
        for k in result["keys"]:
            print(k["key"])
        if result["cursor"]:
            print(f"# more: --cursor {result['cursor']}", file=sys.stderr)


def vectors_command(args: argparse.Namespace) -> None:
    """`edgefn vectors OP`; prints the result as JSON. Raises `EdgefnError`."""
    access = StoreAccess(args.data, reading=args.op in ("query", "stats"))
    try:
        if args.op == "import":
            result = _import(access, args.index, Path(args.file))
        else:
            result = access.call("vectors", args.index, args.op, _vector_args(args))
    finally:
        access.close()
    print(json.dumps(result, indent=None if args.op != "stats" else 2))


def _vector_args(args: argparse.Namespace) -> dict[str, Any]:
    match args.op:
        case "create":
            return {"dim": args.dim, "metric": args.metric, "dtype": args.dtype,
                    "connectivity": args.connectivity, "expansion_add": args.expansion_add,
                    "expansion_search": args.expansion_search}
        case "upsert":
            return {"items": [{"id": args.id, "vector": args.vector,
                               "metadata": args.metadata}]}
        case "query":
            return {"vector": args.vector, "k": args.k, "filter": args.filter}
    return {}


def _import(access: StoreAccess, index: str, path: Path) -> dict[str, int]:
    """Upsert the records in `path`, in batches, once all of them are read and checked
    (a bad line 1201 had left the 1000 records before it imported). Raises
    `InvalidValue` naming the line of a bad record, or where a batch the store
    refused starts and how many records went in before it."""
    try:
        items = _checked(path, _dimension(access, index))
    except InvalidValue as e:
        raise InvalidValue(f"{e}; nothing was imported") from None
    total = 0
    for first, batch in _batches(items, IMPORT_BATCH):
        try:
            total += access.call("vectors", index, "upsert", {"items": batch})
        except EdgefnError as e:  # say where, and what is in already (batches commit)
            raise InvalidValue(f"{path}: the records from {first} on were not imported "
                               f"({total} before them were): {e}") from None
    return {"imported": total}


def _checked(path: Path, dim: int | None) -> Iterable[dict[str, Any]]:
    """`read_vectors(path, dim)` once every record in it is checked. Raises
    `InvalidValue` for the first bad one."""
    items = read_vectors(path, dim)
    if path.suffix == ".npy":  # checked as a whole before its first row
        next(items, None)
        return read_vectors(path, dim)
    if not path.is_file():  # a pipe reads once: its records are held
        return list(items)
    collections.deque(items, maxlen=0)  # read twice, not held: it may not fit in memory
    return read_vectors(path, dim)


def _dimension(access: StoreAccess, index: str) -> int | None:
    """`index`'s dimension, or None for one the import makes (with its first vector's).
    Raises what `StoreAccess.call` raises."""
    try:
        return int(access.call("vectors", index, "stats", {})["dim"])
    except EdgefnError as e:
        if e.code != "unknown_namespace":
            raise
        return None


def read_vectors(path: Path, dim: int | None = None) -> Iterator[dict[str, Any]]:
    """Items from JSONL ({"id", "vector", "metadata"?} per line) or .npy (ids are
    row numbers), each vector of `dim` numbers (None: as many as the first one's).
    Raises `InvalidValue` naming the file and line of a bad record."""
    if path.suffix == ".npy":
        yield from _read_npy(path, dim)
        return
    try:
        f = path.open()
    except OSError as e:
        raise InvalidValue(f"{path}: {e.strerror}") from None
    want = None if dim is None else (dim, f"the index has dimension {dim}")
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = _record(line, want)
            except ValueError as e:
                raise InvalidValue(f"{path}:{n}: {e}") from None
            if want is None:
                size = len(item["vector"])
                want = (size, f"line {n}'s has {size} (a new index takes the first one's)")
            yield {"id": str(item["id"]), "vector": item["vector"],
                   "metadata": item.get("metadata"), "line": n}


def _record(line: str, want: tuple[int, str] | None) -> dict[str, Any]:
    """One JSONL line's record, checked; `want`: the vector's size and whence it is
    known. Raises ValueError saying what is wrong."""
    item = json.loads(line, parse_constant=no_json_constant)
    if not isinstance(item, dict) or "id" not in item or "vector" not in item:
        raise ValueError('expected {"id": ..., "vector": [...]}')
    unknown = next((k for k in item if k not in RECORD_FIELDS), None)
    if unknown is not None:  # a misspelt "metadata" was imported as none
        raise ValueError(f"unknown field {json.dumps(unknown)} (a record has \"id\", "
                         '"vector" and "metadata")')
    if not isinstance(item["id"], str | int) or isinstance(item["id"], bool):
        raise ValueError(f'"id" must be a string (or an integer), got '
                         f"{json.dumps(item['id'])}")
    vector = item["vector"]
    if not isinstance(vector, list) or not vector or not all(
            type(x) is float or type(x) is int for x in vector):  # not bool; the fastest test
        raise ValueError('"vector" must be a list of numbers')
    if want is not None and len(vector) != want[0]:
        raise ValueError(f'"vector" has {len(vector)} numbers; {want[1]}')
    if not all(-F32_MAX <= x <= F32_MAX for x in vector):  # NaN compares false too
        raise ValueError('"vector" has a number past float32\'s range (the store keeps f32)')
    if not 1 <= len(str(item["id"]).encode()) <= MAX_ID_BYTES:
        raise ValueError(f'"id" must be 1 to {MAX_ID_BYTES} bytes')
    if not isinstance(item.get("metadata"), dict | None):
        raise ValueError(f'"metadata" must be an object (or null), got '
                         f"{json.dumps(item['metadata'])}")
    return item


def _read_npy(path: Path, dim: int | None) -> Iterator[dict[str, Any]]:
    import numpy as np

    try:
        matrix = np.load(path, allow_pickle=False, mmap_mode="r")  # `_checked` reads it twice
    except (OSError, ValueError) as e:
        raise InvalidValue(f"{path}: not a readable .npy file: {e}") from None
    if matrix.ndim != 2:
        raise InvalidValue(f"{path}: expected a 2-D array, got shape {matrix.shape}")
    if dim is not None and matrix.shape[1] != dim:
        raise InvalidValue(f"{path}: rows of {matrix.shape[1]} numbers; the index has "
                           f"dimension {dim}")
    if matrix.dtype.kind not in "iuf":
        raise InvalidValue(f"{path}: expected numbers, got an array of {matrix.dtype}")
    for start in range(0, len(matrix), 4096):  # over the mmap: a block at a time
        block = np.asarray(matrix[start:start + 4096], dtype=np.float64)
        bad = ~(np.abs(block) <= F32_MAX).all(axis=1)  # NaN compares false too
        if bad.any():
            raise InvalidValue(f"{path}: row {start + int(bad.argmax())} has a NaN, an "
                               "infinite value or one past float32's range")
    for i, row in enumerate(matrix):
        yield {"id": str(i), "vector": row.tolist()}


def _batches(items: Iterable[dict[str, Any]], size: int
             ) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Batches of `size` items, each with where its first one is (``line 12``, ``row 3``)."""
    batch: list[dict[str, Any]] = []
    first = ""
    for i, item in enumerate(items):
        line = item.pop("line", None)
        if not batch:
            first = f"line {line}" if line is not None else f"row {i}"
        batch.append(item)
        if len(batch) == size:
            yield first, batch
            batch = []
    if batch:
        yield first, batch

