"""The commands that talk to a running PoP's admin API (deploy, ls, versions,
rollback, delete, lora, ai) and `edgefn gpu-worker`. Each raises `EdgefnError`
(an `AdminError` for the PoP's refusal) for `main` to report."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from edgefn_core.errors import Failure, NotFound


def _client(args: argparse.Namespace) -> Any:
    """Raises `EdgefnError` if no PoP runs on ``args.data``."""
    from runtime.admin.client import AdminClient

    return AdminClient(args.data)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2))


def _routes(routes: list[dict[str, Any]]) -> str:
    return ", ".join((r.get("host") or "") + r["path"] for r in routes)


def deploy(args: argparse.Namespace) -> None:
    r = _client(args).deploy(args.dir)
    if args.json:
        return _print_json(r)
    state = "deployed" if r["changed"] else "unchanged"
    print(f"{state} {r['name']} version {r['version']} ({r['abi']}, {r['took_ms']} ms) "
          f"routes: {_routes(r['routes'])}")


def ls(args: argparse.Namespace) -> None:
    fns = _client(args).request("GET", "/v1/functions")["functions"]
    if args.json:
        return _print_json(fns)
    print(f"{'NAME':<20} {'VERSION':<17} {'ABI':<8} ROUTES")
    for f in fns:
        canary = f.get("canary")  # (`ls --json` had it; the table did not say)
        beside = f"  (canary {canary['version']} at {canary['percent']:g}%)" if canary else ""
        print(f"{f['name']:<20} {f['version']:<17} {f['abi']:<8} {_routes(f['routes'])}{beside}")


def versions(args: argparse.Namespace) -> None:
    rec = _client(args).request("GET", f"/v1/functions/{quote(args.name, safe='')}/versions")
    if args.json:
        return _print_json(rec)
    canary = rec.get("canary") or {}
    unserved = rec.get("serving", rec["current"]) != rec["current"]
    for v in reversed(rec["versions"]):
        is_canary = v["version"] == canary.get("version")
        current = v["version"] == rec["current"]
        mark = ("!" if unserved else "*") if current else "~" if is_canary else " "
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v["created_at"]))
        share = f"  (canary, {canary['percent']:g}% of requests)" if is_canary else ""
        if current and unserved:  # * said it served while the PoP answered 404
            share += "  (recorded as current, not serving: see the PoP's log)"
        print(f"{mark} {v['version']}  {when}  {v.get('source', '')}{share}")


def rollback(args: argparse.Namespace) -> None:
    client = _client(args)
    body = {}
    if args.version is not None:
        rec = client.request("GET", f"/v1/functions/{quote(args.name, safe='')}/versions")
        known = [v["version"] for v in rec["versions"]]
        body["version"] = resolve_version(args.name, args.version, known)
    r = client.request("POST", f"/v1/functions/{quote(args.name, safe='')}/rollback",
                       json.dumps(body).encode())
    if args.json:
        return _print_json(r)
    print(f"{r['name']} now serves version {r['version']}")


def resolve_version(name: str, prefix: str, known: list[str], options: str = "") -> str:
    """The one version in `known` that is `prefix` or starts with it, as git
    resolves a short commit id (versions are lower-case hex: ``7F`` is ``7f``). Raises
    `NotFound` if none does (an empty `prefix` names none; it points at `edgefn
    versions NAME` with `options`), `Failure` (code ``ambiguous_version``) listing the
    candidates if several do."""
    prefix = prefix.lower()
    if prefix in known:
        return prefix
    matches = [v for v in known if v.startswith(prefix)] if prefix else []
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise NotFound(f"function {name!r} has no version {prefix!r} "
                       f"(see `edgefn versions {name}{options}`)")
    raise Failure("ambiguous_version", 400, f"version prefix {prefix!r} of {name!r} is "
                  f"ambiguous: it matches {', '.join(sorted(matches))}")


def delete(args: argparse.Namespace) -> None:
    _client(args).request("DELETE", f"/v1/functions/{quote(args.name, safe='')}")
    if args.json:
        return _print_json({"deleted": args.name})
    print(f"deleted {args.name}")


def lora(args: argparse.Namespace) -> None:
    """`lora add`, `lora ls` and `lora rm` (``DELETE /v1/ai/loras/NAME``)."""
    {"add": _lora_add, "ls": _lora_ls, "rm": _lora_rm}[args.op](args, _client(args))


def _lora_add(args: argparse.Namespace, client: Any) -> None:
    body = {"name": args.name, "path": str(Path(args.path).resolve()), "base": args.base,
            "scale": args.scale}
    info = client.request("POST", "/v1/ai/loras", json.dumps(body).encode())
    if args.json:
        return _print_json(info)
    print(f"added {info['id']} (parent {info.get('parent')}, {info['details']['path']})")


def _lora_ls(args: argparse.Namespace, client: Any) -> None:
    models = client.request("GET", "/v1/ai/models")["models"]
    if args.json:
        return _print_json(models)
    for m in models:
        parent = f"  (LoRA on {m['parent']})" if m.get("parent") else ""
        print(f"{m['id']:<24} {m['kind']:<6} {m['engine']}{parent}")


def _lora_rm(args: argparse.Namespace, client: Any) -> None:
    client.request("DELETE", f"/v1/ai/loras/{quote(args.name, safe='')}")
    if args.json:
        return _print_json({"removed": args.name})
    print(f"removed {args.name}")


def ai(args: argparse.Namespace) -> None:
    _print_json(_client(args).request("GET", f"/v1/ai/{args.what}"))


def gpu_worker(args: argparse.Namespace) -> int:
    """Run the worker's own entry point with the options parsed here."""
    from gpu_worker.__main__ import main as worker_main

    argv = ["--socket", args.socket, "--log-level", args.log_level]
    return worker_main(argv + (["--config", args.config] if args.config else []))
