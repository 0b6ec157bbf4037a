"""The `edgefn` argument parser. Building it imports nothing but the standard
library's argparse: each command names its handler as ``"module:function"``, and
`main` imports the module only when that command runs, so ``edgefn --help`` stays
fast. Every option's help shows its default, every command's help one example."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from typing import Any

DEFAULT_DATA = os.environ.get("EDGEFN_DATA") or ".edgefn"  # set but empty: the default
DATA_HELP = f"the PoP's data dir, $EDGEFN_DATA if set (default: {DEFAULT_DATA})"
JSON_HELP = ("print JSON; on failure print {\"error\": {\"code\", \"message\"}} on stderr "
             "and exit 1")
DESCRIPTION = """Run and deploy edge functions.

Errors are one line on stderr and exit status 1 (2 for a bad command line).
With --json, an error is a JSON object on stderr: {"error": {"code": ..., "message": ...}}.
Run `edgefn COMMAND --help` for a command's options and an example."""


class UsageError(Exception):
    """A command line the parser rejects; `str(err)` reads ``PROG: PROBLEM``."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(f"{prog}: {message}")
        self.prog = prog


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps descriptions and examples as written; appends each option's default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return option_help(action)


def option_help(action: argparse.Action) -> str:
    """`action`'s help, with ``(default: ...)`` appended unless it already says its
    default or has none to say (a flag, a required option, a plain positional)."""
    text = action.help or ""
    if "default" in text or action.required or action.nargs == 0:
        return text
    if action.default in (None, argparse.SUPPRESS):
        return text
    if not action.option_strings and action.nargs != "?":
        return text
    return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises `UsageError` instead of printing usage and
    exiting, so `main` reports it in one line (or as JSON with --json)."""

    def error(self, message: str) -> Any:
        raise UsageError(self.prog, message)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """As argparse's, but an option the command does not take is reported by that
        command (``edgefn kv get``), whose --help lists what it takes: argparse
        reports it at the top (`edgefn --help` lists no option of `kv get`)."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            raise UsageError(getattr(parsed, "prog_", self.prog),
                             f"unrecognized arguments: {' '.join(extra)}")
        return parsed


class _Data(argparse.Action):
    """``--data``, remembering that it was given (`data_given`): given, it overrides a
    --config file's ``data`` even when it names the default folder."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.data_given = True


class _Version(argparse.Action):
    """--version: looked up only when asked for (importlib.metadata is slow to import)."""

    def __init__(self, option_strings: list[str], dest: str, **kw: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                         nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"edgefn {version()}")
        parser.exit()


def version() -> str:
    """The installed package's version, or the checkout's (runtime.__version__)."""
    from importlib import metadata

    try:
        return metadata.version("edgefn")
    except metadata.PackageNotFoundError:
        from runtime import __version__

        return __version__


def json_value(what: str, kind: type) -> Callable[[str], Any]:
    """An argparse `type` that parses JSON and checks it is a `kind` (list or dict);
    raises ArgumentTypeError naming `what` was expected."""

    def parse(text: str) -> Any:
        import json

        try:  # NaN, Infinity: no JSON (they came back unreadable)
            value = json.loads(text, parse_constant=no_json_constant)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r} ({e})") from None
        if not isinstance(value, kind) or (isinstance(value, list) and not _numbers(value)):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


def positive_int(text: str) -> int:
    """An argparse `type` for a count that must be 1 or more (a limit of 0 or -5
    would refuse every request with a retry hint that is never true)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _up_to(most: int) -> Callable[[str], int]:
    """An argparse `type`: a whole number from 1 to `most` (a bad one is exit
    status 2 with the flag named, as any other bad flag value)."""
    def parse(text: str) -> int:
        value = positive_int(text)
        if value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most}, got {value}")
        return value

    return parse


def _expiry(text: str) -> float:
    """An argparse `type`: `--expires` as the Unix time it names (a bad one is exit
    status 2 with the flag named; it was 1, found after parsing)."""
    from runtime.cli.expiry import expires_at

    try:
        return expires_at(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _function_name(text: str) -> str:
    """An argparse `type`: a function's name as a manifest gives it (`a/../b` was sent,
    and answered with the HTTP front's message about paths)."""
    from runtime.functions.manifest import NAME_PATTERN

    if re.match(NAME_PATTERN, text) is None:
        raise argparse.ArgumentTypeError(f"expected a function name (lower-case letters, "
                                         f"digits, _ and -, at most 63), got {text!r}")
    return text


