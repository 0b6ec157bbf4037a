"""`edgefn kv ...` and `edgefn vectors ...`: through the running PoP's admin API
when one serves the data dir (it holds the vector indexes in memory), else on
the data dir directly."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edgefn_core.errors import BindingError, EdgefnError
from runtime.admin.client import AdminClient
from runtime.bindings import Stores, operate

IMPORT_BATCH = 1000


class StoreAccess:
    def __init__(self, data_dir: str) -> None:
        self.client: AdminClient | None = None
        self.stores: Stores | None = None
        try:
            self.client = AdminClient(data_dir)
        except EdgefnError:
            self.stores = Stores(Path(data_dir))

    def call(self, kind: str, target: str, op: str, args: dict[str, Any]) -> Any:
        """Raises `EdgefnError` with the store's message."""
        if self.client is not None:
            body = json.dumps(args).encode()
            return self.client.request("POST", f"/v1/{kind}/{target}/{op}", body)["result"]
        assert self.stores is not None
        try:
            return operate(self.stores, kind, target, op, args)
        except BindingError as e:
            raise EdgefnError(str(e)) from None

    def close(self) -> None:
        if self.stores is not None:
            self.stores.close()


def kv_command(args: Any) -> None:
    access = StoreAccess(args.data)
    try:
        a: dict[str, Any] = {}
        if args.op in ("get", "put", "delete", "increment"):
            a["key"] = args.key
        if args.op == "put":
            raw = sys.stdin.buffer.read() if args.value == "-" else args.value.encode()
            a.update(value=base64.b64encode(raw).decode(), ttl=args.ttl,
                     metadata=json.loads(args.metadata) if args.metadata else None)
            access.call("kv", args.namespace, "create", {})
        if args.op == "list":
            a.update(prefix=args.prefix, limit=args.limit, cursor=args.cursor)
        result = access.call("kv", args.namespace, args.op, a)
    finally:
        access.close()
    if args.op == "get":
        if result is None:
            raise EdgefnError(f"no key {args.key!r} in namespace {args.namespace!r}")
        if args.json:
            print(json.dumps(result))
        else:
            sys.stdout.buffer.write(base64.b64decode(result["value"]))
            sys.stdout.flush()
    elif args.op == "list" and not args.json:
        for k in result["keys"]:
            print(k["key"])
        if result["cursor"]:
            print(f"# more: --cursor {result['cursor']}", file=sys.stderr)
    else:
        print(json.dumps(result))


def vectors_command(args: Any) -> None:
    access = StoreAccess(args.data)
    try:
        if args.op == "create":
            result = access.call("vectors", args.index, "create",
                                 {"dim": args.dim, "metric": args.metric, "dtype": args.dtype})
        elif args.op == "upsert":
            item = {"id": args.id, "vector": json.loads(args.vector),
                    "metadata": json.loads(args.metadata) if args.metadata else None}
            result = access.call("vectors", args.index, "upsert", {"items": [item]})
        elif args.op == "query":
            result = access.call("vectors", args.index, "query", {
                "vector": json.loads(args.vector), "k": args.k,
                "filter": json.loads(args.filter) if args.filter else None})
        elif args.op == "stats":
            result = access.call("vectors", args.index, "stats", {})
        else:  # import
            total = 0
            for batch in _batches(read_vectors(Path(args.file)), IMPORT_BATCH):
                total += access.call("vectors", args.index, "upsert", {"items": batch})
            result = {"imported": total}
    finally:
        access.close()
    print(json.dumps(result, indent=None if args.op != "stats" else 2))


def read_vectors(path: Path) -> Iterator[dict[str, Any]]:
    """Items from JSONL ({"id", "vector", "metadata"?} per line) or .npy (ids are
    row numbers). Raises `EdgefnError` naming the file and line of a bad record."""
    if path.suffix == ".npy":
        import numpy as np

        try:
            matrix = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise EdgefnError(f"{path}: not a readable .npy file: {e}") from None
        if matrix.ndim != 2:
            raise EdgefnError(f"{path}: expected a 2-D array, got shape {matrix.shape}")
        for i, row in enumerate(matrix):
            yield {"id": str(i), "vector": row.tolist()}
        return
    try:
        f = path.open()
    except OSError as e:
        raise EdgefnError(f"{path}: {e.strerror}") from None
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                if not isinstance(item, dict) or "id" not in item or "vector" not in item:
                    raise ValueError('expected {"id": ..., "vector": [...]}')
            except ValueError as e:
                raise EdgefnError(f"{path}:{n}: {e}") from None
            yield {"id": str(item["id"]), "vector": item["vector"],
                   "metadata": item.get("metadata")}


def _batches(items: Iterator[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
