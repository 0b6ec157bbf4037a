"""Retrieval: POST a query vector (a JSON list of numbers) and get the nearest
documents, fetched from KV. Load data with `edgefn vectors` / `edgefn kv` (see
README) or POST /retrieval-py/docs with [{"id", "vector", "text"}]."""

from edgefn import Response


def handle(request, env):
    docs = env.kv("docs")
    index = env.vectors("docs")
    if request.method == "POST" and request.path.endswith("/docs"):
        items = request.json()
        index.upsert([{"id": d["id"], "vector": d["vector"]} for d in items])
        for d in items:
            docs.put(d["id"], d["text"])
        return Response.json({"stored": len(items)}, status=201)
    if request.method != "POST":
        return Response.json({"error": "POST a JSON vector"}, status=405)
    try:
        vector = request.json()
    except ValueError:
        return Response.json({"error": "body must be a JSON list of numbers"}, status=400)
    k = int(request.query.get("k", "3"))
    hits = index.query(vector, k=k)
    results = []
    for hit in hits:
        text = docs.get(hit["id"])
        results.append({"id": hit["id"], "distance": round(hit["distance"], 6),
                        "text": text.decode() if text is not None else None})
    return Response.json({"results": results})
