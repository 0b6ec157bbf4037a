"""What one host call's arguments may be: a WASM guest's ``call(name, args)`` JSON
read from its memory, a Python isolate's CALL frame.

The PoP parses them holding the GIL, in one C call no other thread interrupts: a
crafted call of 60 MiB of ``[1,1,...]`` froze every tenant's requests for 2 s, and
30 MiB of ``[{},{},...]`` also took 810 MB. So a call is bounded in bytes (a KV
value at its largest, 16 MiB, base64-encoded, and room), and one over `SCAN_ABOVE`
bytes in how many JSON objects and arrays and how many values it holds, counted
before parsing (a few ms for the largest). The PoP checks where a call arrives; the
Python SDK checks first, so that a function gets `BindingError` saying why.

Stdlib-only, importing nothing of edgefn's: isolates import it too.
"""

from __future__ import annotations

MAX_BYTES = 24 << 20  # a 16 MiB KV value in base64 is 21.3 MiB
MAX_CONTAINERS = 200_000  # JSON objects and arrays (20,000 vectors with metadata: 60,000)
MAX_VALUES = 1_000_000  # values in them, by their separators (2,600 vectors of 384 floats)
SCAN_ABOVE = 256 << 10  # smaller calls parse in a few ms whatever they hold


def refused(raw: bytes | bytearray | memoryview) -> str | None:
    """Why a host call whose JSON is `raw` is refused, or None."""
    size = len(raw)
    if size > MAX_BYTES:
        return f"its arguments are {size} bytes of JSON (at most {MAX_BYTES})"
    if size <= SCAN_ABOVE:
        return None
    data = bytes(raw) if isinstance(raw, memoryview) else raw
    containers = data.count(b"{") + data.count(b"[")
    if containers > MAX_CONTAINERS:
        return (f"its arguments hold {containers} JSON objects and arrays (at most "
                f"{MAX_CONTAINERS}); send fewer at a time")
    values = data.count(b",") + 1
    if values > MAX_VALUES:
        return f"its arguments hold {values} values (at most {MAX_VALUES}); send fewer at a time"
    return None
