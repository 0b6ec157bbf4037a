"""The WAF's cost per request at PL1 (CRS 3.3.4 on libmodsecurity), next to the
same request with the WAF off, measured in the same run.

    python bench/bench_waf.py [--n 2000] [--rounds 3]

Two requests: a typical JSON POST (a chat-completions-like body to a function)
and a GET with query args. Two ways:
  (a) the `waf` stage alone, called directly (no sockets): microseconds per call
      with mode = "off" (what every request pays) and mode = "block";
  (b) through a PoP (`edgefn serve`, its own process) over loopback, hello-wat
      deployed, one keep-alive connection, sequential requests: milliseconds per
      request, a PoP with ``[waf] mode = "off"`` and one with ``mode = "block"``,
      alternated round by round, best round of each kept.
Ratios are block / off.
"""

from __future__ import annotations

import argparse
import atexit
import http.client
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from edgefn_core.process import load_system_libstdcxx  # noqa: E402

load_system_libstdcxx()

from bench_runtime import start_edgefn  # noqa: E402

from runtime.functions.manifest import Route  # noqa: E402
from runtime.functions.router import Router  # noqa: E402
from runtime.net.message import Request, Response  # noqa: E402
from runtime.pipeline.stage import Context  # noqa: E402
from runtime.pipeline.stages.waf import Waf  # noqa: E402
from runtime.pipeline.targets import Targets  # noqa: E402
from runtime.security.settings import NO_POLICY, WafSettings  # noqa: E402

HELLO = ROOT / "functions" / "examples" / "hello-wat"
JSON_BODY = (b'{"model": "qwen2.5-0.5b", "messages": [{"role": "system", "content": "You are a '
             b'helpful assistant."}, {"role": "user", "content": "Summarize the meeting notes '
             b'below in three bullet points, please."}], "max_tokens": 256, "temperature": 0.7}')
HEADERS = [(b"host", b"api.example.com"), (b"user-agent", b"python-httpx/0.27"),
           (b"accept", b"application/json")]
REQUESTS = {
    "JSON POST": (b"POST", b"/hello", b"", [*HEADERS, (b"content-type", b"application/json"),
                                            (b"content-length", b"%d" % len(JSON_BODY))],
                  JSON_BODY),
    "GET + args": (b"GET", b"/hello", b"q=running%20shoes&page=2&sort=price_asc&size=42", HEADERS,
                   b""),
}


class Hello:
    label, kind, name, tenant, policy = "hello@v1", "function", "hello", None, NO_POLICY


def ok(request: Request, ctx: Context) -> Response:
    return Response(200, [], b"ok")


def per_call_us(waf: Waf, spec: tuple, n: int) -> float:
    method, path, query, headers, body = spec
    request = Request(method, path, query, headers, b"api.example.com", "1.1", True,
                      "127.0.0.1:40000")
    request.body = body
    started = time.perf_counter()
    for _ in range(n):
        ctx = Context("127.0.0.1:40000")
        waf(request, ctx, ok)
    return (time.perf_counter() - started) / n * 1e6


def stage_figures(n: int) -> None:
    router = Router([(Route("/hello"), "hello", Hello())])
    targets = Targets(SimpleNamespace(router=router, canaries={}))  # type: ignore[arg-type]
    off, block = Waf(WafSettings(mode="off"), targets), Waf(WafSettings(mode="block"), targets)
    print("(a) the waf stage alone, per call")
    bare = min(per_call_us(lambda r, c, n: n(r, c), REQUESTS["GET + args"], n * 20)  # type: ignore[arg-type]
               for _ in range(3))
    print(f"  no stage (a Context and the next stage): {bare:5.2f} us")
    for name, spec in REQUESTS.items():
        base = min(per_call_us(off, spec, n * 20) for _ in range(3))
        cost = min(per_call_us(block, spec, n) for _ in range(3))
        print(f"  {name:10}  off {base:7.2f} us   block PL1 {cost:8.1f} us   "
              f"ratio {cost / base:7.1f}x   WAF cost {cost - base:7.1f} us")


def pop_ms(port: int, spec: tuple, n: int) -> float:
    method, path, query, headers, body = spec
    target = (path + b"?" + query if query else path).decode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        started = time.perf_counter()
        for _ in range(n):
            conn.putrequest(method.decode(), target, skip_host=True, skip_accept_encoding=True)
            for k, v in headers:
                conn.putheader(k.decode(), v)
            conn.endheaders(body or None)
            response = conn.getresponse()
            response.read()
            assert response.status == 200, response.status
        return (time.perf_counter() - started) / n * 1000
    finally:
        conn.close()


def start(data: Path, config: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A PoP serving hello-wat; returns the process and its port once it listens."""
    return start_edgefn(data, ["--no-ai", "--config", str(config)], deploy=HELLO)


def pop_figures(n: int, rounds: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="edgefn-bench-waf-"))
    atexit.register(shutil.rmtree, work, True)  # its PoPs' data dirs, at exit
    servers = {}
    for mode in ("off", "block"):
        cfg = work / f"{mode}.toml"
        cfg.write_text(f'[waf]\nmode = "{mode}"\n')
        servers[mode] = start(work / mode, cfg)
    try:
        print("(b) through a PoP (edgefn serve) over loopback, per request (hello-wat, "
              "keep-alive)")
        for name, spec in REQUESTS.items():
            best = {"off": float("inf"), "block": float("inf")}
            for _ in range(rounds):
                for mode, (_, port) in servers.items():
                    best[mode] = min(best[mode], pop_ms(port, spec, n))
            print(f"  {name:10}  off {best['off']:6.3f} ms   block PL1 {best['block']:6.3f} ms   "
                  f"ratio {best['block'] / best['off']:5.2f}x   "
                  f"WAF cost {(best['block'] - best['off']) * 1000:6.0f} us")
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    stage_figures(args.n)
    pop_figures(args.n, args.rounds)


if __name__ == "__main__":
    main()
