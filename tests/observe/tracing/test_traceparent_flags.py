"""`traceparent.parse` reads the W3C header as the spec says: only bit 0 of the
flags is "sampled" (``02``, a flag a later spec may define, is not sampled), and
version 00 has exactly four fields (one more makes the header invalid: a new
trace), while a later version may carry more after them."""

from __future__ import annotations

import pytest

from runtime.observe.traceparent import parse

TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def header(version: str = "00", flags: str = "01", rest: str = "") -> bytes:
    return f"{version}-{TRACE}-{SPAN}-{flags}{rest}".encode()


@pytest.mark.parametrize(("flags", "sampled"), [("00", False), ("01", True), ("02", False),
                                                ("03", True), ("fe", False), ("ff", True)])
def test_only_the_low_bit_of_the_flags_is_sampled(flags: str, sampled: bool) -> None:
    parent = parse(header(flags=flags))
    assert parent is not None
    assert (parent.trace_id, parent.span_id, parent.sampled) == (TRACE, SPAN, sampled)


@pytest.mark.parametrize("rest", ["-extra", "-", "-00"])
def test_version_00_with_a_field_more_is_invalid(rest: str) -> None:
    assert parse(header(rest=rest)) is None
    assert parse(header()) is not None  # the same header without it


def test_a_later_version_may_have_fields_after_the_four() -> None:
    parent = parse(header(version="01", flags="01", rest="-extra"))
    assert parent is not None and (parent.trace_id, parent.sampled) == (TRACE, True)
