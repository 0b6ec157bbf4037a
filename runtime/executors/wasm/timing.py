"""How long a reactor request waits for its fresh store and instance: a histogram
the native call fills in C (atomic adds, no GIL, two clock reads per request),
read by the metrics at scrape time (``edgefn_wasm_instantiate_seconds``)."""

from __future__ import annotations

import ctypes
from ctypes import c_uint64

MAX_BOUNDS = 16  # as edgefn_hist in native_src/reactor.c
BOUNDS_S = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
            0.025)


class InstantiateTimes(ctypes.Structure):
    """Counts per bucket (not cumulative; the one past the last bound is +Inf) and
    the sum, in nanoseconds. Shared by every call path of one function version."""

    _fields_ = [("n_bounds", c_uint64), ("bounds_ns", c_uint64 * MAX_BOUNDS),
                ("counts", c_uint64 * (MAX_BOUNDS + 1)), ("sum_ns", c_uint64)]

    def __init__(self) -> None:
        super().__init__()
        self.n_bounds = len(BOUNDS_S)
        for i, bound in enumerate(BOUNDS_S):
            self.bounds_ns[i] = round(bound * 1e9)

    def record(self, ns: int) -> None:
        """One instantiation of `ns` nanoseconds (the ctypes path; C does its own)."""
        i = next((i for i in range(self.n_bounds) if ns <= self.bounds_ns[i]), self.n_bounds)
        self.counts[i] += 1
        self.sum_ns += ns

    def snapshot(self) -> tuple[tuple[float, ...], list[int], float]:
        """(bucket bounds in seconds, counts per bucket with +Inf last, the sum in
        seconds), the counts copied at once."""
        counts = list(self.counts)[:self.n_bounds + 1]
        return BOUNDS_S, counts, self.sum_ns / 1e9
