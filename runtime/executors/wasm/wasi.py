"""CGI (WAGI-style) request environment and response parsing for WASI command modules.

What a route captured arrives as variables too: ``EDGEFN_PARAM_<NAME>`` per
capture, the name upper-cased (``/users/:id`` on ``/users/42`` sets
``EDGEFN_PARAM_ID=42``), and ``EDGEFN_WILDCARD`` for the rest a final ``/*``
matched. Values are as raw as ``PATH_INFO`` (still percent-encoded).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from edgefn_core.abi import (
    MAX_HEAD_BYTES,
    MAX_HEAD_FIELDS,
    TOKEN,
    WILDCARD,
    bad_value,
    check_head_size,
)
from edgefn_core.errors import FunctionError
from runtime.net.message import Request

_SKIP = frozenset({b"content-length", b"content-type", b"authorization"})
# the end of the header block: the first empty line, LF or CRLF each ("\r\n\r\n" after
# a body's "\n\n" split the body as headers when "\n\n" was looked for first)
_BLANK_LINE = re.compile(rb"\r?\n\r?\n")
_FIRST_BLANK = re.compile(rb"\r?\n")  # (matched at the start only)
# the raw header block (names, values, colons, padding, line ends) a command may write:
# what its fields may hold (`MAX_HEAD_BYTES`, `MAX_HEAD_FIELDS`) and room for the rest
MAX_CGI_HEAD = 2 * MAX_HEAD_BYTES


def environ(request: Request, route: str, env: dict[str, str], params: Mapping[str, str],
            principal: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """The CGI variables for `request`, its route's `params` and the caller's
    `principal` (``EDGEFN_PRINCIPAL_TENANT``, ...; ``REMOTE_USER`` is the tenant),
    the request's bytes as UTF-8 (`_text`),
    after the manifest's `env` less the names the request sets: a guest's getenv
    finds the first entry, so the manifest must not shadow a request variable (a new
    deploy is refused such a name: `manifest.wasi_env_problem`; a stored version may
    have one)."""
    text = _text
    out = [
        ("REQUEST_METHOD", text(request.method)),
        ("PATH_INFO", text(request.path)),
        ("QUERY_STRING", text(request.query)),
        ("SERVER_PROTOCOL", f"HTTP/{request.http_version}"),
        ("CONTENT_LENGTH", str(len(request.body))),
        ("CONTENT_TYPE", ""),
        ("X_MATCHED_ROUTE", route),
        ("REMOTE_ADDR", request.client.rsplit(":", 1)[0]),
    ]
    keys, typed = _KEYS, False
    for name, value in request.headers:
        key = keys.get(name)
        if key is None:
            key = _key(name)
        if key:
            out.append((key, text(value)))
        elif name == b"content-type" and not typed:  # the first one, as `header` reads
            out[5], typed = ("CONTENT_TYPE", text(value)), True
    if params:  # the router's captures are the raw path's bytes as latin-1 text, as PATH_INFO is
        out += [(param_variable(k), text(v.encode("latin-1"))) for k, v in params.items()]
    if principal:
        out += [(f"EDGEFN_PRINCIPAL_{k.upper()}", v) for k, v in principal.items()]
        if "tenant" in principal:
            out.append(("REMOTE_USER", principal["tenant"]))
    if not env:
        return out
    taken = {k for k, _ in out}
    return [(k, v) for k, v in env.items() if k not in taken] + out


# a header name's variable (HTTP_X_A), or "" for those it does not get (`_SKIP`): made
# once per distinct name, at most `_KEYS_MAX` of them kept
_KEYS: dict[bytes, str] = {}
_KEYS_MAX = 4096


def _key(name: bytes) -> str:
    key = "" if name in _SKIP else "HTTP_" + _text(name).upper().replace("-", "_")
    if len(_KEYS) >= _KEYS_MAX:
        _KEYS.clear()
    _KEYS[name] = key
    return key


def _text(raw: bytes) -> str:
    """What the guest gets for bytes of the request: wasmtime passes the environment as
    UTF-8, so valid UTF-8 arrives byte for byte (latin-1 text arrived double-encoded:
    ``café`` as ``cafÃ©``) and an invalid sequence as U+FFFD (README "Guest ABI")."""
    return raw.decode("utf-8", "replace")


def param_variable(name: str) -> str:
    """The variable a capture named `name` arrives in (``*``: ``EDGEFN_WILDCARD``)."""
    return "EDGEFN_WILDCARD" if name == WILDCARD else f"EDGEFN_PARAM_{name.upper()}"


def parse_response(output: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Split CGI output into status, headers and body.

    The header block ends at the first empty line, whether its lines end in LF or
    CRLF (a body may hold either). Raises `FunctionError` (``bad_response``, 502)
    when the header block is missing, empty or malformed, or past `MAX_CGI_HEAD`
    bytes or `MAX_HEAD_FIELDS` lines.
    """
    if _FIRST_BLANK.match(output):  # (it said "no blank line", of a blank first line)
        raise FunctionError("bad_response", 502, "CGI output starts with a blank line: "
                            "write a header line (Content-Type, Status or Location; RFC "
                            "3875 6.2) before the blank line that ends them")
    end = _BLANK_LINE.search(output)  # the first one, however its line ends are written
    if end is None:
        raise FunctionError("bad_response", 502,
                            "CGI output has no blank line ending its headers")
    head, body = output[:end.start()], output[end.end():]
    if len(head) > MAX_CGI_HEAD:  # before it is split: 5 million lines held the loop 4 s
        raise FunctionError("bad_response", 502, f"CGI header block of {len(head)} bytes: "
                            f"more than {MAX_CGI_HEAD}")
    lines = head.replace(b"\r\n", b"\n").split(b"\n")
    if len(lines) > MAX_HEAD_FIELDS:
        raise FunctionError("bad_response", 502, f"CGI output has {len(lines)} header "
                            f"lines: more than {MAX_HEAD_FIELDS}")
    status = size = 0
    headers: list[tuple[bytes, bytes]] = []
    for line in lines:
        name, colon, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip()
        # `HEADER_NAME` and `BAD_HEADER_VALUE`, as bytes methods (`abi.check_header`'s)
        if not colon or not name or name.translate(None, TOKEN) or \
                bad_value(value):
            raise FunctionError("bad_response", 502, f"invalid CGI header line {line[:80]!r}")
        if name == b"status":
            status = _status(value)
        else:
            headers.append((name, value))
            size += len(name) + len(value)
    check_head_size(headers, size)
    if not status:
        status = 302 if any(k == b"location" for k, _ in headers) else 200
    return status, headers, body


def _status(value: bytes) -> int:
    code = value.split(b" ", 1)[0]
    if not code.isdigit() or not 200 <= int(code) <= 599:
        raise FunctionError("bad_response", 502, f"invalid CGI Status {value[:40]!r}")
    return int(code)
