"""CGI (WAGI-style) request environment and response parsing for WASI command modules."""

from __future__ import annotations

from edgefn_core.abi import BAD_HEADER_VALUE, HEADER_NAME
from edgefn_core.errors import FunctionError
from runtime.net.message import Request

_SKIP = frozenset({b"content-length", b"content-type", b"authorization"})


def environ(request: Request, route: str, env: dict[str, str]) -> list[tuple[str, str]]:
    """The CGI variables for `request`; the manifest's `env` comes first so it cannot
    shadow request variables."""
    out = list(env.items())
    out += [
        ("REQUEST_METHOD", request.method.decode("latin-1")),
        ("PATH_INFO", request.path.decode("latin-1")),
        ("QUERY_STRING", request.query.decode("latin-1")),
        ("SERVER_PROTOCOL", f"HTTP/{request.http_version}"),
        ("CONTENT_LENGTH", str(len(request.body))),
        ("CONTENT_TYPE", (request.header(b"content-type") or b"").decode("latin-1")),
        ("X_MATCHED_ROUTE", route),
        ("REMOTE_ADDR", request.client.rsplit(":", 1)[0]),
    ]
    for name, value in request.headers:
        if name not in _SKIP:
            key = "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
            out.append((key, value.decode("latin-1")))
    return out


def parse_response(output: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Split CGI output into status, headers and body.

    Raises `FunctionError` (``bad_response``, 502) when the header block is
    missing or malformed.
    """
    head, sep, body = output.partition(b"\n\n")
    if not sep:
        head, sep, body = output.partition(b"\r\n\r\n")
    if not sep:
        raise FunctionError("bad_response", 502,
                            "CGI output has no blank line ending its headers")
    status = 0
    headers: list[tuple[bytes, bytes]] = []
    for line in head.replace(b"\r\n", b"\n").split(b"\n"):
        name, colon, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip()
        if not colon or not HEADER_NAME.match(name) or BAD_HEADER_VALUE.search(value):
            raise FunctionError("bad_response", 502, f"invalid CGI header line {line[:80]!r}")
        if name == b"status":
            status = _status(value)
        else:
            headers.append((name, value))
    if not status:
        status = 302 if any(k == b"location" for k, _ in headers) else 200
    return status, headers, body


def _status(value: bytes) -> int:
    code = value.split(b" ", 1)[0]
    if not code.isdigit() or not 100 <= int(code) <= 599:
        raise FunctionError("bad_response", 502, f"invalid CGI Status {value[:40]!r}")
    return int(code)
