"""stdin, stdout and stderr of WASI commands, answered here rather than by wasmtime's WASI.

wasmtime's preview1 hands every stdio call (``fd_write``, ``fd_read``,
``fd_fdstat_get``) to its tokio runtime's threads and waits for it: a hello in C
(functions/examples/hello-c) made ~22 thread switches a request and cost ~580 us
of CPU, ~170 us without them (`bench/bench_wasi.py`). These host functions
shadow wasmtime's on the function's Linker (after `define_wasi`) and serve the
request's own streams on the calling thread: stdin is the request body, stdout
the response (at most `limits.max_response_mb`: a write past it traps, ending the
run, as its response is a 502 whatever the guest would do next; more than `IOV_MAX`
iovecs in one call, ``EINVAL``), stderr the PoP's
log, line by line, its first `STDERR_MAX` bytes.

A WASI command here has no other file descriptor (no preopened directory, no
socket), so any other fd is ``EBADF``. For fds 0, 1 and 2 each call answers as
wasmtime 50's own does (tests/executors/test_wasi_stdio.py compares them call by
call): ``fd_fdstat_get`` says filetype unknown with the read (0) or write (1, 2)
right; ``fd_seek``, ``fd_tell`` and the positioned ``fd_pread``/``fd_pwrite`` are
``ESPIPE`` where the fd could read or write and ``EBADF`` where not;
``fd_filestat_get`` is all zeros. ``fd_close`` and ``fd_renumber`` act on this
table, so a closed stdout stays closed for every call shadowed here (the calls
left to wasmtime, e.g. ``fd_advise``, move no data).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import wasmtime

from runtime.executors.wasm.wasi_poll import GuestMemory

MODULE = "wasi_snapshot_preview1"
ESUCCESS, EBADF, EFBIG, EINVAL, ESPIPE = 0, 8, 22, 28, 70
# iovecs one call takes at most (POSIX's least IOV_MAX): past it EINVAL, not a loop over
# millions of them on the event loop's thread (host code no epoch deadline stops)
IOV_MAX = 1024
IN, OUT, ERR = 0, 1, 2  # what an fd of the table is
RIGHTS = {IN: 0x2, OUT: 0x40, ERR: 0x40}  # fd_read, fd_write
FDSTAT = struct.Struct("<BxHxxxxQQ")  # filetype, flags, rights base, rights inheriting
FILESTAT_SIZE = 64
STDERR_MAX = 64 << 10  # stderr logged of one request; the rest is counted (wasi.c's too)
_I32, _I64 = wasmtime.ValType.i32(), wasmtime.ValType.i64()


class Stdio:
    """One request's streams: `stdin` read from the start, stdout kept (`chunks`)
    up to `limit` bytes, stderr handed to `stderr` a write at a time."""

    def __init__(self, stdin: bytes, limit: int, stderr: Callable[[bytes], None]) -> None:
        self.stdin = stdin
        self.read_at = 0
        self.limit = limit
        self.size = 0
        self.chunks: list[bytes] = []
        self.overflow = False  # a write went past `limit` (and failed)
        self.stderr = stderr
        self.err_size = 0
        self.err_dropped = 0
        self.fds = {0: IN, 1: OUT, 2: ERR}

    def output(self) -> bytes:
        return b"".join(self.chunks)

    def write(self, kind: int, data: bytes) -> int:
        """Write `data` to stdout or stderr: an errno. Past `STDERR_MAX` bytes of stderr
        in the request, the rest is counted (`err_dropped`), not logged."""
        if kind == ERR:
            keep = max(0, min(len(data), STDERR_MAX - self.err_size))
            self.err_size += keep
            self.err_dropped += len(data) - keep
            if keep:
                self.stderr(data[:keep])
            return ESUCCESS
        if self.size + len(data) > self.limit:
            self.overflow = True
            return EFBIG
        self.size += len(data)
        self.chunks.append(data)
        return ESUCCESS


_current = threading.local()


@contextmanager
def serving(stdio: Stdio) -> Iterator[Stdio]:
    """`stdio` is what the WASI calls on this thread serve until the block ends."""
    _current.stdio = stdio
    try:
        yield stdio
    finally:
        _current.stdio = None


def _streams() -> Stdio | None:
    return getattr(_current, "stdio", None)


class Memory:
    """The calling guest's memory. Raises `wasmtime.Trap` for a region outside it,
    as wasmtime's WASI does (a pointer out of bounds is the guest's bug, not an errno)."""

    def __init__(self, caller: wasmtime.Caller) -> None:
        memory = caller.get("memory")
        if not isinstance(memory, wasmtime.Memory):
            raise wasmtime.Trap("the module exports no memory")
        self.guest = GuestMemory(memory, caller)

    def check(self, ptr: int, length: int) -> None:
        """Trap unless `length` bytes at `ptr` are inside memory (nothing copied)."""
        if ptr < 0 or ptr + length > self.guest.size:
            raise wasmtime.Trap(f"pointer out of bounds: {length} bytes at {ptr}")

    def read(self, ptr: int, length: int) -> bytes:
        data = self.guest.read(ptr, length)
        if data is None:
            raise wasmtime.Trap(f"pointer out of bounds: {length} bytes at {ptr}")
        return data

    def write(self, ptr: int, data: bytes) -> None:
        if not self.guest.write(ptr, data):
            raise wasmtime.Trap(f"pointer out of bounds: {len(data)} bytes at {ptr}")

    def iovecs(self, iovs: int, count: int) -> list[tuple[int, int]]:
        """The (pointer, length) pairs of an iovec array."""
        raw = self.read(iovs, count * 8)
        return [struct.unpack_from("<II", raw, 8 * i) for i in range(count)]


def _iovec_call(caller: wasmtime.Caller, iovs: int, count: int) -> Memory | int:
    """The caller's memory for a call on an iovec array, or the errno for more than
    `IOV_MAX`. Traps for an array outside memory: checked first, whatever the fd (as
    wasmtime does)."""
    mem = Memory(caller)
    mem.check(iovs, count * 8)
    return EINVAL if count > IOV_MAX else mem


def fd_write(caller: wasmtime.Caller, fd: int, iovs: int, count: int, written: int) -> int:
    mem = _iovec_call(caller, iovs, count)
    if isinstance(mem, int):
        return mem
    stdio = _streams()
    kind = stdio.fds.get(fd) if stdio is not None else None
    if stdio is None or kind is None or kind == IN:
        return EBADF
    data = b"".join(mem.read(p, n) for p, n in mem.iovecs(iovs, count))
    err = stdio.write(kind, data)
    if err == EFBIG:
        raise wasmtime.Trap("stdout past the response limit")
    if not err:
        mem.write(written, struct.pack("<I", len(data)))
    return err


def fd_read(caller: wasmtime.Caller, fd: int, iovs: int, count: int, read: int) -> int:
    mem = _iovec_call(caller, iovs, count)
    if isinstance(mem, int):
        return mem
    stdio = _streams()
    if stdio is None or stdio.fds.get(fd) != IN:
        return EBADF
    total = 0
    for p, n in mem.iovecs(iovs, count):
        data = stdio.stdin[stdio.read_at:stdio.read_at + n]
        mem.write(p, data)
        stdio.read_at += len(data)
        total += len(data)
        if len(data) < n:
            break
    mem.write(read, struct.pack("<I", total))
    return ESUCCESS


def fd_fdstat_get(caller: wasmtime.Caller, fd: int, out: int) -> int:
    stdio = _streams()
    kind = stdio.fds.get(fd) if stdio is not None else None
    if kind is None:
        return EBADF
    Memory(caller).write(out, FDSTAT.pack(0, 0, RIGHTS[kind], RIGHTS[kind]))
    return ESUCCESS


def fd_filestat_get(caller: wasmtime.Caller, fd: int, out: int) -> int:
    stdio = _streams()
    if stdio is None or fd not in stdio.fds:
        return EBADF
    Memory(caller).write(out, bytes(FILESTAT_SIZE))
    return ESUCCESS


def fd_close(fd: int) -> int:
    stdio = _streams()
    if stdio is None or stdio.fds.pop(fd, None) is None:
        return EBADF
    return ESUCCESS


def fd_renumber(fd: int, to: int) -> int:
    stdio = _streams()
    if stdio is None or fd not in stdio.fds or to not in stdio.fds:
        return EBADF
    stdio.fds[to] = stdio.fds.pop(fd)
    return ESUCCESS


def _positioned(seekable_as: frozenset[int]) -> Callable[..., int]:
    """A call at a position (seek, tell, pread, pwrite): ``ESPIPE`` on an fd of the
    kinds in `seekable_as` (a stream: no position), ``EBADF`` on any other."""
    def answer(fd: int, *_: int) -> int:
        stdio = _streams()
        kind = stdio.fds.get(fd) if stdio is not None else None
        return ESPIPE if kind in seekable_as else EBADF
    return answer


ANY, READABLE, WRITABLE = frozenset({IN, OUT, ERR}), frozenset({IN}), frozenset({OUT, ERR})


# the calls shadowed here and their parameters (each returns an errno, i32): the Python
# functions above and wasi.c's edgefn_NAME alike
SIGNATURES: dict[str, list[wasmtime.ValType]] = {
    "fd_write": [_I32] * 4,
    "fd_read": [_I32] * 4,
    "fd_fdstat_get": [_I32] * 2,
    "fd_filestat_get": [_I32] * 2,
    "fd_close": [_I32],
    "fd_renumber": [_I32] * 2,
    "fd_seek": [_I32, _I64, _I32, _I32],
    "fd_tell": [_I32] * 2,
    "fd_pread": [_I32] * 3 + [_I64, _I32],
    "fd_pwrite": [_I32] * 3 + [_I64, _I32],
}
# the Python ones: (function, whether it takes the caller)
PYTHON: dict[str, tuple[Callable[..., int], bool]] = {
    "fd_write": (fd_write, True),
    "fd_read": (fd_read, True),
    "fd_fdstat_get": (fd_fdstat_get, True),
    "fd_filestat_get": (fd_filestat_get, True),
    "fd_close": (fd_close, False),
    "fd_renumber": (fd_renumber, False),
    "fd_seek": (_positioned(ANY), False),
    "fd_tell": (_positioned(ANY), False),
    "fd_pread": (_positioned(READABLE), False),
    "fd_pwrite": (_positioned(WRITABLE), False),
}


def define(linker: wasmtime.Linker) -> None:
    """Shadow wasmtime's stdio calls on `linker` (after `define_wasi`)."""
    linker.allow_shadowing = True
    try:
        for name, params in SIGNATURES.items():
            func, with_caller = PYTHON[name]
            linker.define_func(MODULE, name, wasmtime.FuncType(params, [_I32]), func,
                               access_caller=with_caller)
    finally:
        linker.allow_shadowing = False