def _since(text: str) -> str:
    """An argparse `type`: seconds or a duration (90, 10m, 2h, 1d), as the PoP reads it."""
    from edgefn_core.errors import InvalidConfig
    from runtime.observe.ring import since_seconds

    try:
        since_seconds(text)
    except InvalidConfig as e:
        raise argparse.ArgumentTypeError(e.reason) from None
    return text


def _percent(text: str) -> float:
    """An argparse `type`: a share strictly between 0 and 100, with or without %."""
    from edgefn_core.errors import InvalidConfig
    from runtime.functions.canary import parse_percent

    try:
        return parse_percent(text)
    except InvalidConfig as e:
        raise argparse.ArgumentTypeError(e.reason) from None


def _status(text: str) -> str:
    """An argparse `type`: a status (404) or a class (5xx)."""
    if re.fullmatch(r"[1-5][0-9][0-9]|[1-5]xx", text) is None:
        raise argparse.ArgumentTypeError(f"expected a status (404) or a class (5xx), "
                                         f"got {text!r}")
    return text


def _numbers(values: list[Any]) -> bool:
    """Finite numbers only: Python's json reads NaN and 1e999 (inf), which the PoP's
    JSON then refuses as malformed."""
    import math

    return all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
               for v in values)


VECTOR = json_value("a JSON list of finite numbers such as [0.1, 0.2]", list)
OBJECT = json_value('a JSON object such as {"lang": "en"}', dict)


def build() -> Parser:
    """The whole `edgefn` parser; ``args.handler`` names the command's function."""
    p = Parser(prog="edgefn", description=DESCRIPTION, formatter_class=Formatter,
               epilog="example:\n  edgefn dev functions/")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="log more: -v INFO from everything, -vv DEBUG (default: warnings, "
                        "and function logs)")
    p.add_argument("--version", action=_Version)
    sub = p.add_subparsers(required=True, metavar="COMMAND", title="commands",
                           parser_class=Parser)
    commands = Commands(sub)
    for add in (_serve_commands, _function_commands, _kv_command, _vectors_command,
                _ai_commands, _keys_command, _limits_command, _cache_command,
                _events_commands, _metrics_command, _dashboard_command, _doctor_command,
                _topology_command):
        add(commands)
    return p


class Commands:
    """Adds commands with the options all of them share (--data, -v, an example)."""

    def __init__(self, sub: Any) -> None:
        self.sub = sub

    def add(self, name: str, handler: str, help: str, example: str, *,
            json: bool = False, data: bool = True, logs: bool = True) -> Parser:
        s: Parser = self.sub.add_parser(name, help=help, description=help,
                                        formatter_class=Formatter,
                                        epilog=f"example:\n  {example}")
        s.set_defaults(handler=handler, json=False, logs=logs, prog_=s.prog)
        if logs:
            s.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                           help="log more: -v INFO, -vv DEBUG (default: warnings, and "
                                "function logs)")
        if data:
            s.add_argument("--data", type=_folder, default=DEFAULT_DATA, action=_Data,
                           help=DATA_HELP)
            s.set_defaults(data_given=False)
        if json:
            s.add_argument("--json", action="store_true", help=JSON_HELP)
        return s

    def ops(self, parent: Parser) -> Any:
        """The operations of `parent` (kv, vectors, lora), listed in its help."""
        return parent.add_subparsers(dest="op", required=True, metavar="OP",
                                     title="operations", parser_class=Parser)

    @staticmethod
    def op(ops: Any, name: str, help: str, example: str, json: bool = True) -> Parser:
        """One operation; --data and --json may also come after it."""
        o: Parser = ops.add_parser(name, help=help, description=help,
                                   formatter_class=Formatter, epilog=f"example:\n  {example}")
        o.set_defaults(prog_=o.prog)
        o.add_argument("--data", type=_folder, default=argparse.SUPPRESS, action=_Data,
                       help=DATA_HELP)
        if json:
            o.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                           help=JSON_HELP)
        return o


def _serve_commands(c: Commands) -> None:
    s = c.add("serve", "runtime.cli.start:serve_command", "run a PoP in the foreground",
              "edgefn serve --port 8080 --no-ai")
    _pop_options(s)
    s = c.add("dev", "runtime.cli.start:dev_command",
              "run a PoP, deploy every function under DIR and redeploy one when its files "
              "change", "edgefn dev functions/ --no-ai")
    s.add_argument("dir", nargs="?", default="functions", help="folder of function folders")
    _pop_options(s)


