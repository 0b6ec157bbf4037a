"""One function over HTTP, served by this checkout and by another one (a worktree of
the commit before), in the same run: req/s and the PoP's CPU per request of each,
and this checkout's ratios to the other.

    python bench/bench_tree_http.py --tree ../before [--function functions/examples/hello-wat]
                                    [--path /hello] [--config pop.toml]
                                    [--other-config before.toml] [--key]
                                    [--header 'X-Request-Id: r1'] [--client wrk|ab|split]
                                    [--refused] [--seconds 4] [--rounds 5]

Both PoPs (`edgefn serve --no-ai`, the function deployed from each checkout's own
folder; `--config`: both serve with that PoP config, e.g. a pipeline of one's own;
`--other-config`: the other checkout serves with this one instead, for a setting
the other does not know, or the same checkout given twice as two settings;
`--key`: an API key made in each one's data dir first, `edgefn keys create`, as a PoP
guarding its OpenAI API has, so that auth is kept for every function; `--header`: a
header every request sends, as a proxy's request id; `--client ab`: loaded by
ApacheBench kept alive, `ab -k -c32`, HTTP/1.0; `--client ab-close`: plain `ab -c32`,
a connection a request; `--client split`: POSTs of a JSON
body whose head and body are sent apart, as httpx sends them: bench/_split_post.py;
`--refused`: the answers are a full rate limit's 429s, a flood of refused requests,
`--config` setting the limit, e.g. `rules = [{ by = "ip", limit = "1/minute" }]`)
are loaded in
turns, round by round (`_wrk.rounds`: wrk -t1 -c32, each
warmed first), so the machine's load hits both alike; each round's ratio is taken
within the round, and the medians of those are printed. CPU per request (from /proc)
moves less than req/s on a noisy machine. Needs wrk.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import _wrk  # noqa: E402
from bench_runtime import start_edgefn  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", type=Path, required=True, help="the other checkout")
    p.add_argument("--function", default="functions/examples/hello-wat",
                   help="a function folder, relative to each checkout")
    p.add_argument("--path", default="/hello")
    p.add_argument("--config", type=Path, help="a PoP config (pop.toml) both serve with")
    p.add_argument("--other-config", type=Path,
                   help="the config the other checkout serves with (default: --config)")
    p.add_argument("--key", action="store_true", help="an API key made in each data dir")
    p.add_argument("--header", action="append", default=[],
                   help="'Name: value', sent with every request (repeatable)")
    p.add_argument("--client", choices=("wrk", "ab", "ab-close", "split"), default="wrk",
                   help="the load generator: wrk -t1 -c32, ab -k -c32 (HTTP/1.0), ab-close "
                        "(ab -c32 without -k: a connection a request), or split (POSTs whose "
                        "head and body are sent apart, as httpx sends them)")
    p.add_argument("--connections", type=int, default=32,
                   help="connections the load generator keeps (-c)")
    p.add_argument("--refused", action="store_true",
                   help="the answers are refusals (a full rate limit's 429s, --config's): "
                        "not errors (wrk only)")
    p.add_argument("--seconds", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    if args.refused and args.client != "wrk":
        p.error("--refused counts wrk's non-2xx answers: --client wrk")
    headers = dict(h.split(":", 1) for h in args.header)
    headers = {k.strip(): v.strip() for k, v in headers.items()}
    trees = {"other": args.tree.resolve(), "this": ROOT}
    with tempfile.TemporaryDirectory(prefix="edgefn-bench-tree-") as tmp:
        servers: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
        try:
            for name, tree in trees.items():
                conf = args.other_config if name == "other" and args.other_config else \
                    args.config
                extra = ["--no-ai"] + (["--config", str(conf.resolve())]
                                       if conf is not None else [])
                if args.key:
                    subprocess.run([sys.executable, "-m", "runtime.cli", "keys", "create",
                                    "--data", str(Path(tmp) / name), "--tenant", "bench",
                                    "--scopes", "*"], cwd=tree, check=True,
                                   capture_output=True, env={**os.environ,
                                                             "PYTHONPATH": str(tree)})
                servers[name] = start_edgefn(Path(tmp) / name, extra, tree,
                                             tree / args.function)
            runs = _wrk.rounds({name: (proc.pid, f"http://127.0.0.1:{port}{args.path}")
                                for name, (proc, port) in servers.items()},
                               args.seconds, args.rounds, headers, args.client,
                               args.connections, args.refused)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(20)
    config = (f", --config {args.config}" if args.config is not None else "") + \
        (f", --other-config {args.other_config}" if args.other_config is not None else "") + \
        (", --key" if args.key else "") + (", --refused" if args.refused else "") + \
        "".join(f", --header '{h}'" for h in args.header)
    c = args.connections
    load = {"ab": f"ab -k -c{c}", "ab-close": f"ab -c{c} (no keep-alive)",
            "split": f"POSTs with the head and body sent apart, -c{c}"
            }.get(args.client, f"wrk -t1 -c{c}")
    print(f"\n== {args.function} {args.path}{config}, {load}, {args.seconds} s each, "
          f"{args.rounds} rounds ==")
    for name, tree in trees.items():
        print(f"{name} ({tree}): req/s " + " ".join(f"{r[name]['rps']:.0f}" for r in runs)
              + "; PoP us/request " + " ".join(f"{r[name]['cpu_us']:.2f}" for r in runs))
    rps = statistics.median(r["this"]["rps"] / r["other"]["rps"] for r in runs)
    cpu = statistics.median(r["this"]["cpu_us"] / r["other"]["cpu_us"] for r in runs)
    print(f"this / other, median of the rounds' ratios: req/s {rps:.3f}x, "
          f"PoP CPU per request {cpu:.3f}x")


if __name__ == "__main__":
    main()
