"""The smallest Python function."""

from edgefn import Response


def handle(request, env):
    name = request.query.get("name", "world")
    return Response(f"Hello, {name}, from a Python isolate!\n")
