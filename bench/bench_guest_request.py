"""An isolate's own Python for one request, piece by piece, without its socket's waits.

    python bench/bench_guest_request.py [--n 100000] [--rounds 5] [--tree OTHER_CHECKOUT]

python-hello's request as the PoP encodes it, through `guest.Session` on a thread of a
fresh process with the checkout's SDK (no subinterpreter, no sandbox), each piece timed
alone over `--n` calls, best of the rounds:

- decode: `Request._decode` (the ABI's decode, the request object, its env);
- handler: python-hello's `handle` on a fresh request (its query read, a `Response`);
- respond: `Session.respond` of that response, its frame sent to a socket read
  between batches of 100 calls (not timed: its room is ~250 small frames);
- arm+disarm: the watchdog around a request (its CPU clock read, its lock);
- one: `Session.one`, all of the above and the frames between.

What a request costs in its isolate beyond this is its socket: a read per batch of
requests sent ahead, a look for a DROP (FIONREAD) before each, the wake-ups. `--tree
DIR`: a second checkout (a worktree of the commit before) measured the same way in
alternating rounds (ABBA: neither always runs first), and this checkout's ratio to it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench")]

import _variants  # noqa: E402

PIECES = ("decode", "handler", "respond", "arm+disarm", "one")

# Run in a fresh interpreter with the tree's own code first on sys.path: prints the
# best microseconds per call of each piece as JSON.
CHILD = r"""
import json, socket, sys, time
tree, n = sys.argv[1], int(sys.argv[2])
sys.path[:0] = [tree, tree + "/functions/sdk/python", tree + "/functions/examples/python-hello"]
import edgefn, main as hello
from edgefn_core.abi import encode_request
from runtime.executors.python import guest

ours, theirs = socket.socketpair()
ours.setblocking(False)
session = guest.Session(theirs, hello.handle, 50, 2000, edgefn)
payload = encode_request(b"GET", b"/py/hello", b"", [(b"host", b"bench"),
                         (b"user-agent", b"wrk/4.2"), (b"accept", b"*/*")], b"", b"")
request, env_vars = edgefn.Request._decode(payload)
env = edgefn.Env(env_vars, session.call, None)
response = hello.handle(request, env)

def drain():
    try:
        while ours.recv(1 << 20):
            pass
    except BlockingIOError:
        pass

def fresh_request():
    hello.handle(edgefn.Request._decode(payload)[0], env)

def decode():
    edgefn.Request._decode(payload)

def arm():
    session.dog.arm()
    session.dog.disarm()

def timed(fn, k):
    # in batches of 100, the socket emptied between them (not timed): a frame sent
    # into a full socket would wait
    best = float("inf")
    for _ in range(3):
        spent = 0.0
        for _ in range(max(k // 100, 1)):
            drain()
            t = time.perf_counter()
            for _ in range(100):
                fn()
            spent += time.perf_counter() - t
        best = min(best, spent / (max(k // 100, 1) * 100) * 1e6)
    return best

def one():
    session.one(payload)

for warm in (decode, fresh_request, arm, one):
    timed(warm, 100)
decoded = timed(decode, n)
out = {"decode": decoded, "handler": timed(fresh_request, n) - decoded,
       "respond": timed(lambda: session.respond(response), n),
       "arm+disarm": timed(arm, n), "one": timed(one, n)}
session.dog.stop()
print(json.dumps(out))
"""


def measure(tree: Path, n: int) -> dict[str, float]:
    """Each piece's best us a call with `tree`'s code. Raises RuntimeError if the child
    fails."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(n)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: {done.stderr.strip()[-2000:]}")
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=100_000, help="calls of each piece a round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tree", type=Path, help="another checkout, measured in alternating rounds")
    args = p.parse_args()
    trees = [ROOT] + ([args.tree.resolve()] if args.tree else [])

    def report(n: int, tree: Path, figures: dict[str, float]) -> None:
        print(f"round {n} {tree}: " + ", ".join(f"{k} {figures[k]:.3f}" for k in PIECES),
              flush=True)

    results = _variants.alternate(trees, args.rounds, lambda t: measure(t, args.n), report,
                                  pause=0.5)
    best = {t: {k: min(r[k] for r in runs) for k in PIECES} for t, runs in results.items()}
    med = {t: {k: statistics.median(r[k] for r in runs) for k in PIECES}
           for t, runs in results.items()}
    print(f"\n== python-hello's request in its isolate, us a call (best of {args.rounds} "
          f"rounds; median in brackets) ==")
    head = f"{'piece':<12}" + "".join(f"{str(t)[-24:]:>30}" for t in trees)
    print(head + ("   x other (best, median)" if len(trees) > 1 else ""))
    for k in PIECES:
        row = f"{k:<12}" + "".join(f"{best[t][k]:>19.3f} ({med[t][k]:6.3f})  " for t in trees)
        if len(trees) > 1:
            other = trees[1]
            row += (f"   {best[ROOT][k] / best[other][k]:.2f}, "
                    f"{med[ROOT][k] / med[other][k]:.2f}")
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
