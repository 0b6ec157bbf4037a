"""What the `residency` stage costs per request, socket-free: a Chain of the real
request_id stage, a stage that sets the principal (as `auth` does), then

    (a) no residency stage
    (b) the residency stage, the tenant not pinned
    (c) the residency stage, the tenant pinned here (signs x-edgefn-tenant: HMAC)
    (d) the residency stage, a signed x-edgefn-tenant verified (the next tier)

and an answering stage. CPU microseconds per request of the calling thread, the
median of --rounds rounds of --n requests, interleaved; ratios to (a). Run from
the repo root:

    .venv/bin/python bench/bench_residency.py [--n 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime import config as c  # noqa: E402
from runtime.net.message import Request, Response  # noqa: E402
from runtime.pipeline.chain import Chain  # noqa: E402
from runtime.pipeline.stage import Context, Next, Result, Stage  # noqa: E402
from runtime.pipeline.stages.request_id import RequestId  # noqa: E402
from runtime.pipeline.stages.residency import Residency  # noqa: E402
from runtime.security import residency as r  # noqa: E402
from runtime.security.principal import Principal  # noqa: E402

SECRET = "0123456789abcdef-bench"
SETTINGS = r.ResidencySettings(tenants={"acme-eu": "emea"}, secret=SECRET)


class As:
    name = "as"

    def __init__(self, tenant: str | None) -> None:
        self.principal = Principal(kind="key", tenant=tenant) if tenant else None

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        ctx.principal = self.principal
        return call_next(request, ctx)


class Answer:
    name = "answer"

    def __call__(self, request: Request, ctx: Context, call_next: Next) -> Result:
        return Response(200, [], b"ok")


def variants() -> list[tuple[str, Chain, Request]]:
    def req(*headers: tuple[bytes, bytes]) -> Request:
        return Request(b"POST", b"/v1/chat/completions", b"", [
            (b"host", b"localhost"), (b"x-request-id", b"bench-rid-1"), *headers],
            b"localhost", "1.1", True, "127.0.0.1:5000")

    def chain(tenant: str | None, residency: bool) -> Chain:
        stages: list[Stage] = [RequestId(c.RequestIdStage()), As(tenant)]
        if residency:
            stages.append(Residency(SETTINGS, "bench", "emea"))
        return Chain([*stages, Answer()], False)

    signed = (r.TENANT_HEADER, r.sign(SECRET, "acme-eu", "bench-rid-1").encode())
    return [("(a) no residency stage", chain("globex", False), req()),
            ("(b) residency, tenant not pinned", chain("globex", True), req()),
            ("(c) residency, pinned here: signs", chain("acme-eu", True), req()),
            ("(d) residency, verifies a signed header", chain(None, True), req(signed))]


def one_round(app: Chain, request: Request, n: int) -> float:
    started = time.thread_time()
    for _ in range(n):
        response = app(request)
        assert isinstance(response, Response) and response.status == 200, response
    return (time.thread_time() - started) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    runs = variants()
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(args.rounds):
        for i, (_, app, request) in enumerate(runs):
            times[i].append(one_round(app, request, args.n))
    base = statistics.median(times[0])
    for (name, _, _), t in zip(runs, times, strict=True):
        med = statistics.median(t)
        print(f"{name:42s} {med:7.2f} us/request  x{med / base:.2f} of (a)  "
              f"(+{med - base:.2f} us)")


if __name__ == "__main__":
    main()