def _doctor_command(c: Commands) -> None:
    c.add("doctor", "runtime.cli.doctor:doctor", "list the layers of the Python sandbox and "
          "whether this machine enforces each", "edgefn doctor --json", json=True, data=False)


def _pop_options(s: Parser) -> None:
    s.add_argument("--config", help="PoP config (pop.toml); flags override it "
                                    "(default: none, built-in settings)")
    s.add_argument("--host", help="public listener address (default: 127.0.0.1)")
    s.add_argument("--port", type=int, help="public listener port (default: 8080)")
    s.add_argument("--admin-port", type=int,
                   help="loopback admin API port (default: 0, any free port)")
    s.add_argument("--no-ai", action="store_true",
                   help="do not run the model worker (no OpenAI API, no ai binding)")
    s.add_argument("--ai-config", help="model worker config (TOML) (default: the packaged "
                                       "SmolLM2 and MiniLM models)")
    s.add_argument("--ai-socket", help="use a model worker already listening on this Unix "
                                       "socket (default: start one)")
    s.add_argument("--insecure-python", action="store_true",
                   help="run Python functions even where a layer of their sandbox is missing "
                        "on this machine (see `edgefn doctor`)")


def _function_commands(c: Commands) -> None:
    mod = "runtime.cli.commands"
    s = c.add("deploy", "runtime.cli.rollout:deploy", "deploy a function folder to the running "
              "PoP, or stage it on every PoP of a topology and then switch them all",
              "edgefn deploy functions/examples/hello-wat --topology run/ --canary 10%", json=True)
    s.add_argument("dir", help="the function's folder (holds edgefn.toml)")
    s.add_argument("--canary", metavar="PERCENT", type=_percent,
                   help="run it beside the live version for this share of request keys, such "
                   "as 10%% (default: it replaces the live version)")
    _topology_option(s)
    c.add("ls", f"{mod}:ls", "list deployed functions", "edgefn ls --json", json=True)
    s = c.add("versions", "runtime.cli.rollout:versions", "list a function's versions (* marks "
              "the current one, ~ a canary, ! a current one that does not load), or with "
              "--topology what every PoP serves and where it drifts",
              "edgefn versions hello", json=True)
    s.add_argument("name", nargs="?", type=_function_name,
                   help="the function (optional with --topology)")
    _topology_option(s)
    s = c.add("rollback", "runtime.cli.rollout:rollback", "serve another version of a "
              "function; during a canary, drop the canary", "edgefn rollback hello 3f2a",
              json=True)
    s.add_argument("name", type=_function_name)
    s.add_argument("version", nargs="?", help="a version or a unique prefix of one "
                                              "(default: the previous version)")
    s.add_argument("--to", help="the same as VERSION (default: the previous version)")
    _topology_option(s)
    s = c.add("promote", "runtime.cli.rollout:promote", "make a function's canary its live "
              "version", "edgefn promote hello --topology run/", json=True)
    s.add_argument("name", type=_function_name)
    _topology_option(s)
    s = c.add("delete", f"{mod}:delete", "stop serving a function and delete its versions",
              "edgefn delete hello", json=True)
    s.add_argument("name", type=_function_name)


def _topology_option(s: Parser) -> None:
    s.add_argument("--topology", metavar="RUN_DIR", help="act on every PoP of the topology "
                   "running in RUN_DIR, consistently (default: the one PoP on --data)")


def _kv_command(c: Commands) -> None:
    kv = c.add("kv", "runtime.cli.store:kv_command",
               "read and write KV namespaces (through the PoP if one runs on the data dir)",
               "edgefn kv put docs greeting hello")
    ops = c.ops(kv)
    o = c.op(ops, "get", "print a key's value (raw bytes; JSON with --json)",
             "edgefn kv get docs greeting")
    _ns_key(o)
    o = c.op(ops, "put", "write a key, creating the namespace if needed",
             "edgefn kv put docs greeting hello --ttl 3600")
    _ns_key(o)
    o.add_argument("value", help="the value, or - to read stdin")
    o.add_argument("--ttl", type=_seconds, help="seconds until it expires (default: never)")
    o.add_argument("--metadata", type=OBJECT, help="a JSON object (default: none)")
    o = c.op(ops, "delete", "delete a key; prints whether it existed",
             "edgefn kv delete docs greeting")
    _ns_key(o)
    o = c.op(ops, "increment", "add 1 to an integer key and print it",
             "edgefn kv increment stats hits")
    _ns_key(o)
    o = c.op(ops, "list", "list keys in order", "edgefn kv list docs --prefix user:")
    o.add_argument("namespace")
    o.add_argument("--prefix", default="", help="only keys starting with it (default: all)")
    o.add_argument("--limit", type=_up_to(1000), default=100,
                   help="at most this many keys (1-1000)")
    o.add_argument("--cursor", help="continue a listing (default: from the first key)")


