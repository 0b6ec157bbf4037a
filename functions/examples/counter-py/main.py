"""Counts hits per path with the KV binding's atomic increment."""

from edgefn import Response


def handle(request, env):
    count = env.kv("counters").increment(request.path)
    return Response.json({"count": count})
