"""The request fields that shape what a model writes: ``response_format``,
``tools``, ``tool_choice``, ``parallel_tool_calls``, ``logprobs``/``top_logprobs``,
``presence_penalty``/``frequency_penalty`` and ``logit_bias``, checked here
(each refusal is a 400 naming its field in ``param``) and turned into
`gpu_worker.protocol.Generate` fields. The engine enforces them (llama.cpp:
a grammar and its sampler chain) or passes them on (upstream).
"""

from __future__ import annotations

import re
from typing import Any

from edgefn_core.errors import ApiError, WorkerError

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
FORMATS = ("text", "json_object", "json_schema")
CHOICES = ("none", "auto", "required")
MAX_TOP_LOGPROBS = 20  # chat, as OpenAI
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions API
FIELDS = frozenset({"response_format", "tools", "tool_choice", "logprobs", "top_logprobs",
                    "presence_penalty", "frequency_penalty", "logit_bias"})


def _bad(param: str, message: str) -> ApiError:
    return ApiError("invalid_request", 400, message, param=param)


# the keys OpenAI's API takes in these objects: another is a 400 naming it, as OpenAI
# answers (a misspelt `json_schema.schmea` dropped the schema: an object of any shape)
KEYS = {"response_format": frozenset({"type", "json_schema"}),
        "response_format.json_schema": frozenset({"name", "description", "schema", "strict"}),
        "tools[]": frozenset({"type", "function"}),
        "tools[].function": frozenset({"name", "description", "parameters", "strict"})}


def _known(value: dict[str, Any], kind: str, where: str) -> None:
    """Raises `ApiError` naming the first key of `value` (at `where`) OpenAI's
    `kind` object does not have."""
    unknown = [k for k in value if k not in KEYS[kind]]
    if unknown:
        raise _bad(f"{where}.{unknown[0]}", f"{where}.{unknown[0]}: unknown field (expected "
                   f"{', '.join(sorted(KEYS[kind]))})")


def response_format(fmt: dict[str, Any] | None) -> dict[str, Any]:
    """Generate fields for `fmt`. Raises `ApiError` (400) for a malformed one."""
    if fmt is None:
        return {}
    _known(fmt, "response_format", "response_format")
    if fmt.get("type") not in FORMATS:
        raise _bad("response_format.type", f"response_format.type must be one of "
                   f"{', '.join(FORMATS)}, got {fmt.get('type')!r}")
    if fmt["type"] == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not NAME.fullmatch(str(spec.get("name", ""))):
            raise _bad("response_format.json_schema.name", "response_format.json_schema needs "
                       "a 'name' of 1-64 letters, digits, '_' or '-'")
        _known(spec, "response_format.json_schema", "response_format.json_schema")
        if not isinstance(spec.get("schema", {}), dict):
            raise _bad("response_format.json_schema.schema",
                       "response_format.json_schema.schema must be a JSON Schema object")
    return {"response_format": fmt}


def tools(defs: list[dict[str, Any]] | None, choice: Any, parallel: bool | None
          ) -> dict[str, Any]:
    """Generate fields for `defs` and `choice`. Raises `ApiError` (400) for a
    malformed tool, a repeated name, or a choice that names no tool."""
    if not defs:
        if choice not in (None, "none"):
            raise _bad("tool_choice", "tool_choice is only allowed when tools are given")
        return {}
    names = [_tool_name(i, t) for i, t in enumerate(defs)]
    if len(set(names)) != len(names):
        raise _bad("tools", "tools must have distinct function names")
    _check_choice(choice, names)
    return {"tools": defs, "tool_choice": choice,
            "parallel_tool_calls": True if parallel is None else parallel}