def _keys_command(c: Commands) -> None:
    keys = c.add("keys", "runtime.cli.keys:keys_command",
                 "create, list and revoke API keys (stored hashed in DATA/keys.json)",
                 "edgefn keys create --tenant acme --scopes 'fn:*,model:*' --tpm 20000")
    ops = c.ops(keys)
    o = c.op(ops, "create", "create a key and print it (shown once, never stored)",
             "edgefn keys create --tenant acme --scopes 'fn:chat,model:*' --rpm 60 "
             "--expires 30d")
    o.add_argument("--tenant", required=True, help="who the key acts for (owns functions "
                                                   "and stores)")
    o.add_argument("--scopes", required=True,
                   help="comma-separated: '*', fn:NAME, route:/PATH*, model:NAME, admin:OP "
                        "(globs allowed)")
    for flag, what in (("--rpm", "requests per minute"), ("--tpm", "AI tokens per minute"),
                       ("--max-streams", "AI streams at once")):
        o.add_argument(flag, type=positive_int, help=f"{what} for this key (default: "
                                                     "unlimited)")
    o.add_argument("--expires", type=_expiry,
                   help="when it stops working: a duration (90m, 12h, 30d) or an ISO 8601 "
                        "time (default: never)")
    c.op(ops, "ls", "list keys: id, tenant, scopes, limits, state (never the key)",
         "edgefn keys ls --json")
    o = c.op(ops, "revoke", "revoke a key at once (it stays listed)", "edgefn keys revoke "
             "1a2b3c4d5e6f")
    o.add_argument("id", help="the key's id (the part after efn_, as `keys ls` shows it)")


def _cache_command(c: Commands) -> None:
    cache = c.add("cache", "runtime.cli.cache:cache_command",
                  "purge the HTTP or AI cache of a running PoP, or show what its caches "
                  "decided",
                  "edgefn cache purge --tag products")
    ops = c.ops(cache)
    o = c.op(ops, "purge", "drop cached responses: one URL, a path prefix, a Cache-Tag or "
             "a function (all versions); or, with --ai, model calls' answers",
             "edgefn cache purge --ai --model smollm2-135m --topology .topology")
    one = o.add_mutually_exclusive_group(required=True)
    for flag, what in (("--key", "a URL: http://host/path?query, or /path?query on any host"),
                       ("--prefix", "a path prefix such as /shop/"),
                       ("--tag", "a Cache-Tag the function's responses carry"),
                       ("--function", "a function's name (all its versions)")):
        one.add_argument(flag, help=f"{what} (default: none; give exactly one of the five)")
    one.add_argument("--ai", action="store_true",
                     help="the AI cache (exact and semantic) instead: every entry, or those "
                          "of --model and/or --tenant (default: off)")
    o.add_argument("--model", help="with --ai: only this model's entries (a LoRA adapter is "
                   "its own model) (default: every model)")
    o.add_argument("--tenant", help="with --ai: only this tenant's entries; '' is anonymous "
                   "callers (default: every tenant)")
    o.add_argument("--topology", metavar="RUN_DIR",
                   help="purge on every PoP of the topology running in RUN_DIR (`edgefn "
                        "topology up --dir`), central and regionals before edges, instead "
                        "of the one at --data (default: none)")
    c.op(ops, "stats", "hit rates per cache, function, model and tenant",
         "edgefn cache stats --json")


