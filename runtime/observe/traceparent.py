"""W3C Trace Context (https://www.w3.org/TR/trace-context/): parse and format
``traceparent``. Pure functions on bytes; nothing here raises."""

from __future__ import annotations

import re
import secrets
from typing import Any

# version 00 (later versions: the first four fields, anything after); all-zero ids are invalid
_PARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_ZERO_TRACE, _ZERO_SPAN = b"0" * 32, b"0" * 16


class Parent:
    """A valid incoming ``traceparent``: its trace id, the caller's span id, sampled."""

    __slots__ = ("sampled", "span_id", "trace_id")

    def __init__(self, trace_id: str, span_id: str, sampled: bool) -> None:
        self.trace_id, self.span_id, self.sampled = trace_id, span_id, sampled


def parse(value: bytes | None) -> Parent | None:
    """The parent a ``traceparent`` header names, or None when absent or invalid
    (then the request starts a new trace)."""
    if value is None:
        return None
    m = _PARENT.fullmatch(value.strip())
    if m is None:
        return None
    version, trace, span, flags, rest = m.groups()
    if version == b"ff" or (version == b"00" and rest) or trace == _ZERO_TRACE \
            or span == _ZERO_SPAN:
        return None
    return Parent(trace.decode(), span.decode(), bool(int(flags, 16) & 1))


def new_trace_id() -> str:
    return secrets.token_hex(16)


def new_span_id() -> str:
    return secrets.token_hex(8)


def format_parent(trace_id: str, span_id: str, sampled: bool) -> bytes:
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}".encode()


def traceparent_of(decisions: dict[str, Any] | None) -> str | None:
    """The ``traceparent`` naming the request's server span, for the calls it
    makes (model worker, upstream, fetch); None when tracing is off."""
    record = decisions.get("trace") if decisions is not None else None
    if not isinstance(record, dict):
        return None
    return format_parent(record["trace_id"], record["span_id"], record["sampled"]).decode()
