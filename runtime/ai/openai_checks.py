"""Values of an OpenAI request checked before the worker sees them, each refusal
a 400 whose ``param`` names the field: chat messages (``messages[1].role``) and
the sampling parameters' ranges (OpenAI's own ranges)."""

from __future__ import annotations

from typing import Any

from edgefn_core.errors import ApiError
from runtime.ai.openai_fields import MAX_N, MAX_STOPS

# OpenAI's roles ("tool" answers an assistant's tool call); "function" is the deprecated
# form of "tool", refused with a pointer to it
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_NEEDS_TOOLS = {"function": "'function' messages are deprecated by OpenAI (use 'tool' "
                "messages with tool_call_id) and this server does not take them"}
TOOL_FIELDS = frozenset({"tool_calls", "tool_call_id"})  # in the history of a tools chat
# the fields OpenAI defines for each role's message besides role and content (and an
# assistant's `annotations`, from its response's message): any other key is refused by
# name (a typo, or a field of another API), never ignored
_SPOKEN = frozenset({"name"})
MESSAGE_FIELDS: dict[str, frozenset[str]] = {
    "system": _SPOKEN, "developer": _SPOKEN, "user": _SPOKEN,
    "assistant": _SPOKEN | {"tool_calls", "function_call", "refusal", "audio", "annotations"},
    "tool": frozenset({"tool_call_id"})}
# null on any message asks nothing (a client's one message type serializes them all)
_ANY_ROLE: frozenset[str] = frozenset().union(*MESSAGE_FIELDS.values())
# defined by OpenAI, not implemented here: refused unless null. The chat templates take a
# role and a text per message only: nowhere to put a participant's name, and an earlier
# refusal or spoken answer (`audio`) would have to be made up as text
_UNSUPPORTED = {
    "name": "a chat template takes each message's role and text, with no place for a "
            "participant's name",
    "refusal": "an earlier refusal is not read: send its text as the content",
    "audio": "an earlier spoken answer is not read: send its transcript as the content",
    # a response's message replayed as sent (the official client's `model_dump()`)
    "annotations": "an earlier answer's citations are not read"}
MAX_TOKENS = 1_000_000  # the worker's own ceiling (a context is far smaller)


# more than any context holds (each message takes a few tokens): 462,607 messages in
# one 15 MiB body were checked and keyed for 9 s on the PoP's loop
MAX_MESSAGES = 8192


def check_messages(messages: list[dict[str, Any]], roles: frozenset[str] = ROLES,
                   roles_fields: frozenset[str] = TOOL_FIELDS) -> None:
    """Raises `ApiError` (400) naming the first bad message field: an empty list,
    more messages than any context holds (``context_length_exceeded``), a role
    outside `roles`, a tool call field not in `roles_fields` (the tool calls of an
    assistant message), a ``tool`` message that answers no call of the assistant
    message before it (its ``tool_call_id`` missing or naming none of them), a key
    OpenAI does not define for the message's role or one that asks for what this
    server does not implement (``name``; `_check_keys`), content that is neither text
    nor a list of parts."""
    if not messages:
        raise ApiError("invalid_request", 400, "'messages' must not be empty", "messages")
    if len(messages) > MAX_MESSAGES:
        raise ApiError("context_length_exceeded", 400, f"'messages' has {len(messages)} "
                       f"messages; at most {MAX_MESSAGES} are taken", "messages")
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in roles:
            why = _NEEDS_TOOLS.get(role) if isinstance(role, str) else None
            raise ApiError("invalid_value", 400, why or f"messages[{i}].role must be one of "
                           f"{', '.join(sorted(roles))}; got {role!r}", f"messages[{i}].role")
        for key in _TOOL_FIELDS:
            if message.get(key) is not None and key not in roles_fields:
                raise ApiError("unsupported_parameter", 400, f"messages[{i}].{key} is not "
                               f"taken (use {', '.join(sorted(roles_fields)) or 'plain text'})",
                               f"messages[{i}].{key}")
        if len(message) > 2 or "role" not in message or "content" not in message:
            _check_keys(message, i, role)
        calls = message.get("tool_calls")
        if calls is not None and "tool_calls" in roles_fields:
            _check_tool_calls(calls, f"messages[{i}].tool_calls")
        if role == "tool" and "tool_call_id" in roles_fields:
            _check_answer(messages, i)
        content = message.get("content")
        if not isinstance(content, (str, list)) and not (role == "assistant" and content is None):
            raise ApiError("invalid_value", 400, f"messages[{i}].content must be a string or "
                           f"a list of content parts", f"messages[{i}].content")


