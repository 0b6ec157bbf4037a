"""POST requests on the native lane (runtime/net/native_src/lane.c) against the
Python front, measured in the same run.

    python bench/bench_lane_post.py [--seconds 5] [--rounds 2]

Two PoPs (`edgefn serve`), one with the lane (the default) and one without
(``EDGEFN_NATIVE_LANE=0``), each serving the echo example (a WASM reactor that
answers the body it got), hello-c (a WASI command: C that counts its stdin's bytes)
and a Python function that answers its body's length.
``wrk -t1 -c32`` POSTs a 39-byte JSON body (Content-Length framing) to each, in
turns, best of `--rounds`; the raw uvloop + httptools hello (a GET) is the
baseline of the "x raw" column, as in bench_runtime.py.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import _baseline  # noqa: E402
import _wrk  # noqa: E402
import bench_runtime  # noqa: E402

from runtime.admin.client import AdminClient  # noqa: E402

ECHO = ROOT / "functions" / "examples" / "echo"
HELLO_C = ROOT / "functions" / "examples" / "hello-c"
BODY = '{"prompt":"hello there","max_tokens":8}'  # 39 bytes of JSON
POST_LUA = f"""wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
"""
PY_ECHO = """from edgefn import Response


def handle(request, env):
    return Response(b"%d bytes" % len(request.body))
"""


def python_echo(root: Path) -> Path:
    d = root / "py-echo"
    d.mkdir()
    (d / "main.py").write_text(PY_ECHO)
    (d / "edgefn.toml").write_text('name = "py-echo"\nruntime = "python"\nentry = "main.py"\n'
                                   'routes = ["/py/echo"]\n')
    return d


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="edgefn-bench-post-"))
    script = work / "post.lua"
    script.write_text(POST_LUA)
    servers: list[subprocess.Popen[bytes]] = []
    urls: dict[str, tuple[str, str | None]] = {}
    best: dict[str, dict[str, float]] = {}
    try:
        port = bench_runtime.free_port()
        servers.append(_baseline.start(port))
        urls["raw uvloop+httptools (GET)"] = (f"http://127.0.0.1:{port}/", None)
        py_echo = python_echo(work)
        for label, lane in (("lane", "1"), ("Python front", "0")):
            os.environ["EDGEFN_NATIVE_LANE"] = lane
            try:
                proc, port = bench_runtime.start_edgefn(work / f"data-{lane}")
            finally:
                os.environ.pop("EDGEFN_NATIVE_LANE")
            servers.append(proc)
            admin = AdminClient(work / f"data-{lane}")
            admin.deploy(ECHO)
            admin.deploy(HELLO_C)
            admin.deploy(py_echo)
            urls[f"WASM echo POST, {label}"] = (f"http://127.0.0.1:{port}/echo", str(script))
            urls[f"hello-c POST, {label}"] = (f"http://127.0.0.1:{port}/hello-c", str(script))
            urls[f"Python echo POST, {label}"] = (f"http://127.0.0.1:{port}/py/echo",
                                                  str(script))
        best = _wrk.best_of({name: url for name, (url, _) in urls.items()}, args.seconds,
                            args.rounds, {name: lua for name, (_, lua) in urls.items() if lua})
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(20)
        shutil.rmtree(work, ignore_errors=True)
    raw = best["raw uvloop+httptools (GET)"]["rps"]
    print(f"\n== POST of {len(BODY)} bytes, wrk -t1 -c32 -d{args.seconds}s, best of "
          f"{args.rounds} rounds ==")
    print(f"{'server':<34}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'x raw':>8}{'x front':>9}")
    for name, r in best.items():
        front = best.get(name.replace(", lane", ", Python front"))
        vs = f"{r['rps'] / front['rps']:.2f}" if front and name.endswith(", lane") else ""
        print(f"{name:<34}{r['rps']:>10.0f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}"
              f"{r['rps'] / raw:>8.3f}{vs:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