def _tool_name(i: int, tool: dict[str, Any]) -> str:
    """Raises `ApiError` for a tool that is not ``{"type": "function", "function":
    {"name", "description"?, "parameters"?, "strict"?}}`` (parameters: an object's
    schema)."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise _bad(f"tools[{i}].type", f"tools[{i}].type must be 'function'")
    _known(tool, "tools[]", f"tools[{i}]")
    fn = tool.get("function")
    if not isinstance(fn, dict) or not NAME.fullmatch(str(fn.get("name", ""))):
        raise _bad(f"tools[{i}].function.name", f"tools[{i}].function needs a 'name' of 1-64 "
                   "letters, digits, '_' or '-'")
    _known(fn, "tools[].function", f"tools[{i}].function")
    params = fn.get("parameters", {})
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        raise _bad(f"tools[{i}].function.parameters",  # (arguments are a JSON object)
                   f"tools[{i}].function.parameters must be a JSON Schema object of type "
                   "'object'")
    return str(fn["name"])


def _check_choice(choice: Any, names: list[str]) -> None:
    if choice is None or choice in CHOICES:
        return
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not (isinstance(choice, dict) and choice.get("type") == "function"
            and isinstance(choice.get("function"), dict)):
        raise _bad("tool_choice", "tool_choice must be 'none', 'auto', 'required' or "
                   "{'type': 'function', 'function': {'name': ...}}")
    if name not in names:
        raise _bad("tool_choice", f"tool_choice names function {name!r}, which is not in tools")


def logprobs(chat: bool, wanted: bool | int | None, top: int | None) -> dict[str, Any]:
    """The Generate ``logprobs`` field: chat's ``logprobs: true`` with ``top_logprobs``
    (0-20), or the completions API's ``logprobs`` count (0-5). Raises `ApiError`."""
    if chat:
        if top is not None and not wanted:
            raise _bad("top_logprobs", "top_logprobs needs logprobs: true")
        if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
            raise _bad("top_logprobs", f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}")
        return {"logprobs": top or 0} if wanted else {}
    if wanted is None or wanted is False:
        return {}
    if not 0 <= int(wanted) <= MAX_COMPLETION_LOGPROBS:
        raise _bad("logprobs", f"logprobs must be between 0 and {MAX_COMPLETION_LOGPROBS}")
    return {"logprobs": int(wanted)}


def penalties(presence: float, frequency: float, bias: dict[str, float] | None
              ) -> dict[str, Any]:
    """Generate fields for the penalties and ``logit_bias`` (its keys are token ids
    as strings). Raises `ApiError` for a value out of OpenAI's ranges."""
    out: dict[str, Any] = {}
    for name, value in (("presence_penalty", presence), ("frequency_penalty", frequency)):
        if not -2 <= value <= 2:
            raise _bad(name, f"{name} must be between -2 and 2, got {value}")
        if value:
            out[name] = value
    if bias:
        if not all(k.isascii() and k.isdigit() and len(k) <= 9 for k in bias):  # token ids
            raise _bad("logit_bias", "logit_bias keys must be token ids (integers as strings)")
        if not all(-100 <= v <= 100 for v in bias.values()):
            raise _bad("logit_bias", "logit_bias values must be between -100 and 100")
        out["logit_bias"] = {int(k): float(v) for k, v in bias.items()}
    return out


def shaped(body: Any) -> bool:
    """Whether a chat or completion body uses any of these fields (the AI cache
    keeps plain text only, so it leaves such requests alone). Values that ask
    for plain text are no shaping: ``response_format: {"type": "text"}``, and a
    ``tool_choice`` of "none" or "auto" without tools."""
    for name in FIELDS:
        value = getattr(body, name, None)
        if value in (None, 0, 0.0, False, {}, []):
            continue
        if name == "response_format" and value == {"type": "text"}:
            continue
        if name == "tool_choice" and value in ("none", "auto") and not getattr(body, "tools",
                                                                                None):
            continue
        return True
    return False


def params_of(body: Any) -> dict[str, Any]:
    """The Generate fields for a chat or completion body's shaping fields. Raises
    `ApiError` (400) naming the first bad one."""
    chat = hasattr(body, "messages")
    out = penalties(body.presence_penalty, body.frequency_penalty, body.logit_bias)
    out |= logprobs(chat, body.logprobs, getattr(body, "top_logprobs", None))
    if chat:
        out |= response_format(body.response_format)
        out |= tools(body.tools, body.tool_choice, body.parallel_tool_calls)
    return out


def param_of(err: WorkerError) -> str | None:
    """The request field a worker refusal is about: engines start such messages
    with it (``logit_bias: token 99999 ...``, ``tools[0].function.parameters.x:
    JSON Schema keyword ...``)."""
    head = str(err).split(" ", 1)[0].rstrip(":")
    root = head.split(".", 1)[0].split("[", 1)[0]
    return head if root in FIELDS else None
