"""Asks the PoP's model worker and streams the answer into the response.

    GET /ai-py?q=question            the answer, streamed as it is generated
    GET /ai-py?q=question&stream=0   one JSON object with text, finish_reason, usage
    POST /ai-py/rank {"query", "documents"}   documents reranked by relevance
"""

from edgefn import Response


def handle(request, env):
    ai = env.ai()
    if request.path.endswith("/rank"):
        try:
            body = request.json()
            query, documents = body["query"], body["documents"]
        except (ValueError, KeyError, TypeError):  # no body, not JSON, a field missing
            return Response.json({"error": 'POST {"query": "...", "documents": ["...", ...]}'},
                                 status=400)
        return Response.json(ai.rerank(query, documents))
    question = request.query.get("q", "What is an edge function?")
    messages = [{"role": "system", "content": "Answer in one short sentence."},
                {"role": "user", "content": question}]
    params = {"max_tokens": int(request.query.get("max_tokens", "48")), "temperature": 0}
    if request.query.get("stream") == "0":
        return Response.json(ai.chat(messages, **params))
    return Response(ai.chat(messages, stream=True, **params),
                    headers={"content-type": "text/plain; charset=utf-8"})
