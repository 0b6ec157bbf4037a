"""An isolate-host process: `python -m runtime.executors.python.host CONFIG_JSON`.

It owns one function version's subinterpreters. Each isolate runs on its own
thread, inside its own interpreter, serving the socket the PoP passed for it
(`fds`); when an isolate recycles, a fresh interpreter takes over the same
socket. Lines on stdin are commands from the PoP: ``grow`` starts the next
isolate; at EOF the host exits. With ``check_imports`` it first looks for
imports that would fail only at request time (`importcheck`) and its first
isolate reports them at READY. A crash here (a segfault in a C extension or ctypes) ends only this
process; the PoP replaces it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import sys
import threading
from pathlib import Path

from runtime.executors.python import importcheck, interp


def import_root(package: str) -> str:
    """The sys.path entry `package` is imported from (site-packages when installed,
    the checkout's folder in development), found without importing it."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None, f"{package} is not installed"
    return str(Path(spec.origin).parent.parent)


# the guest SDK (`edgefn`), then edgefn's own packages (`runtime`, `edgefn_core`)
IMPORT_ROOTS = list(dict.fromkeys(import_root(p) for p in ("edgefn", "edgefn_core", "runtime")))


# Creating interpreters and importing into them one at a time: 3.13.0 has crashed
# (SIGSEGV) here with several isolated interpreters starting at once under load.
STARTING = threading.Lock()


def import_paths(cfg: dict) -> list[str]:
    """What a subinterpreter imports from, before its own sys.path: the SDK, the
    function's folder, and edgefn (for the guest loop)."""
    return [IMPORT_ROOTS[0], cfg["function_dir"], *IMPORT_ROOTS[1:]]


def prepare_code(cfg: dict, fd: int) -> str:
    """Run first in a fresh subinterpreter: import paths, the SDK and the function."""
    paths = import_paths(cfg)
    return (f"import sys\nsys.path[:0] = {paths!r}\n"
            "import edgefn\nfrom runtime.executors.python import guest\n"
            f"prepared = guest.prepare({fd!r}, {cfg['module']!r}, {cfg['handler']!r})\n")


def serve_code(cfg: dict, warnings: list[str]) -> str:
    """Run next, in the same interpreter's __main__: the request loop."""
    args = (cfg["cpu_ms"], cfg["wall_ms"], cfg["recycle_after"])
    return f"guest.serve(prepared, *{args!r}, sdk=edgefn, warnings={warnings!r})\n"


def run_isolate(cfg: dict, fd: int, warnings: list[str]) -> None:
    """Serve `fd` with a fresh interpreter, again after every recycle, until stopped;
    the first READY carries `warnings`."""
    while True:
        with STARTING:
            i = interp.create()
            err = interp.run(i, prepare_code(cfg, fd))
        try:
            if err is None:
                err = interp.run(i, serve_code(cfg, warnings))
                warnings = []
        finally:
            interp.destroy(i)
        if err is not None:  # IsolateStop (import failed, PoP gone) or an unexpected error
            if err != "IsolateStop":
                print(f"edgefn isolate host: isolate on fd {fd} ended with {err}",
                      file=sys.stderr, flush=True)
            return


def limit_memory(memory_mb: int, isolates: int) -> None:
    """Cap the address space: what the host uses now plus `memory_mb` per isolate."""
    vm = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            vm = int(line.split()[1]) * 1024
    # Each isolate still to start needs its interpreter and thread stack (~64 MiB).
    budget = vm + isolates * ((memory_mb + 64) << 20)
    resource.setrlimit(resource.RLIMIT_AS, (budget, budget))


def main() -> None:
    cfg = json.loads(sys.argv[1])
    fds: list[int] = cfg["fds"]
    started = 0
    threads = []
    warnings = []
    if cfg.get("check_imports"):
        warnings = importcheck.warnings(cfg["function_dir"], cfg["module"], import_paths(cfg))

    def start_next() -> None:
        nonlocal started
        if started < len(fds):
            first = warnings if started == 0 else []
            t = threading.Thread(target=run_isolate, args=(cfg, fds[started], first),
                                 daemon=True)
            t.start()
            threads.append(t)
            started += 1

    if cfg.get("memory_mb"):  # before any isolate starts: all of them live under the cap
        limit_memory(cfg["memory_mb"], len(fds))
    for _ in range(cfg["initial"]):
        start_next()
    for line in sys.stdin:  # EOF: the PoP is gone or retired us
        if line.strip() == "grow":
            start_next()
    os._exit(0)  # isolate threads may be blocked in user code; do not wait for them


if __name__ == "__main__":
    main()
