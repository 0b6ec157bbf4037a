"""The CPU time of an isolate-host process and of its threads, read by the PoP
from the kernel's accounting, which nothing the host runs can change: the limit
that a function's own interpreter keeps (`watchdog`) it can reach and turn off,
these counts it cannot.

A thread (`ThreadClock`): ``/proc/PID/task/TID/schedstat``, one descriptor per
thread, opened once and read again from its start (one `pread`, ~1-2 us); where
the kernel keeps no schedstat, the thread's ``stat`` (user and system time in
clock ticks, 10 ms here) instead. The whole process, its ended threads included
(`ProcessClock`): its CPU-time clock (``clock_gettime``, ~6 us).
"""

from __future__ import annotations

import os
import time

TICKS = os.sysconf("SC_CLK_TCK")


class ThreadClock:
    def __init__(self, pid: int, tid: int) -> None:
        """Raises `OSError` if process `pid` has no thread `tid`."""
        base = f"/proc/{pid}/task/{tid}"
        try:
            self.fd = os.open(f"{base}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            self.ns = True
        except FileNotFoundError:
            if not os.path.isdir(base):
                raise
            self.fd = os.open(f"{base}/stat", os.O_RDONLY | os.O_CLOEXEC)
            self.ns = False
        self.last = 0.0  # what it read last (a thread that ended keeps its count)

    def read(self) -> float | None:
        """Seconds the thread has run on a CPU; None once it is gone (or closed)."""
        try:
            data = os.pread(self.fd, 512, 0)
        except OSError:  # ESRCH: the thread ended; EBADF: closed
            return None
        if not data:
            return None
        if self.ns:  # "<ns on CPU> <ns waiting> <slices>"
            self.last = int(data.split(None, 1)[0]) / 1e9
        else:
            fields = data[data.rindex(b")") + 2:].split()  # after "pid (comm) "
            self.last = (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime
        return self.last

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class ProcessClock:
    """The CPU time of every thread a process ran, those that ended included. Read it
    only while the process is not reaped (its pid may be another's after)."""

    def __init__(self, pid: int) -> None:
        self.id = ((~pid) << 3) | 2  # the kernel's CPU clock id of process `pid` (sched)

    def read(self) -> float | None:
        """Seconds; None once the process is gone."""
        try:
            return time.clock_gettime(self.id)
        except OSError:
            return None
