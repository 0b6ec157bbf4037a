"""The OpenAI API's error shape, ``{"error": {"message", "type", "param", "code"}}``:
the `type` each status gets, and the `param` a validation message is about.

Types follow OpenAI's own API: 401 ``authentication_error``, 403
``permission_error``, 429 ``rate_limit_error``, 5xx ``server_error``, and every
other 4xx (400, 404, 405, 413, 415, 422) ``invalid_request_error`` -- OpenAI
answers an unknown model (404 ``model_not_found``) and an unknown URL with
``invalid_request_error`` too; clients pick their exception by status
(``openai.NotFoundError``), not by type.
"""

from __future__ import annotations

import re

from edgefn_core.errors import ApiError
from runtime.net.message import Response, json_response

_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}
OVERLOADED_RETRY = b"2"  # seconds: Retry-After of a 503 ``overloaded``
# msgspec: ``Expected `str`, got `int` - at `$.messages[0].role` ``
_AT = re.compile(r" - at `\$\.?([^`]*)`$")
_MISSING = re.compile(r"Object missing required field `([^`]+)`")
_UNKNOWN = re.compile(r"Object contains unknown field `([^`]+)`")


def error_type(status: int) -> str:
    """OpenAI's error `type` for an HTTP `status`."""
    if status in _TYPES:
        return _TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "server_error"


def error_response(status: int, message: str, code: str | None = None,
                   param: str | None = None) -> Response:
    """OpenAI's error body; the code also goes in ``x-edgefn-error`` (as the PoP's own
    errors do), where the request's event reads it."""
    headers = [(b"x-edgefn-error", code.encode())] if code else []
    if code == "overloaded":  # the model worker had no room: OpenAI's clients retry
        headers.append((b"retry-after", OVERLOADED_RETRY))  # a 503 after this long
    return json_response({"error": {"message": message, "type": error_type(status),
                                    "param": param, "code": code}}, status, headers)


def param_of(error: str) -> str | None:
    """The field a msgspec validation error is about, as OpenAI names it:
    ``messages[0].role`` for ``... - at `$.messages[0].role` ``, and a missing
    or unknown field joined to where it was missing (``messages[1].content``)."""
    at = _AT.search(error)
    where = at[1] if at else ""
    named = _MISSING.match(error) or _UNKNOWN.match(error)
    if named is not None:
        return f"{where}.{named[1]}" if where else named[1]
    return where or None


_QUOTED = re.compile(r"^'([a-z_]+)'((?:\[\d+\])*)")  # "'input' must not be empty", "'input'[1] ..."
# "input[0] is an empty string", "logit_bias: token ...", "messages[0].content[1] is ..."
_FIELD = re.compile(r"^([a-z_]+)((?:\[\d+\])*(?:\.[a-z_]+(?:\[\d+\])*)*):? ")
_WORKER_FIELDS = frozenset({"input", "documents", "query", "prompt", "messages", "model",
                            "max_tokens", "top_n", "logit_bias", "tools", "response_format"})


def worker_param(message: str) -> str | None:
    """The request field a model worker's refusal names at its start, its whole path
    (``'input' must not be empty``, ``input[0] is an empty string``, ``model 'x' does
    not embed``, ``messages[0].content[1] is not a text part``, ``the prompt is
    empty``), or None: OpenAI's errors carry it in ``param``."""
    if message == "the prompt is empty":
        return "prompt"
    quoted = _QUOTED.match(message)
    if quoted and quoted[1] in _WORKER_FIELDS:
        return quoted[1] + quoted[2]
    field = _FIELD.match(message)
    if field and field[1] in _WORKER_FIELDS:
        return field[1] + field[2]
    return None


def validation_error(error: str) -> ApiError:
    """The 400 for a msgspec validation `error` of a request body; an unknown
    top-level field reads as OpenAI's ``Unrecognized request argument supplied``."""
    param = param_of(error)
    unknown = _UNKNOWN.match(error)
    if unknown is not None and param == unknown[1]:
        return ApiError("unrecognized_argument", 400,
                        f"Unrecognized request argument supplied: {param}", param)
    return ApiError("invalid_value", 400, f"invalid request: {error}", param)


def unknown_url(method: str, path: str) -> ApiError:
    """OpenAI's answer to a path it does not serve (404)."""
    return ApiError("unknown_url", 404, f"Invalid URL ({method} {path})")


class MethodNotAllowed(ApiError):
    """A 405; `allow` goes in its ``Allow`` header (RFC 9110 15.5.6)."""

    def __init__(self, path: str, allow: str) -> None:
        super().__init__("method_not_allowed", 405, f"use {allow.split(',')[0]} {path}")
        self.allow = allow


def api_off(method: str, path: str) -> ApiError:
    """The 404 of a PoP that runs no model worker (``--no-ai``, ``[ai] enabled = false``)."""
    return ApiError("api_disabled", 404, f"the OpenAI API is off on this PoP ([ai] enabled = "
                    f"false or --no-ai): {method} {path}")
