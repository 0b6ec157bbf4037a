"""Which request fields the OpenAI API honours and which it refuses: nothing a
client sends is silently ignored.

A field is *honoured* when the endpoint's body struct declares it (its
``__struct_fields__``; adding a field there honours it). A field OpenAI defines
that this PoP does not implement is *refused* -- a 400 whose ``param`` names
it -- unless its value asks for nothing (``"logprobs": false``,
``"tools": []``, ``"presence_penalty": 0``: what OpenAI does by default, which
some clients send explicitly), and so is a field of a declared one
(``stream_options.include_obfuscation``: false only). ``metadata``, OpenAI's tags
on a stored completion that change no answer, is taken within OpenAI's bounds.
Any other field is OpenAI's 400 ``Unrecognized request argument supplied``.

The same checks name the field of a bad message (``messages[2].role``) and of
a sampling parameter out of range, before the request reaches the worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from edgefn_core.errors import ApiError
from edgefn_core.hostcall import huge_numbers

MAX_N = 8  # choices per request; each is a sequence slot of the model's batch
MAX_STOPS = 4  # as OpenAI's API
_KEYS = msgspec.json.Decoder(dict[str, msgspec.Raw])  # top-level fields, values left raw


def _none(v: Any) -> bool:
    return v is None


def _falsy(v: Any) -> bool:
    return v is None or v is False or v == [] or v == {}


def _zero(v: Any) -> bool:
    return v is None or v == 0


MAX_TAGS, MAX_TAG_KEY, MAX_TAG_VALUE = 16, 64, 512  # OpenAI's bounds on `metadata`


def _tags(v: Any) -> bool:
    """`metadata`: OpenAI's tags on a stored completion (``store``, refused here),
    which change nothing in the answer: taken within OpenAI's bounds. Raises
    `ApiError` (400 naming ``metadata``) past them."""
    if v is None:
        return True
    if not isinstance(v, dict) or not all(isinstance(x, str) for x in v.values()):
        raise ApiError("invalid_type", 400, "'metadata' must be an object of string keys "
                       "and string values", "metadata")
    if len(v) > MAX_TAGS:
        raise ApiError("invalid_value", 400, f"'metadata' has {len(v)} keys; at most "
                       f"{MAX_TAGS} are taken", "metadata")
    for key, value in v.items():
        if len(key) > MAX_TAG_KEY:
            raise ApiError("invalid_value", 400, f"'metadata' key {key[:MAX_TAG_KEY]!r}... has "
                           f"{len(key)} characters; at most {MAX_TAG_KEY}", "metadata")
        if len(value) > MAX_TAG_VALUE:
            raise ApiError("invalid_value", 400, f"'metadata' value of {key!r} has "
                           f"{len(value)} characters; at most {MAX_TAG_VALUE}", "metadata")
    return True


# OpenAI's fields this PoP does not implement, with the values that ask for nothing.
_INERT: dict[str, Callable[[Any], bool]] = {
    "response_format": lambda v: v is None or v == {"type": "text"},
    "tools": _falsy, "tool_choice": lambda v: v in (None, "none"), "parallel_tool_calls": _none,
    "functions": _falsy, "function_call": lambda v: v in (None, "none"),
    "logprobs": _falsy, "top_logprobs": _zero,
    "presence_penalty": _zero, "frequency_penalty": _zero, "logit_bias": _falsy,
    "audio": _none, "modalities": lambda v: v is None or v == ["text"], "prediction": _none,
    "reasoning_effort": _none, "verbosity": _none, "web_search_options": _none,
    "moderation": _none, "store": _falsy, "metadata": _tags,
    "service_tier": lambda v: v in (None, "auto", "default"),  # one tier here
    "prompt_cache_key": _none, "prompt_cache_retention": _none, "prompt_cache_options": _none,
    "best_of": lambda v: v in (None, 1), "echo": _falsy, "suffix": _none,
}
# the fields inside a field the body struct declares that OpenAI defines and this PoP
# does not implement, with the values that ask for nothing. Stream obfuscation (OpenAI's
# random `obfuscation` padding on each chunk, on there by default): these streams have none
_NESTED_INERT: dict[str, dict[str, Callable[[Any], bool]]] = {
    "stream_options": {"include_obfuscation": lambda v: v is not True}}
_WHY = {"tools": "tool calling", "tool_choice": "tool calling", "response_format":
        "structured output", "logprobs": "log probabilities", "top_logprobs":
        "log probabilities", "functions": "function calling (deprecated by OpenAI: use tools)",
        "function_call": "function calling (deprecated by OpenAI: use tools)",
        "stream_options.include_obfuscation": "stream obfuscation: no chunk is padded"}


def check_fields(body: bytes, kind: type[msgspec.Struct]) -> None:
    """Raises `ApiError` (400, ``param`` the field) for a field of `body` that
    `kind` does not declare and that asks for something (or, for ``metadata``, is
    past OpenAI's bounds), and for one in `_NESTED_INERT` that asks for something.
    A body that is not a JSON object is left to the typed decode to refuse; one
    holding numbers too slow to parse is refused before any decode
    (`hostcall.huge_numbers`: 7 MB of ``1e300`` in a tool's parameters held the
    PoP's loop ~20 s, for any client)."""
    why = huge_numbers(body)
    if why is not None:
        raise ApiError("invalid_request", 400, f"the request body is refused unread: {why}")
    try:
        fields = _KEYS.decode(body)
    except (msgspec.MsgspecError, RecursionError):  # nested too deeply: the typed decode's
        return  # 400 too
    honoured = kind.__struct_fields__
    for name, raw in fields.items():
        if name in honoured:
            if name in _NESTED_INERT:
                _check_nested(name, raw, _NESTED_INERT[name])
            continue
        inert = _INERT.get(name)
        if inert is None:
            raise ApiError("unrecognized_argument", 400,
                           f"Unrecognized request argument supplied: {name}", name)
        if not inert(_value(name, raw)):
            _refuse(name)


def _value(name: str, raw: msgspec.Raw) -> Any:
    try:
        return msgspec.json.decode(raw)
    except RecursionError:
        raise ApiError("invalid_json", 400, f"{name!r} is nested too deeply", name) from None


def _refuse(name: str, instead: str = "null") -> None:
    what = _WHY.get(name, name)
    raise ApiError("unsupported_parameter", 400, f"{name!r} is not supported by this "
                   f"server ({what}); leave it out or set it to {instead}", name)


def _check_nested(name: str, raw: msgspec.Raw, inert: dict[str, Callable[[Any], bool]]
                  ) -> None:
    """Raises `ApiError` (``param`` ``<name>.<field>``) for a field of object `name`
    in `inert` that asks for something (another shape is the typed decode's 400)."""
    value = _value(name, raw)
    if isinstance(value, dict):
        for field, asks_nothing in inert.items():
            if field in value and not asks_nothing(value[field]):
                _refuse(f"{name}.{field}", "false")


def refusal(body: bytes, kind: type[msgspec.Struct]) -> ApiError | None:
    """`check_fields`'s refusal of `body`, or None (for the caches: never answer a
    request the API would refuse)."""
    try:
        check_fields(body, kind)
    except ApiError as e:
        return e
    return None
