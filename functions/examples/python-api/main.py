"""A small JSON API: an in-isolate todo list (state lives as long as the isolate;
real state belongs in the KV binding)."""

from edgefn import Response

TODOS: dict[int, dict] = {}


def handle(request, env):
    parts = [p for p in request.path.split("/") if p][2:]  # after /py/api
    if request.method == "GET" and parts == ["todos"]:
        return Response.json({"todos": list(TODOS.values())})
    if request.method == "POST" and parts == ["todos"]:
        try:
            item = request.json()
        except ValueError:
            return Response.json({"error": "body must be JSON"}, status=400)
        if not isinstance(item, dict) or not isinstance(item.get("title"), str):
            return Response.json({"error": "expected {\"title\": string}"}, status=422)
        todo = {"id": len(TODOS) + 1, "title": item["title"], "done": False}
        TODOS[todo["id"]] = todo
        env.log("created todo", todo["id"])
        return Response.json(todo, status=201)
    if request.method == "GET" and parts == ["whoami"]:
        return Response.json({**env.deployment(), "mode": env.vars.get("MODE")})
    return Response.json({"error": f"no route {request.method} {request.path}"}, status=404)
