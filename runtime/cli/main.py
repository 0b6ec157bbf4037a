"""The `edgefn` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from edgefn_core.errors import EdgefnError

DEFAULT_DATA = os.environ.get("EDGEFN_DATA", ".edgefn")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except EdgefnError as e:
        print(f"edgefn: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="edgefn", description="Run and deploy edge functions.")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = p.add_subparsers(required=True, metavar="COMMAND")

    def cmd(name: str, func: Any, help: str) -> argparse.ArgumentParser:
        s = sub.add_parser(name, help=help, description=help)
        s.set_defaults(func=func)
        s.add_argument("--data", default=DEFAULT_DATA,
                       help="data dir (default: $EDGEFN_DATA or .edgefn)")
        return s

    for name, func, help in (("serve", _serve, "run a PoP"),
                             ("dev", _dev, "run a PoP, deploy every function under DIR and "
                                           "redeploy one when its files change")):
        s = cmd(name, func, help)
        if name == "dev":
            s.add_argument("dir", nargs="?", default="functions")
        s.add_argument("--config", help="PoP config (pop.toml); flags override it")
        s.add_argument("--host", help="public listener address (default: 127.0.0.1)")
        s.add_argument("--port", type=int, help="public listener port (default: 8080)")
        s.add_argument("--admin-port", type=int, help="loopback admin port (default: 0, any)")
        s.add_argument("--no-ai", action="store_true",
                       help="do not run the model worker (no OpenAI API, no ai binding)")
        s.add_argument("--ai-config", help="model worker config (TOML); default: the "
                                           "packaged SmolLM2 and MiniLM models")
        s.add_argument("--ai-socket", help="use a model worker already listening on this "
                                           "Unix socket instead of starting one")
    s = cmd("deploy", _deploy, "deploy a function folder to the running PoP")
    s.add_argument("dir")
    s.add_argument("--json", action="store_true")
    s = cmd("ls", _ls, "list deployed functions")
    s.add_argument("--json", action="store_true")
    s = cmd("versions", _versions, "list a function's versions")
    s.add_argument("name")
    s.add_argument("--json", action="store_true")
    s = cmd("rollback", _rollback, "serve an older version (default: the previous one)")
    s.add_argument("name")
    s.add_argument("version", nargs="?")
    s.add_argument("--json", action="store_true")
    s = cmd("delete", _delete, "stop serving a function and delete its versions")
    s.add_argument("name")
    _store_commands(sub, cmd)
    _ai_commands(sub, cmd)
    return p


def _ai_commands(sub: Any, cmd: Any) -> None:
    s = sub.add_parser("gpu-worker", help="run the model worker alone on a Unix socket",
                       add_help=False)
    s.set_defaults(func=_gpu_worker)
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s = cmd("lora", _lora, "manage LoRA adapters of the running PoP's model worker")
    ops = s.add_subparsers(dest="op", required=True)
    add = ops.add_parser("add", help="load a GGUF LoRA adapter, served as model NAME")
    add.add_argument("name")
    add.add_argument("path")
    add.add_argument("--base", help="base model (default: the first llama.cpp model)")
    add.add_argument("--scale", type=float, default=1.0)
    ls = ops.add_parser("ls", help="list models and adapters")
    for o in (add, ls):  # `edgefn lora add ... --data DIR` reads naturally too
        o.add_argument("--data", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    s = cmd("ai", _ai, "model worker status")
    s.add_argument("what", choices=["models", "metrics"])


def _gpu_worker(args: argparse.Namespace) -> int:
    from gpu_worker.__main__ import main as worker_main

    return worker_main(args.rest)


def _lora(args: argparse.Namespace) -> None:
    client = _client(args)
    if args.op == "add":
        body = {"name": args.name, "path": str(Path(args.path).resolve()), "base": args.base,
                "scale": args.scale}
        info = client.request("POST", "/v1/ai/loras", json.dumps(body).encode())
        print(f"added {info['id']} (parent {info.get('parent')}, {info['details']['path']})")
        return
    for m in client.request("GET", "/v1/ai/models")["models"]:
        parent = f"  (LoRA on {m['parent']})" if m.get("parent") else ""
        print(f"{m['id']:<24} {m['kind']:<6} {m['engine']}{parent}")


def _ai(args: argparse.Namespace) -> None:
    data = _client(args).request("GET", f"/v1/ai/{args.what}")
    print(json.dumps(data, indent=2))


def _store_commands(sub: Any, cmd: Any) -> None:
    from runtime.cli.store import kv_command, vectors_command

    def op_parser(ops: Any, name: str, **kw: Any) -> Any:
        o = ops.add_parser(name, **kw)
        # --data may also come after the operation (it defaults on the parent parser)
        o.add_argument("--data", default=argparse.SUPPRESS, help="data dir")
        return o

    kv = cmd("kv", kv_command, "read and write KV namespaces (via the PoP if one runs)")
    kv_ops = kv.add_subparsers(dest="op", required=True, metavar="OP")
    for op in ("get", "put", "delete", "increment", "list"):
        o = op_parser(kv_ops, op)
        o.add_argument("namespace")
        if op != "list":
            o.add_argument("key")
        if op == "put":
            o.add_argument("value", help="the value, or - to read stdin")
            o.add_argument("--ttl", type=float)
            o.add_argument("--metadata", help="a JSON object")
        if op == "list":
            o.add_argument("--prefix", default="")
            o.add_argument("--limit", type=int, default=100)
            o.add_argument("--cursor")
        o.add_argument("--json", action="store_true")
    vec = cmd("vectors", vectors_command, "create, fill and query vector indexes")
    vec_ops = vec.add_subparsers(dest="op", required=True, metavar="OP")
    o = op_parser(vec_ops, "create")
    o.add_argument("index")
    o.add_argument("--dim", type=int, required=True)
    o.add_argument("--metric", default="cos", choices=["cos", "ip", "l2"])
    o.add_argument("--dtype", default="f32", choices=["f32", "f16", "i8"])
    o = op_parser(vec_ops, "upsert")
    o.add_argument("index")
    o.add_argument("id")
    o.add_argument("--vector", required=True, help="a JSON list of numbers")
    o.add_argument("--metadata", help="a JSON object")
    o = op_parser(vec_ops, "query")
    o.add_argument("index")
    o.add_argument("--vector", required=True, help="a JSON list of numbers")
    o.add_argument("-k", type=int, default=10)
    o.add_argument("--filter", help='metadata equality, as JSON: {"lang": "en"}')
    o = op_parser(vec_ops, "import", help="JSONL lines {id, vector, metadata} or a .npy matrix")
    o.add_argument("index")
    o.add_argument("file")
    o = op_parser(vec_ops, "stats")
    o.add_argument("index")


def _client(args: argparse.Namespace) -> Any:
    from runtime.admin.client import AdminClient

    return AdminClient(args.data)


def _print_deploy(r: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(r, indent=2))
        return
    routes = ", ".join((x.get("host") or "") + x["path"] for x in r["routes"])
    state = "deployed" if r["changed"] else "unchanged"
    print(f"{state} {r['name']} version {r['version']} ({r['abi']}, {r['took_ms']} ms) "
          f"routes: {routes}")


def _deploy(args: argparse.Namespace) -> None:
    _print_deploy(_client(args).deploy(args.dir), args.json)


def _ls(args: argparse.Namespace) -> None:
    fns = _client(args).request("GET", "/v1/functions")["functions"]
    if args.json:
        print(json.dumps(fns, indent=2))
        return
    print(f"{'NAME':<20} {'VERSION':<17} {'ABI':<8} ROUTES")
    for f in fns:
        routes = ", ".join((r.get("host") or "") + r["path"] for r in f["routes"])
        print(f"{f['name']:<20} {f['version']:<17} {f['abi']:<8} {routes}")


def _versions(args: argparse.Namespace) -> None:
    rec = _client(args).request("GET", f"/v1/functions/{args.name}/versions")
    if args.json:
        print(json.dumps(rec, indent=2))
        return
    for v in reversed(rec["versions"]):
        mark = "*" if v["version"] == rec["current"] else " "
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(v["created_at"]))
        print(f"{mark} {v['version']}  {when}  {v.get('source', '')}")


def _rollback(args: argparse.Namespace) -> None:
    body = json.dumps({"version": args.version} if args.version else {}).encode()
    r = _client(args).request("POST", f"/v1/functions/{args.name}/rollback", body)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print(f"{r['name']} now serves version {r['version']}")


def _delete(args: argparse.Namespace) -> None:
    _client(args).request("DELETE", f"/v1/functions/{args.name}")
    print(f"deleted {args.name}")


def _serve(args: argparse.Namespace) -> None:
    _run(args, None)


def _dev(args: argparse.Namespace) -> None:
    _run(args, args.dir)


def _run(args: argparse.Namespace, dev_dir: str | None) -> None:
    import uvloop

    from runtime import config
    from runtime.cli.dev import serve

    data = args.data if args.data != DEFAULT_DATA or args.config is None else None
    cfg = config.load(args.config, data=data, **{
        "public.host": args.host, "public.port": args.port, "admin.port": args.admin_port,
        "ai.enabled": False if args.no_ai else None, "ai.worker_config": args.ai_config,
        "ai.socket": args.ai_socket})
    uvloop.run(serve(cfg, dev_dir))


if __name__ == "__main__":
    sys.exit(main())
