"""The ratelimit stage's cost per request, and what Redis adds.

    python bench/bench_ratelimit.py [--n 20000] [--redis]

Socket-free: the stage is called with a plain Request and a Context, its next
stage answering a ready Response, best of 5 rounds each. Figures in µs per
request; ratios to a pass-through stage measured in the same run:
  pass-through          a stage that only calls the next one (the baseline)
  no rule applies       the ratelimit stage with nothing to do
  1 / 3 memory rules    by ip (+ by function, by agent), sliding window, headers on
  1 rule, headers off
  1 / 3 shared rules    the same memory rules counted in the shared table of
                        ``workers = N`` (`native.create_table`, a file here; sliding window)
With --redis (starts redis-server on a free port; needs it installed):
  redis PING            one round trip with redis.asyncio (the floor)
  1 / 3 redis rules     the stage awaiting limits' Redis storage
  token reserve+settle  memory and Redis budget stores
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import redis.asyncio

from edgefn_core.errors import EdgefnError
from runtime.functions.router import Router
from runtime.net.message import Request, Response
from runtime.pipeline.stage import Context, Next, Result
from runtime.pipeline.stages.ratelimit import RateLimit
from runtime.pipeline.targets import Targets
from runtime.security.ratelimit.budget import BudgetStore, MemoryBudgetStore
from runtime.security.ratelimit.native import create_table
from runtime.security.ratelimit.redis_budget import RedisBudgetStore
from runtime.security.settings import NO_POLICY, RateLimitSettings, RateRule

BIG = "100000000/minute"  # never reached: the cost of counting, not of refusing
RESPONSE = Response(200, [], b"ok")


class Function:
    kind, name, label, tenant, policy = "function", "hello", "hello@1", "t", NO_POLICY

    def error_response(self, err: EdgefnError) -> Response:
        return Response(err.status, [], b"")

    def crashed(self, exc: Exception) -> EdgefnError:
        return EdgefnError(str(exc))


class PassThrough:
    name = "pass"

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        return call_next(request, ctx)


def answer(request: Request, ctx: Context) -> Response:
    RESPONSE.headers = []
    return RESPONSE


def targets() -> Targets:
    return Targets(SimpleNamespace(router=Router()), {b"/hello": Function()})  # type: ignore[arg-type, dict-item]


def stage(rules: int, headers: bool = True, storage: str = "memory://",
          table: str | None = None) -> RateLimit:
    by = ["ip", "function", "agent"][:rules]
    return RateLimit(RateLimitSettings(storage=storage, headers=headers,
                                       rules=[RateRule(b, BIG) for b in by]), targets(),  # type: ignore[arg-type]
                     table=table)


def request() -> Request:
    return Request(b"GET", b"/hello", b"", [], b"localhost", "1.1", True, "10.1.2.3:5000")


def per_call_us(fn: Callable[[], Any], n: int) -> float:
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6


async def per_await_us(fn: Callable[[], Any], n: int) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            await fn()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6


def sync_call(s: Any) -> Callable[[], Any]:
    req = request()

    def call() -> Any:
        ctx = Context(req.client)
        ctx.agent = "bot.example"
        return s(req, ctx, answer)

    return call


def report(name: str, us: float, base: float) -> None:
    print(f"{name:<28} {us:9.2f} us   {us / base:6.2f}x pass-through", flush=True)


def memory(n: int) -> float:
    base = per_call_us(sync_call(PassThrough()), n)
    report("pass-through", base, base)
    report("no rule applies", per_call_us(sync_call(stage(0)), n), base)
    for rules in (1, 3):
        s = stage(rules)
        report(f"{rules} memory rule(s)", per_call_us(sync_call(s), n), base)
        s.close()
    s = stage(1, headers=False)
    report("1 memory rule, headers off", per_call_us(sync_call(s), n), base)
    s.close()
    with tempfile.TemporaryDirectory() as tmp:  # workers = N: the table they share
        table = f"{tmp}/table"
        create_table(Path(table))
        for rules in (1, 3):
            s = stage(rules, table=table)
            report(f"{rules} shared rule(s)", per_call_us(sync_call(s), n), base)
            s.close()
    store = MemoryBudgetStore()
    report("token reserve+settle, memory", asyncio.run(_budget(store, n)), base)
    return base


async def _budget(store: BudgetStore, n: int) -> float:
    async def one() -> None:
        window = await store.reserve(["key:k", "tenant:t"], [10**12, 10**12], 100)
        assert isinstance(window, int)
        await store.settle(["key:k", "tenant:t"], window, -50)

    us = await per_await_us(one, n)
    await store.close()
    return us


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _redis(url: str, n: int, base: float) -> None:
    client = redis.asyncio.Redis.from_url(url)
    report("redis PING (asyncio)", await per_await_us(client.ping, n), base)
    await client.aclose()
    for rules in (1, 3):
        s = stage(rules, storage=url)
        call = sync_call(s)
        report(f"{rules} redis rule(s)", await per_await_us(call, n), base)
        await s.aclose()
    report("token reserve+settle, redis", await _budget(RedisBudgetStore(url), n), base)


def with_redis(n: int, base: float) -> None:
    exe = shutil.which("redis-server")
    if exe is None:
        print("redis-server is missing: apt-get install -y redis-server")
        return
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", folder],
                                stdout=subprocess.DEVNULL)
        try:
            time.sleep(0.3)
            asyncio.run(_redis(f"redis://127.0.0.1:{port}/0", n, base))
        finally:
            proc.terminate()
            proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000, help="calls per round")
    parser.add_argument("--redis", action="store_true", help="also measure Redis")
    args = parser.parse_args()
    base = memory(args.n)
    if args.redis:
        with_redis(max(1, args.n // 10), base)


if __name__ == "__main__":
    main()
