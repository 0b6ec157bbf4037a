"""Tools in a chat prompt for models whose chat template has no tool section
(SmolLM2's ChatML has none): the way llama-cpp-python's ``chatml-function-calling``
handler does it, the tool definitions go into the system message, and the
history's assistant ``tool_calls`` and ``role: "tool"`` results become text the
template renders like any message. Calls are written in the same markup the
grammar makes the model produce (`gpu_worker.protocol.TOOL_CALL_OPEN`), so the
model sees its own earlier calls the way it is asked to write new ones.
"""

from __future__ import annotations

import json
from typing import Any

from ..protocol import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

INTRO = ("You can call functions. To call one, answer only with\n"
         f'{TOOL_CALL_OPEN}{{"name": <function name>, "arguments": <arguments as JSON>}}'
         f"{TOOL_CALL_CLOSE}\nThe functions:")


def with_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
               ) -> list[dict[str, Any]]:
    """`messages` with `tools` described in the system message (the first message
    if it is one, else a new one) and tool calls and results as text. Messages
    not involved in tool use are returned as they are."""
    out = [_as_text(m) for m in messages]
    if not tools:
        return out
    described = "\n".join([INTRO, *(_describe(t["function"]) for t in tools)])
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
        return [{"role": "system", "content": f"{out[0]['content']}\n\n{described}"}, *out[1:]]
    return [{"role": "system", "content": described}, *out]


def _describe(fn: dict[str, Any]) -> str:
    params = json.dumps(fn.get("parameters") or {"type": "object", "properties": {}})
    about = f": {fn['description']}" if fn.get("description") else ""
    return f"- {fn['name']}{about}\n  parameters (JSON Schema): {params}"


def _as_text(m: dict[str, Any]) -> dict[str, Any]:
    """An assistant message with ``tool_calls`` or a ``tool`` result as plain text."""
    if m.get("role") == "assistant" and m.get("tool_calls"):
        calls = "\n".join(call_text(c.get("function", {})) for c in m["tool_calls"]
                          if isinstance(c, dict))
        return {"role": "assistant", "content": f"{m.get('content') or ''}{calls}"}
    if m.get("role") == "tool":
        return {"role": "tool", "content": f"(result of call {m.get('tool_call_id', '?')}) "
                                           f"{_text(m.get('content'))}"}
    return m


def call_text(fn: dict[str, Any]) -> str:
    """One call in the markup: `fn` is OpenAI's ``{"name", "arguments": "<JSON>"}``."""
    args = fn.get("arguments") or "{}"
    return f'{TOOL_CALL_OPEN}{{"name": "{fn.get("name", "")}", "arguments": {args}}}' \
           f"{TOOL_CALL_CLOSE}"


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else json.dumps(content)
