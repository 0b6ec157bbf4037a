"""edgefn's HTTP front with a static app and no function: isolates the front's cost.

    python bench/_front_only.py PORT
"""

from __future__ import annotations

import sys
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runtime.app import StopSignals
from runtime.net import Response, Server

RESPONSE = Response(200, [(b"content-type", b"text/plain")], b"hello world\n")


def app(request: object) -> Response:
    return Response(RESPONSE.status, list(RESPONSE.headers), RESPONSE.body)


async def main(port: int) -> None:
    async with StopSignals() as stop:
        server = Server(app)
        await server.start("127.0.0.1", port)
        print(f"listening on 127.0.0.1:{port}", flush=True)
        await stop.wait()
        await server.shutdown(1)


if __name__ == "__main__":
    uvloop.run(main(int(sys.argv[1])))
