"""What one host call's arguments may be: a WASM guest's ``call(name, args)`` JSON
read from its memory, a Python isolate's CALL frame.

The PoP parses them holding the GIL, in one C call no other thread interrupts: a
crafted call of 60 MiB of ``[1,1,...]`` froze every tenant's requests for 2 s, and
30 MiB of ``[{},{},...]`` also took 810 MB. So a call is bounded in bytes (a KV
value at its largest, 16 MiB, base64-encoded, and room), in how many JSON objects
and arrays, values and keys it holds and in the length of its numbers, counted
before parsing: what makes a parse slow is many objects, values or distinct keys,
numbers of thousands of digits or with exponents near 1e308, more than bytes. The
PoP checks where a call arrives; the Python SDK checks first, so that a function gets
`BindingError` saying why.

A Python isolate sends a KV value raw, after its call's JSON (`wire.CALL_VALUE`): only
the JSON is scanned and parsed, and the value counts in its size as the base64 it
was in JSON, so that what passes, and what is refused and how, is as before.

Stdlib-only, importing nothing of edgefn's: isolates import it too.
"""

from __future__ import annotations

MAX_BYTES = 24 << 20  # a 16 MiB KV value in base64 is 21.3 MiB
MAX_CONTAINERS = 200_000  # JSON objects and arrays (20,000 vectors with metadata: 60,000)
MAX_VALUES = 1_000_000  # values in them, by their separators (2,600 vectors of 384 floats)
MAX_KEYS = 100_000  # object keys, by their colons: a dict of 999k distinct keys took 0.3-0.5 s
MAX_DIGITS = 64  # in a row: a number of 4,299 digits parses in quadratic time
# numbers with a positive exponent of 3 digits or more: msgspec parses one of
# 1e288..1e308 in ~10 us where 1.5 takes 0.05 (a call of 900,000 x 1e300 held the GIL
# 8 s); no real vector or argument holds one, so a few are let through, ~10 ms of them
MAX_HUGE_NUMBERS = 1000
# every digit as "0", e and E as "e", "+" kept, anything else as " ": a run of digits
# is then a substring, found at memchr speed (a regex took 230 ms over 21 MiB of
# base64; this, ~25 ms), and so is a digit before a 3-digit exponent, "0e000" (in a
# 16 MiB value in base64, 400-425 such runs by chance in three random ones)
_DIGITS = bytes(48 if 48 <= i <= 57 else 101 if i in (69, 101) else 43 if i == 43 else 32
                for i in range(256))
_LONG_NUMBER = b"0" * (MAX_DIGITS + 1)
_HUGE = (b"0e000", b"0e+000")  # 1e300, 1E+0300, -2.5e299: a digit, then the exponent


def base64_size(n: int) -> int:
    """The length of `n` bytes in base64."""
    return (n + 2) // 3 * 4


def refused(raw: bytes | bytearray | memoryview, value_size: int = 0) -> str | None:
    """Why a host call whose JSON is `raw` is refused, or None; `value_size`: the bytes
    of a value sent raw beside it (its place in `raw` holds ``""``). Brackets, commas,
    colons and digits are counted wherever they are, strings included (a scan, not a
    parse: ~1 us for a small call, ~100 ms for the largest)."""
    size = len(raw) + base64_size(value_size)
    if size > MAX_BYTES:
        return f"its arguments are {size} bytes of JSON (at most {MAX_BYTES})"
    data = bytes(raw) if isinstance(raw, memoryview) else raw
    containers = data.count(b"{") + data.count(b"[")
    if containers > MAX_CONTAINERS:
        return (f"its arguments hold {containers} JSON objects and arrays (at most "
                f"{MAX_CONTAINERS}); send fewer at a time")
    values = data.count(b",") + 1
    if values > MAX_VALUES:
        return f"its arguments hold {values} values (at most {MAX_VALUES}); send fewer at a time"
    keys = data.count(b":")
    if keys > MAX_KEYS:
        return f"its arguments hold {keys} keys (at most {MAX_KEYS}); send fewer at a time"
    shape = data.translate(_DIGITS)
    if _LONG_NUMBER in shape:
        return f"its arguments hold a run of more than {MAX_DIGITS} digits"
    return _huge(shape, "its arguments hold")


def huge_numbers(raw: bytes | bytearray | memoryview) -> str | None:
    """Why JSON `raw` would hold the parser too long for its numbers' exponents
    (`MAX_HUGE_NUMBERS`), or None: for JSON read before any other check (a small
    frame, a request's body), a scan at memchr speed."""
    return _huge((bytes(raw) if isinstance(raw, memoryview) else raw).translate(_DIGITS),
                 "it holds")


def _huge(shape: bytes | bytearray, holds: str) -> str | None:
    if shape.count(b"e") <= MAX_HUGE_NUMBERS:  # (a byte's count: memchr speed)
        return None
    huge = shape.count(_HUGE[0]) + shape.count(_HUGE[1])
    if huge > MAX_HUGE_NUMBERS:
        return (f"{holds} {huge} numbers with exponents of 100 or more (at most "
                f"{MAX_HUGE_NUMBERS}: each takes the JSON parser ~200 times as long)")
    return None
