"""Streams server-sent events from a generator."""

import time

from edgefn import Response


def handle(request, env):
    count = min(int(request.query.get("n", "5")), 100)

    def events():
        for i in range(count):
            yield f"data: tick {i}\n\n"
            time.sleep(0.01)
        yield "data: [DONE]\n\n"

    return Response(events(), headers={"content-type": "text/event-stream"})
