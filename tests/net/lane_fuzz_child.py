"""A child process for `test_native_lane_safety`: a PoP (no listener) with the lane's
functions deployed, feeding each input it reads on stdin (u32 length, bytes) to the
lane's C entry, and answering (used, len(out), responses in out, the body bytes the
request it stopped in still needs: `Lane.waiting`) on stdout. A crash
in the C ends this process, not pytest. A request for the Python function (/pyf) is
a call: awaited, then its answer asked of the lane (the C's `respond`, or Python's
finish, written here as its status line), as the front does."""

from __future__ import annotations

import asyncio
import struct
import sys
import tempfile
from pathlib import Path

from runtime import config as c
from runtime.functions import deploys
from runtime.pop import PoP
from tests.net.lane_support import guests, static_reactor
from tests.support import function_dir, python_function

ROOT = Path(__file__).resolve().parents[2]
PYF = '''
from edgefn import Response


def handle(request, env):
    if request.query.get("raise"):
        raise RuntimeError("boom")
    return Response("hi", headers=[("x-q", request.path)])
'''


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pop = PoP(c.load(None, data=tmp, **{"ai.enabled": False, "http.max_url_bytes": 1024,
                                            "http.max_header_bytes": 2048,
                                            "http.max_body_bytes": 4096}))
        limited = '[[rate_limits]]\nby = "ip"\nlimit = "1000000/minute"\n'
        for folder in [ROOT / "functions" / "examples" / "hello-wat",
                       *guests(Path(tmp) / "fns"),
                       python_function(Path(tmp) / "py", "pyf", PYF, extra=limited),
                       function_dir(Path(tmp) / "fns", "wild", static_reactor(200, [], b"w"),
                                    routes=["/wild/*", "/cap/:id/x"], extra=limited),
                       # full after its first request: the lane's 429s (lane.c `refuse`)
                       function_dir(Path(tmp) / "fns", "tiny", static_reactor(200, [], b"t"),
                                    extra='[[rate_limits]]\nby = "ip"\nlimit = "1/minute"\n')]:
            await pop.registry.deploy(deploys.pack_dir(folder))
        lane = pop.lane
        assert lane is not None
        sys.stdout.buffer.write(b"ready\n")
        sys.stdout.buffer.flush()
        read = sys.stdin.buffer.read
        while head := read(8):
            size, budget = struct.unpack("<II", head)
            data = read(size)
            used, out, call = lane.serve(data, "127.0.0.1:1", b"date: D\r\n", b"", budget)
            if call is not None:
                await asyncio.wait([call[0]], timeout=10)
                answer = lane.answer(call, False, False, b"date: D\r\n", b"")
                if isinstance(answer, bytes):
                    out += answer
                elif answer is not None:
                    out += b"HTTP/1.1 %d (Python's)\r\n" % answer[1].status
            count = out.count(b"HTTP/1.1 ")
            sys.stdout.buffer.write(struct.pack("<IIII", used, len(out), count,
                                                lane.c.waiting))
            sys.stdout.buffer.flush()
        pop.close()


if __name__ == "__main__":
    asyncio.run(main())