_TOOL_FIELDS = ("tool_calls", "function_call", "tool_call_id")


def _check_keys(message: dict[str, Any], i: int, role: str) -> None:
    """Raises `ApiError` (400, ``param`` ``messages[i].<key>``) for a key OpenAI does
    not define for a `role` message (``unrecognized_argument``; null is taken for a
    key it defines for another role) and for one this server does not implement
    that asks for something (``unsupported_parameter``)."""
    taken = MESSAGE_FIELDS.get(role, frozenset())
    for key, value in message.items():
        if key == "role" or key == "content":
            continue
        where = f"messages[{i}].{key}"
        if key not in taken and (value is not None or key not in _ANY_ROLE):
            raise ApiError("unrecognized_argument", 400, f"Unrecognized request argument "
                           f"supplied: {where} (a message of role {role!r} takes role, content"
                           f"{''.join(', ' + k for k in sorted(taken))})", where)
        why = _UNSUPPORTED.get(key)
        if why is not None and value is not None and value != []:
            raise ApiError("unsupported_parameter", 400, f"{where} is not supported by this "
                           f"server ({why}); leave it out or set it to null", where)


def _check_tool_calls(calls: Any, where: str) -> None:
    """Raises `ApiError` (400) unless `calls` is OpenAI's list of
    ``{"id", "type": "function", "function": {"name", "arguments"}}``."""
    if not isinstance(calls, list):
        raise ApiError("invalid_value", 400, f"{where} must be a list", where)
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                or not isinstance(fn.get("arguments", ""), str):
            raise ApiError("invalid_value", 400, f"{where}[{j}] must be an object whose "
                           "'function' is {\"name\": string, \"arguments\": string}",
                           f"{where}[{j}].function")


def _check_answer(messages: list[dict[str, Any]], i: int) -> None:
    """Raises `ApiError` (400) unless ``tool`` message `i` answers, by its
    ``tool_call_id``, a call of the assistant message with ``tool_calls`` before it
    (only other ``tool`` messages between them), as OpenAI requires."""
    call_id = messages[i].get("tool_call_id")
    where = f"messages[{i}].tool_call_id"
    if not isinstance(call_id, str):
        raise ApiError("invalid_value", 400, f"{where} must be the id of the tool call it "
                       f"answers (a string); got {'none' if call_id is None else call_id!r}",
                       where)
    j = i - 1
    while j >= 0 and messages[j].get("role") == "tool":
        j -= 1
    calls = messages[j].get("tool_calls") if j >= 0 and \
        messages[j].get("role") == "assistant" else None
    if not isinstance(calls, list) or not calls:
        raise ApiError("invalid_value", 400, f"messages[{i}]: a 'tool' message must answer "
                       "the 'tool_calls' of the assistant message before it",
                       f"messages[{i}].role")
    if call_id not in {c.get("id") for c in calls if isinstance(c, dict)}:
        raise ApiError("invalid_value", 400, f"{where} {call_id!r} names none of the calls "
                       f"in messages[{j}].tool_calls", where)


def _range(name: str, value: float | None, low: float, high: float) -> None:
    if value is None or low <= value <= high:
        return
    raise ApiError("invalid_value", 400, f"{name} must be in [{low:g}, {high:g}], got "
                   f"{value!r}", name)  # as sent: 1.0000001 read "got 1"


def check_sampling(n: int, temperature: float, top_p: float, max_tokens: int | None,
                   max_tokens_name: str, stops: int) -> None:
    """Raises `ApiError` (400) naming the first parameter out of OpenAI's range."""
    _range("n", n, 1, MAX_N)
    _range("temperature", temperature, 0, 2)
    _range("top_p", top_p, 0, 1)  # OpenAI's [0, 1]: 0 keeps the likeliest token
    if max_tokens is not None and not 1 <= max_tokens <= MAX_TOKENS:
        raise ApiError("invalid_value", 400, f"{max_tokens_name} must be between 1 and "
                       f"{MAX_TOKENS}, got {max_tokens}", max_tokens_name)
    if stops > MAX_STOPS:
        raise ApiError("invalid_request", 400, f"'stop' takes at most {MAX_STOPS} sequences, "
                       f"got {stops}", "stop")