def _topology_command(c: Commands) -> None:
    t = c.add("topology", "runtime.cli.topology:topology_command",
              "run an emulated network of edge, regional and central PoPs on this machine",
              "edgefn topology up functions/examples/topology.toml --dir .topology", data=False)
    ops = c.ops(t)
    dir_help = "the run's folder: topology.json, network.json, pops/NAME/ (default: .topology)"
    up = c.op(ops, "up", "start every PoP and link of a topology file and wait until all "
              "are ready", "edgefn topology up topology.toml")
    up.set_defaults(json=False)
    up.add_argument("file", nargs="?", default="functions/examples/topology.toml",
                    help="the topology (default: functions/examples/topology.toml)")
    up.add_argument("--timeout", type=float, default=180.0,
                    help="seconds to wait for every PoP's /readyz (default: 180)")
    for name, help, json in (("status", "each PoP's tier, geography, pid, health and address",
                              True),
                             ("down", "stop every PoP, link and Redis of the run", True)):
        o = c.op(ops, name, help, f"edgefn topology {name}", json=json)
        o.set_defaults(json=False)
    restart = c.op(ops, "restart", "start one PoP of the run again (after a kill -9, say), "
                   "stopping it first if it runs; it comes back with what it served",
                   "edgefn topology restart us-east")
    restart.add_argument("pop", help="the PoP's name (`edgefn topology status` lists them)")
    restart.add_argument("--timeout", type=float, default=120.0,
                         help="seconds to wait for its /readyz (default: 120)")
    restart.set_defaults(json=False)
    load = c.op(ops, "load", "send requests as clients of one geography do (through its "
                "edge, or the nearest healthy one) and print latency and failures",
                "edgefn topology load --geo eu-west -n 100 --path /hello")
    load.add_argument("--geo", required=True, help="the clients' geography (an edge's geo)")
    load.add_argument("-n", type=positive_int, default=100, help="requests, one after another "
                                                        "(default: 100)")
    load.add_argument("--path", default="/hello", help="GET this path (default: /hello)")
    load.add_argument("--central", action="store_true",
                      help="go straight to central over the long-haul link, as clients of a "
                           "centralized service do (default: enter at the edge)")
    load.set_defaults(json=False)
    for o in ops.choices.values():
        o.add_argument("--dir", default=".topology", help=dir_help)


def _events_commands(c: Commands) -> None:
    t = c.add("tail", "runtime.cli.events:tail_command",
              "follow a running PoP's requests live, one line each (Ctrl-C stops)",
              "edgefn tail --function hello --status 5xx", json=True)
    _event_filters(t)
    e = c.add("events", "runtime.cli.events:events_command",
              "the recent requests a running PoP kept in its events ring",
              "edgefn events --since 10m --status 5xx", json=True)
    e.add_argument("--since", type=_since, default="10m",
                   help="how far back: seconds or a duration (90, 10m, 2h, 1d)")
    e.add_argument("--limit", type=positive_int, default=100,
                   help="at most this many (the newest)")
    _event_filters(e)


def _event_filters(s: Parser) -> None:
    s.add_argument("--function", help="only this function, name or name@version (a "
                   "version's first characters do) (default: all)")
    s.add_argument("--status", type=_status,
                   help="only this status (404) or class (5xx) (default: all)")
    s.add_argument("--tenant", help="only requests of this tenant (default: all)")
    s.add_argument("--path", help="only paths starting with this prefix (default: all)")


def _metrics_command(c: Commands) -> None:
    s = c.add("metrics", "runtime.cli.metrics:metrics_command",
              "print a running PoP's Prometheus metrics (what GET /metrics serves)",
              "edgefn metrics --match edgefn_requests")
    s.add_argument("--match", metavar="PREFIX", default=None,
                   help="only the metrics whose name starts with PREFIX (default: all)")


def _dashboard_command(c: Commands) -> None:
    s = c.add("dashboard", "runtime.cli.dashboard:dashboard_command",
              "print the URL of a running PoP's live dashboard, with a one-time login "
              "token (valid 60 s, for one browser)", "edgefn dashboard --open", json=True)
    s.add_argument("--open", action="store_true", help="also open it in the default browser")


def _limits_command(c: Commands) -> None:
    s = c.add("limits", "runtime.cli.keys:limits_command",
              "show the rate limits and token budgets a PoP config and its keys set",
              "edgefn limits show --config pop.toml", json=True)
    s.add_argument("what", choices=["show"], help="show")
    s.add_argument("--config", help="PoP config (pop.toml) (default: built-in settings)")


def _ns_key(o: Parser) -> None:
    o.add_argument("namespace")
    o.add_argument("key")


