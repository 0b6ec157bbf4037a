"""The bots stage's cost per request, next to a stage that only calls the next
one, measured in the same run (no sockets: a Request built by hand, the stage
called with a fresh Context, as the chain does).

    python bench/bench_bots.py [--n 20000] [--rounds 5]

Figures (microseconds per request, best of --rounds; ratio to the baseline and
the stage's own cost = figure - baseline):
  pass-through        a stage that returns call_next(request, ctx)  (baseline)
  resolve only        ... after looking up the target (which `route` then reuses)
  cached UA           a browser whose User-Agent is in the LRU (the common case)
  declared agent      GPTBot, cached
  cached + rate       the same browser with [bots] abusive_rate set (a counters hit)
  new UA              a User-Agent never seen (ua-parser + the agents regex)
  signed (verify)     a Web Bot Auth request: RFC 9421 parse + Ed25519 verify + replay set
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from runtime.functions.manifest import Route  # noqa: E402
from runtime.functions.router import Router  # noqa: E402
from runtime.net.message import Request, Response  # noqa: E402
from runtime.pipeline.stage import Context, Next  # noqa: E402
from runtime.pipeline.stages.bots import Bots  # noqa: E402
from runtime.pipeline.targets import Targets  # noqa: E402
from runtime.security.bots import agents, webbotauth  # noqa: E402
from runtime.security.bots.classify import Classifier  # noqa: E402
from runtime.security.bots.manager import BotManager  # noqa: E402
from runtime.security.settings import BotSettings, TargetPolicy  # noqa: E402

HOST = b"edge.test"
CHROME = ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
          "Chrome/124.0.0.0 Safari/537.36")
BROWSER = [(b"accept", b"text/html,*/*;q=0.8"), (b"accept-language", b"en-US,en;q=0.9"),
           (b"sec-fetch-mode", b"navigate"), (b"sec-fetch-site", b"none"),
           (b"accept-encoding", b"gzip, deflate, br"), (b"connection", b"keep-alive")]
RESPONSE = Response(200, [], b"ok")


class Target:
    kind, name, label, tenant = "function", "fn", "fn", None
    policy = TargetPolicy()


class PassThrough:
    name = "pass"

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Response:
        return call_next(request, ctx)  # type: ignore[return-value]


class ResolveOnly:
    """Looks the target up (as the bots stage does) and calls next: the part of the
    bots stage's cost that `route` then saves, as the target is resolved once."""

    name = "resolve"

    def __init__(self, targets: Targets) -> None:
        self.targets = targets

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Response:
        self.targets.resolve(request, ctx)
        return call_next(request, ctx)  # type: ignore[return-value]


def answer(request: Request, ctx: Context) -> Response:
    return RESPONSE


def request(headers: list[tuple[bytes, bytes]]) -> Request:
    return Request(b"GET", b"/fn", b"", headers, HOST, "1.1", True, "198.51.100.7:4000")


def per_request(stage: Callable[..., object], requests: list[Request], rounds: int) -> float:
    """Microseconds per call: best of `rounds` passes over `requests`."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for req in requests:
            stage(req, Context(req.client), answer)
        best = min(best, time.perf_counter() - start)
    return best / len(requests) * 1e6


def bots_stage(settings: BotSettings, keys: webbotauth.KeyDirectory | None = None) -> Bots:
    verifier = webbotauth.Verifier(keys, 300, capacity=10_000_000) if keys else None
    manager = BotManager(settings, Classifier(agents.load(), cache_size=4096), verifier)
    router = Router([(Route("/fn"), "fn", Target())])
    return Bots(manager, Targets(SimpleNamespace(router=router, canaries={})))  # type: ignore[arg-type]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    n, rounds = args.n, args.rounds
    browser = [request([(b"user-agent", CHROME.encode()), *BROWSER])] * n
    gptbot = [request([(b"user-agent", b"Mozilla/5.0 (compatible; GPTBot/1.1; "
                       b"+https://openai.com/gptbot)"), *BROWSER])] * n
    results: dict[str, float] = {}
    results["pass-through"] = per_request(PassThrough(), browser, rounds)
    results["resolve only"] = per_request(ResolveOnly(bots_stage(BotSettings()).targets),
                                          browser, rounds)
    results["cached UA"] = per_request(bots_stage(BotSettings()), browser, rounds)
    results["declared agent"] = per_request(bots_stage(BotSettings()), gptbot, rounds)
    fast = BotSettings(abusive_rate="100000000/second")
    results["cached + rate"] = per_request(bots_stage(fast), browser, rounds)
    # a fresh stage per round, so that every User-Agent is new to its cache
    fresh = [request([(b"user-agent", CHROME.replace("124.0.0.0", f"124.0.{i}.0").encode()),
                      *BROWSER]) for i in range(n)]
    results["new UA"] = min(per_request(bots_stage(BotSettings()), fresh, 1)
                            for _ in range(rounds))
    key = Ed25519PrivateKey.generate()
    keys = webbotauth.KeyDirectory()
    keys.add({"keys": [webbotauth.public_jwk(key)]}, "https://agent.example", "bench")
    m = max(n // 10, 100)  # signing is slow: fewer requests, each verified once
    signed = [request([(k.lower().encode(), v.encode()) for k, v in webbotauth.sign(
        key, "GET", f"http://{HOST.decode()}/fn", signature_agent="https://agent.example",
        expires_in=3600).items()]) for _ in range(m * rounds)]
    results["signed (verify)"] = min(
        per_request(bots_stage(BotSettings(), keys), signed[r * m:(r + 1) * m], 1)
        for r in range(rounds))
    base = results["pass-through"]
    print(f"bots stage, per request (n={n}, best of {rounds}; signed: {m} per round)")
    for name, us in results.items():
        print(f"  {name:16s} {us:8.2f} us   {us / base:6.1f}x baseline   "
              f"stage cost {us - base:7.2f} us")


if __name__ == "__main__":
    main()
