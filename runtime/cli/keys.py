"""`edgefn keys ...` and `edgefn limits show`. Keys live in the data dir (works
with or without a PoP running); a running PoP is told to reload them at once."""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgefn_core.errors import EdgefnError, InvalidValue
from runtime.security.keys import KeyRecord, KeyStore
from runtime.security.principal import TENANT

SCOPE = re.compile(r"^(\*|(fn|model|route|admin):[^\s,]{1,200})$")
# the operations `admin:OP` may grant (`runtime.admin.api.operation`); OP is a glob
ADMIN_OPS = frozenset({"deploy", "rollback", "delete", "read", "kv", "vectors", "ai", "keys",
                       "cache", "dashboard"})


def keys_command(args: argparse.Namespace) -> None:
    """Raises `InvalidValue` for bad options, `NotFound` for an unknown key id."""
    store = KeyStore(Path(args.data))
    match args.op:
        case "create":
            key, record = store.create(_tenant(args.tenant), _scopes(args.scopes),
                                       expires=args.expires, rpm=args.rpm,
                                       tpm=args.tpm, max_streams=args.max_streams)
            _reload(args.data)
            if args.json:
                print(json.dumps({"key": key, **_row(record)}))
            else:
                print(key)
                print(f"key {record.id} for tenant {record.tenant}: store it now, it is not "
                      "shown again", file=sys.stderr)
        case "ls":
            rows = [_row(k) for k in store.read()]
            if args.json:
                print(json.dumps(rows))
            else:
                _table(rows)
        case "revoke":
            record = store.revoke(args.id)
            _reload(args.data)
            print(json.dumps(_row(record)) if args.json else f"revoked {record.id}")


def limits_command(args: argparse.Namespace) -> None:
    """Raises `InvalidConfig` for a bad config or key file."""
    from runtime import config
    from runtime.security.ratelimit.in_force import in_force

    out: dict[str, Any] | None = _running_limits(args.data) if args.config is None else None
    if out is None:  # no PoP runs on the data dir: what the config says
        cfg = config.load(args.config, under={"data": args.data},  # as `serve` reads it
                          data=args.data if getattr(args, "data_given", False) else None)
        out = in_force(cfg.ratelimit, cfg.bots, KeyStore(cfg.data_dir))
    keys = out["keys"]
    if args.json:
        print(json.dumps(out))
        return
    print(f"storage {out['storage']}, client addresses aggregated to {out['ip_aggregation']}")
    for r in out["rules"]:
        print(f"rule: {r['limit']} per {r['by']} ({r['algorithm']})")
    for t, v in out["tenants"].items():
        print(f"tenant {t}: " + _limits(v))
    for k in keys:
        print(f"key {k['id']} ({k['tenant']}): " + _limits(k))
    for cls, rate in out["bots"].items():
        print(f"bots: {cls} limited to {rate} when its policy is `limit`")
    for name, rules in out.get("functions", {}).items():
        for r in rules:
            print(f"function {name}: {r['limit']} per {r['by']} ({r['algorithm']})")


def _running_limits(data: str) -> dict[str, Any] | None:
    """What the PoP running on `data` enforces (its own config and the functions it
    serves), or None if none runs there."""
    from runtime.admin.client import AdminClient

    try:
        client = AdminClient(data)
    except EdgefnError:
        return None
    result: dict[str, Any] = client.request("GET", "/v1/limits")
    return result


def _limits(v: Mapping[str, object]) -> str:
    parts = [f"{v[n]} {n}" for n in ("rpm", "tpm", "max_streams") if v.get(n) is not None]
    return ", ".join(parts) or "unlimited"


def _reload(data: str) -> None:
    """Tell a PoP running on `data` to re-read the keys now (else it notices
    within a second)."""
    from runtime.admin.client import AdminClient

    # no PoP running, or one going away: it reads the file when it starts
    with contextlib.suppress(EdgefnError):
        AdminClient(data, timeout=5).request("POST", "/v1/keys/reload")


def _tenant(text: str) -> str:
    if not TENANT.match(text):
        raise InvalidValue(f"--tenant: expected lower-case letters, digits, _ and -, got "
                           f"{text!r}")
    return text


def _scopes(text: str) -> tuple[str, ...]:
    scopes = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [s for s in scopes if not SCOPE.match(s)]
    if bad or not scopes:
        raise InvalidValue(f"--scopes: expected '*', fn:NAME, route:/PATH, model:NAME or "
                           f"admin:OP, got {bad[0] if bad else text!r}")
    for s in scopes:
        op = s.partition(":")[2] if s.startswith("admin:") else None
        if op is not None and not any(fnmatch.fnmatchcase(o, op) for o in ADMIN_OPS):
            raise InvalidValue(f"--scopes: {s!r} grants no admin operation; expected admin:OP "
                               f"with OP (a glob) one of {', '.join(sorted(ADMIN_OPS))}")
    return scopes




def _row(k: KeyRecord) -> dict[str, object]:
    return {"id": k.id, "tenant": k.tenant, "scopes": list(k.scopes), "rpm": k.rpm,
            "tpm": k.tpm, "max_streams": k.max_streams, "created": k.created,
            "expires": k.expires, "state": k.state(time.time())}


def _table(rows: list[dict[str, object]]) -> None:
    print(f"{'ID':<14}{'TENANT':<16}{'STATE':<9}{'LIMITS':<28}SCOPES")
    for r in rows:
        print(f"{r['id']!s:<14}{r['tenant']!s:<16}{r['state']!s:<9}{_limits(r):<28}"
              f"{','.join(r['scopes'])}")  # type: ignore[arg-type]
