"""edgefn's HTTP front with a static app and no function: isolates the front's cost.

    python bench/_front_only.py PORT [--touch BYTES]

`--touch BYTES`: each request also zeroes a buffer of that many bytes (memset, the
same buffer each time), as a WASM instance's memory reset does: what that costs the
rest of the request (bench/bench_reset.py).
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.app import StopSignals
from runtime.net import Response, Server

RESPONSE = Response(200, [(b"content-type", b"text/plain")], b"hello world\n")


def app(request: object) -> Response:
    return Response(RESPONSE.status, list(RESPONSE.headers), RESPONSE.body)


def touching(size: int):  # type: ignore[no-untyped-def]
    """`app`, zeroing `size` bytes of the same buffer at each request."""
    buffer, memset = ctypes.create_string_buffer(size), ctypes.memset

    def touch_app(request: object) -> Response:
        memset(buffer, 0, size)
        return app(request)
    return touch_app


async def main(port: int, touch: int) -> None:
    async with StopSignals() as stop:
        server = Server(touching(touch) if touch else app)
        await server.start("127.0.0.1", port)
        print(f"listening on 127.0.0.1:{port}", flush=True)
        await stop.wait()
        await server.shutdown(1)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("port", type=int)
    p.add_argument("--touch", type=int, default=0)
    args = p.parse_args()
    uvloop.run(main(args.port, args.touch))
