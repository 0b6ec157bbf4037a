"""OTLP trace messages (opentelemetry-proto's ``trace/v1`` and ``collector/trace/v1``)
written as protobuf bytes directly: a span is a few `bytes` joins, where the SDK's
span objects and its encoder took ~30 us a span (an attribute ~2.5 us as upb
messages; the resource's hash, a JSON dump, once per span). Pure functions; the
tests decode what they write with opentelemetry-proto's own classes.

    ExportTraceServiceRequest    1: ResourceSpans                      (`request`)
    ResourceSpans                1: Resource, 2: ScopeSpans
    Resource                     1: KeyValue                           (`resource`)
    ScopeSpans                   1: InstrumentationScope, 2: Span      (`scope`)
    Span                         (`span`: the fields below, by number)
    KeyValue                     1: key, 2: AnyValue                   (`attributes`)
    AnyValue                     1 string, 2 bool, 3 int64, 4 double, 5 ArrayValue
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

SPAN_INTERNAL, SPAN_SERVER, SPAN_CLIENT = 1, 2, 3  # Span.SpanKind
STATUS_UNSET, STATUS_ERROR = 0, 2  # Status.StatusCode
# SpanFlags: the "is remote" bit below is meaningful (as the SDK's encoder sets it)
HAS_IS_REMOTE, IS_REMOTE = 0x100, 0x200

_fixed64 = struct.Struct("<Q").pack
_double = struct.Struct("<d").pack
_fixed32 = struct.Struct("<I").pack
_times = struct.Struct("<BQBQ").pack  # Span's start and end (fields 7 and 8, fixed64)
_SCALAR = (str, bool, int, float)
_keys: dict[str, bytes] = {}  # an attribute key, encoded as KeyValue's field 1
_names: dict[str, bytes] = {}  # a span name, encoded as Span's field 5


def varint(n: int) -> bytes:
    """`n` (>= 0; a negative int64 as its two's complement) as a base-128 varint."""
    if n < 0:
        n += 1 << 64
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its `tag` byte(s), the length, `payload`."""
    n = len(payload)
    return tag + (bytes((n,)) if n < 0x80 else varint(n)) + payload


def _text(tag: bytes, s: str) -> bytes:
    """A string field (a lone surrogate, which UTF-8 cannot hold, as "?")."""
    return field(tag, s.encode("utf-8", "replace"))


def any_value(value: Any) -> bytes | None:
    """An AnyValue of a str, bool, int (int64), float, or a list of one of those;
    None for anything else (the SDK drops such an attribute too)."""
    t = type(value)
    if t is str:
        return _text(b"\x0a", value)
    if t is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if t is int:
        return b"\x18" + varint(value) if -(1 << 63) <= value < 1 << 63 else None
    if t is float:
        return b"\x21" + _double(value)
    if (t is list or t is tuple) and len({type(v) for v in value}) <= 1 and \
            (not value or type(value[0]) in _SCALAR):  # one scalar type, as the SDK's
        values = [any_value(v) for v in value]
        if any(v is None for v in values):  # (an int past int64)
            return None
        return field(b"\x2a", b"".join(field(b"\x0a", v) for v in values if v is not None))
    return None


def attributes(tag: bytes, attrs: Mapping[str, Any]) -> bytes:
    """Repeated KeyValue fields numbered by `tag`; None values left out."""
    out = []
    keys = _keys
    for key, value in attrs.items():
        v = any_value(value)
        if v is None:
            continue
        k = keys.get(key)
        if k is None:
            k = _text(b"\x0a", key) if key else b""
            if len(keys) < 4096:  # (the keys are the code's: a few dozen)
                keys[key] = k
        out.append(field(tag, k + field(b"\x12", v)))
    return b"".join(out)


def span(trace_id: bytes, span_id: bytes, parent_id: bytes, trace_state: str, name: str,
         kind: int, start: int, end: int, attrs: bytes = b"", events: bytes = b"",
         status: int = STATUS_UNSET, message: str = "", flags: int = HAS_IS_REMOTE) -> bytes:
    """One Span message: `attrs` as `attributes(b"\\x4a", ...)` writes them, `events`
    as `event` does; times in ns since the epoch; `kind` a SpanKind (< 128)."""
    named = _names.get(name)
    if named is None:
        named = _text(b"\x2a", name) if name else b""  # (proto3 writes no empty string)
        if len(_names) < 4096:  # span names are few (routes, stages, models)
            _names[name] = named
    if status or message:
        ended = field(b"\x7a", (_text(b"\x12", message) if message else b"")
                      + (b"\x18" + varint(status) if status else b""))
    else:
        ended = b"\x7a\x00"  # an unset status (as the SDK's spans have)
    return b"".join((
        b"\x0a\x10", trace_id, b"\x12\x08", span_id,
        _text(b"\x1a", trace_state) if trace_state else b"",
        b"\x22\x08" + parent_id if parent_id else b"", named, b"\x30", bytes((kind,)),
        _times(0x39, start, 0x41, end) if start and end else
        (b"\x39" + _fixed64(start) if start else b"") + (b"\x41" + _fixed64(end) if end else b""),
        attrs, events, ended, b"\x85\x01" + _fixed32(flags) if flags else b""))


def event(name: str, at: int) -> bytes:
    """A Span.Event field (11) without attributes, at `at` ns since the epoch."""
    return field(b"\x5a", (b"\x09" + _fixed64(at) if at else b"")
                 + (_text(b"\x12", name) if name else b""))


def resource(attrs: Mapping[str, Any]) -> bytes:
    """ResourceSpans' field 1: a Resource of `attrs`."""
    return field(b"\x0a", attributes(b"\x0a", attrs))


def scope(name: str) -> bytes:
    """ScopeSpans' field 1: an InstrumentationScope named `name`."""
    return field(b"\x0a", _text(b"\x0a", name))


def entries(spans: Iterable[bytes]) -> bytes:
    """`spans` (each a `span`'s message) as ScopeSpans' repeated field 2: what
    `request` joins."""
    return b"".join(field(b"\x12", s) for s in spans)


def request(resource_field: bytes, scope_field: bytes, spans: Iterable[bytes]) -> bytes:
    """An ExportTraceServiceRequest of one resource and one scope holding the spans
    of `spans`, each as `entries` wrote them."""
    scope_spans = scope_field + b"".join(spans)
    return field(b"\x0a", resource_field + field(b"\x12", scope_spans))
