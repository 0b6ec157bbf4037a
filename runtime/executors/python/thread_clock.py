"""The CPU time of one thread of an isolate-host process, read by the PoP from the
kernel's accounting (``/proc/PID/task/TID/schedstat``), which nothing the thread
runs can change: the limit that a function's own interpreter keeps (`watchdog`)
it can reach and turn off, this one it cannot.

One descriptor per thread, opened once and read again from its start (one
`pread`, ~1-2 us); where the kernel keeps no schedstat, the thread's ``stat``
(user and system time in clock ticks, 10 ms here) instead.
"""

from __future__ import annotations

import os

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

    def read(self) -> float | None:
        """Seconds the thread has run on a CPU; None once it is gone (or closed)."""
        try:
            data = os.pread(self.fd, 512, 0)
        except OSError:  # ESRCH: the thread ended; EBADF: closed
            return None
        if not data:
            return None
        if self.ns:  # "<ns on CPU> <ns waiting> <slices>"
            return int(data.split(None, 1)[0]) / 1e9
        fields = data[data.rindex(b")") + 2:].split()  # after "pid (comm) "
        return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