def _vectors_command(c: Commands) -> None:
    vec = c.add("vectors", "runtime.cli.store:vectors_command",
                "create, fill and query vector indexes (prints JSON)",
                "edgefn vectors query emb --vector '[0.1, 0.2, 0.3]' -k 5")
    ops = c.ops(vec)
    o = c.op(ops, "create", "create an index", "edgefn vectors create emb --dim 384")
    o.add_argument("index")
    o.add_argument("--dim", type=int, required=True, help="number of dimensions")
    o.add_argument("--metric", default="cos", choices=["cos", "ip", "l2"], help="distance")
    o.add_argument("--dtype", choices=["f32", "f16", "i8"],
                   help="how the index holds vectors; LMDB keeps them as f32 (default: "
                        "kv.vectors.IndexConfig's)")
    o.add_argument("--connectivity", type=int,
                   help="HNSW graph links per node (default: kv.vectors.IndexConfig's)")
    o.add_argument("--expansion-add", type=int,
                   help="candidates considered per insert (default: IndexConfig's)")
    o.add_argument("--expansion-search", type=int,
                   help="candidates considered per query: recall against speed "
                        "(default: IndexConfig's)")
    o = c.op(ops, "upsert", "add or replace one vector",
             "edgefn vectors upsert emb doc1 --vector '[1, 0, 0]' --metadata '{\"lang\": \"en\"}'")
    o.add_argument("index")
    o.add_argument("id")
    o.add_argument("--vector", type=VECTOR, required=True, help="a JSON list of numbers")
    o.add_argument("--metadata", type=OBJECT, help="a JSON object (default: none)")
    o = c.op(ops, "query", "the k nearest vectors",
             "edgefn vectors query emb --vector '[1, 0, 0]' -k 3 --filter '{\"lang\": \"en\"}'")
    o.add_argument("index")
    o.add_argument("--vector", type=VECTOR, required=True, help="a JSON list of numbers")
    o.add_argument("-k", type=int, default=10, help="how many results")
    o.add_argument("--filter", type=OBJECT,
                   help='metadata equality, as JSON: {"lang": "en"} (default: none)')
    o = c.op(ops, "import", "upsert JSONL lines {id, vector, metadata} or a .npy matrix",
             "edgefn vectors import emb vectors.jsonl")
    o.add_argument("index")
    o.add_argument("file")
    o = c.op(ops, "stats", "count, dimensions and settings of an index",
             "edgefn vectors stats emb")
    o.add_argument("index")


def _ai_commands(c: Commands) -> None:
    s = c.add("gpu-worker", "runtime.cli.commands:gpu_worker",
              "run the model worker alone on a Unix socket",
              "edgefn gpu-worker --socket /tmp/edgefn-ai.sock", data=False,
              logs=False)  # the worker configures its own logging (--log-level)
    s.add_argument("--socket", required=True, help="Unix socket path to listen on")
    s.add_argument("--config", help="worker config (TOML) (default: the packaged models)")
    s.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                   help="how much the worker logs")
    lora = c.add("lora", "runtime.cli.commands:lora",
                 "manage LoRA adapters of the running PoP's model worker",
                 "edgefn lora add my-style adapter.gguf")
    _lora_ops(c, c.ops(lora))
    s = c.add("ai", "runtime.cli.commands:ai", "model worker status (prints JSON)",
              "edgefn ai models")
    s.add_argument("what", choices=["models", "metrics"], help="models or metrics")


def _lora_ops(c: Commands, ops: Any) -> None:
    add = c.op(ops, "add", "load a GGUF LoRA adapter, served as model NAME",
               "edgefn lora add my-style ./adapter.gguf --scale 0.8")
    add.add_argument("name")
    add.add_argument("path")
    add.add_argument("--base", help="base model (default: the first llama.cpp model)")
    add.add_argument("--scale", type=_scale, default=1.0, help="adapter strength (0 < s <= 100)")
    c.op(ops, "ls", "list models and adapters", "edgefn lora ls")
    rm = c.op(ops, "rm", "unload an adapter", "edgefn lora rm my-style")
    rm.add_argument("name")


def no_json_constant(name: str) -> Any:
    """`json.loads`'s `parse_constant`: NaN and Infinity are no JSON. Raises ValueError."""
    raise ValueError(f"{name} is not a JSON number")


def _above_zero(what: str, at_most: float | None = None) -> Callable[[str], float]:
    """An argparse `type`: `what` (``a number``), a number above 0 (and at most
    `at_most`); nan and inf, which are no JSON, fail it."""
    limit = f" and at most {at_most:g}" if at_most is not None else ""
    top = at_most if at_most is not None else sys.float_info.max

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not 0 < value <= top:  # nan fails it too
            raise argparse.ArgumentTypeError(f"expected {what} above 0{limit}, got {text!r}")
        return value

    return parse


_scale = _above_zero("a number", 100)  # a LoRA adapter's strength
_seconds = _above_zero("a number of seconds")  # a time to live


def _folder(text: str) -> str:
    """A data dir: not empty (it made the current directory the data dir)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a folder, got an empty string")
    return text

