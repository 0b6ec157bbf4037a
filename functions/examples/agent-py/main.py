"""A tool-calling agent at the edge: the model picks a tool, the function runs it
(a KV lookup through its binding) and asks the model again with the result, all
inside one request.

    POST /agent-py/facts {"key": "value", ...}   store facts in KV namespace "facts"
    GET  /agent-py?q=question                    {"answer", "calls", "results"}

The tool's `key` parameter is an enum of the keys stored, so constrained decoding
can only produce a call that names a real key. SmolLM2-135M rarely decides to
call a tool on its own, so the first turn uses tool_choice "required"; a larger
model would use "auto".
"""

import json

from edgefn import Response

SYSTEM = "You answer questions using the facts the lookup tool returns."


def lookup_tool(keys):
    return {"type": "function", "function": {
        "name": "lookup", "description": "Read the stored fact with this key",
        "parameters": {"type": "object", "properties": {"key": {"enum": keys}},
                       "required": ["key"], "additionalProperties": False}}}


def handle(request, env):
    facts = env.kv("facts")
    if request.method == "POST":
        stored = request.json()
        for key, value in stored.items():
            facts.put(key, str(value))
        return Response.json({"stored": len(stored)}, status=201)
    keys = [k["key"] for k in facts.list(limit=50)["keys"]]
    if not keys:
        return Response.json({"error": "no facts stored; POST /agent-py/facts first"},
                             status=409)
    ai, tools = env.ai(), [lookup_tool(keys)]
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": request.query.get("q", "What do you know?")}]
    first = ai.chat(messages, tools=tools, tool_choice="required", parallel_tool_calls=False,
                    max_tokens=40, temperature=0)
    messages.append(first["message"])
    results = []
    for call in first["tool_calls"]:
        key = json.loads(call["function"]["arguments"])["key"]
        value = facts.get(key)
        results.append({"key": key, "value": value.decode() if value is not None else None})
        messages.append({"role": "tool", "tool_call_id": call["id"],
                         "content": results[-1]["value"] or "not found"})
    answer = ai.chat(messages, tools=tools, tool_choice="none",
                     max_tokens=int(request.query.get("max_tokens", "32")), temperature=0)
    return Response.json({"answer": answer["text"], "calls": first["tool_calls"],
                          "results": results})
