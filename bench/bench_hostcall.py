"""What a host call's arguments cost the PoP before a binding runs, next to the
parse the bounds stand in for, measured in the same run.

    python bench/bench_hostcall.py [--repeat 5]

For each payload: whether `edgefn_core.hostcall.refused` lets it through, the time
of that scan, of the msgspec parse the PoP then makes (holding the GIL, in one C
call), and of `json.loads` (the parse before). The baseline is `json.loads` of the
same bytes; a refused payload is never parsed, so its cost is the scan alone.
Min of `--repeat` runs each.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgefn_core import hostcall


def best_ms(f: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def payloads() -> dict[str, bytes]:
    return {
        "a small kv.get": b'{"id": 3, "name": "kv.get", "args": {"ns": "a", "key": "k"}, '
                          b'"wait": true}',
        "a 16 MiB KV value (base64)": b'{"value": "' + base64.b64encode(os.urandom(16 << 20))
                                      + b'"}',
        "1M floats (at the bound)": b"[" + b"0.123456789," * 999_998 + b"1]",
        "60 MiB of [1,1,...]": b"[" + b"1," * (30 << 20) + b"1]",
        "999k distinct keys": b"{" + b",".join(b'"k%d":1' % i for i in range(999_000)) + b"}",
        "60 ints of 4,299 digits": b"[" + b",".join([b"1" * 4299] * 60) + b"]",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"{'payload':28} {'MiB':>6} {'verdict':>8} {'scan ms':>8} {'msgspec ms':>10} "
          f"{'json ms':>8} {'PoP x json':>10}")
    for name, raw in payloads().items():
        why = hostcall.refused(raw)
        scan = best_ms(lambda: hostcall.refused(raw), args.repeat)  # noqa: B023
        if why is None:
            parse = best_ms(lambda: msgspec.json.decode(raw), args.repeat)  # noqa: B023
        json_ms = best_ms(lambda: json.loads(raw), max(1, args.repeat // 2))  # noqa: B023
        pop = scan + (parse if why is None else 0.0)
        print(f"{name:28} {len(raw) / 2**20:6.1f} {'refused' if why else 'parsed':>8} "
              f"{scan:8.2f} {parse if why is None else float('nan'):10.2f} {json_ms:8.1f} "
              f"{pop / json_ms:10.3f}")


if __name__ == "__main__":
    main()
