"""An isolate-host process: `python -m runtime.executors.python.host fd:N NAME`, its
config (JSON) in the memfd N the PoP passed, NAME the function's (for `ps`).

It owns one function version's subinterpreters. Each isolate runs on its own
thread, inside its own interpreter, serving the socket the PoP passed for it
(`fds`); when an isolate recycles, a fresh interpreter takes over the same
socket. Lines on stdin are commands from the PoP: ``grow`` starts the next
isolate; at EOF the host exits. With ``check_imports`` it first looks for
imports that would fail only at request time (`importcheck`) and its first
isolate reports them at READY. Before any of that, the host sandboxes itself
(`sandbox.apply`): from then on it sees only what it needs, read-only, plus a
scratch dir; each isolate gets its own subfolder of it as `tempfile.gettempdir()`,
emptied whenever a fresh interpreter takes over. Then, still before any function
code runs (the import check's included), it compiles edgefn's modules that every
interpreter imports (`precompiled`: each fresh one gets the code, not the sources
to compile again), and starts every isolate's thread, each
waiting for its turn, and names it to the PoP as the first frame on its socket
(THREAD): the PoP reads that thread's CPU time to keep `limits.cpu_ms` (a guest
reaches every socket of its host, so a thread named later could be a forgery). A
crash here (a segfault in a C extension or ctypes) ends only this process; the PoP
replaces it.

Its address space is capped (`budget`). Recycled interpreters leave some of it
behind, so before starting each interpreter the host checks what is left: when
it runs low the host asks to be replaced (a RETIRE frame on that isolate's
socket) and keeps serving; once a fresh interpreter's share no longer fits, that
isolate stops (the PoP has moved its work to another host by then, or queues
it until one is ready).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import resource
import socket
import sys
import threading
from pathlib import Path

from edgefn_core import fastcodec
from edgefn_core.errors import SandboxError
from runtime.executors.python import (
    budget,
    importcheck,
    interp,
    local_kv_env,
    precompiled,
    sandbox,
    wire,
)
from runtime.executors.python.budget import Room


def import_root(package: str) -> str:
    """The sys.path entry `package` is imported from (site-packages when installed,
    the checkout's folder in development), found without importing it."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None, f"{package} is not installed"
    return str(Path(spec.origin).parent.parent)


# the guest SDK (`edgefn`), then edgefn's own packages (`runtime`, `edgefn_core`)
PACKAGES = ("edgefn", "edgefn_core", "runtime")
IMPORT_ROOTS = list(dict.fromkeys(import_root(p) for p in PACKAGES))


# Creating interpreters and importing into them one at a time: 3.13.0 has crashed
# (SIGSEGV) here with several isolated interpreters starting at once under load.
STARTING = threading.Lock()


def import_paths(cfg: dict) -> list[str]:
    """What a subinterpreter imports from, before its own sys.path: the SDK, the
    function's folder, and edgefn (for the guest loop)."""
    return [IMPORT_ROOTS[0], cfg["function_dir"], *IMPORT_ROOTS[1:]]


def package_dirs() -> list[str]:
    """The folders of `PACKAGES` (what the sandbox lets the host read of edgefn)."""
    return [os.path.join(root, name) for name in PACKAGES for root in IMPORT_ROOTS
            if os.path.isdir(os.path.join(root, name))]


def isolate_scratch(cfg: dict, fd: int) -> str:
    """The scratch folder of the isolate serving `fd`."""
    return os.path.join(cfg["sandbox"]["scratch"], f"isolate-{fd}")


def prepare_code(cfg: dict, fd: int) -> str:
    """Run first in a fresh subinterpreter: import paths, its scratch dir as the
    temp dir, the SDK and the function."""
    paths = import_paths(cfg)
    # line-buffered: its stdout is a pipe (block-buffered), and print() without
    # flush=True reached the PoP's log never (the host output relay, `host_output`)
    return (f"import sys, tempfile\nsys.path[:0] = {paths!r}\n"
            # edgefn's modules as the host compiled them (`precompiled`), not from source
            "from runtime.executors.python import precompiled\n"
            "precompiled.install(_edgefn_precompiled)\n"
            "if sys.stdout is not None:\n    sys.stdout.reconfigure(line_buffering=True)\n"
            f"tempfile.tempdir = {isolate_scratch(cfg, fd)!r}\n"
            # the C codec the host loaded, before the SDK imports the ABI (`fastcodec`)
            f"from edgefn_core import fastcodec\nfastcodec.use({fastcodec.loaded_path()!r})\n"
            "import edgefn\nfrom runtime.executors.python import guest\n"
            f"prepared = guest.prepare({fd!r}, {cfg['module']!r}, {cfg['handler']!r})\n")


def serve_code(cfg: dict, warnings: list[str]) -> str:
    """Run next, in the same interpreter's __main__: the request loop (with the
    host's KV handles, `cfg["kv"]`, when it reads KV in place)."""
    args = (cfg["cpu_ms"], cfg["wall_ms"], cfg["recycle_after"])
    return (f"guest.serve(prepared, *{args!r}, sdk=edgefn, warnings={warnings!r}, "
            f"kv={cfg.get('kv')!r}, max_response={cfg['max_response_mb'] << 20!r}, "
            f"ahead={cfg.get('pipeline', 0) != 0!r})\n")


class Retirement:
    """The host's one request to be replaced, sent on the socket of the isolate
    that found the room running out (by its own thread, between two interpreters:
    nothing else writes on that socket then)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.asked = False

    def ask(self, fd: int, why: str) -> None:
        with self.lock:
            if self.asked:
                return
            self.asked = True
        print(f"edgefn isolate host: {why}; asking to be replaced", file=sys.stderr, flush=True)
        _tell(fd, wire.json_frame(wire.RETIRE, {"why": why}))


def stopped(fd: int, why: str) -> None:
    """Tell the PoP the isolate on `fd` starts no interpreter again (a READY that is
    not ok): a job it was handed meanwhile, while its last interpreter ended
    unannounced, goes to another isolate (it got a 502 "isolate ended unexpectedly"
    when the socket just closed)."""
    _tell(fd, wire.json_frame(wire.READY, {"ok": False, "stopped": why}))


def _tell(fd: int, frame: bytes) -> None:
    """Send `frame` on the isolate socket `fd` from the host's own thread (between
    two interpreters: nothing else writes on it then)."""
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.sendall(frame)
    except OSError:
        pass  # the PoP is gone: stdin's EOF ends us


def check_room(cfg: dict, fd: int, retirement: Retirement) -> bool:
    """Whether the isolate on `fd` may start its next interpreter; asks for the
    host to be replaced when the room under its cap runs low."""
    left = budget.headroom()
    verdict = budget.room(left, cfg.get("memory_mb") or 0)
    if verdict is Room.OK:
        return True
    assert left is not None
    retirement.ask(fd, f"{left / budget.MIB:.0f} MiB left under its memory cap after "
                       "recycling interpreters")
    if verdict is Room.FULL:
        print(f"edgefn isolate host: isolate on fd {fd} stops: a fresh interpreter's share "
              "no longer fits under the memory cap", file=sys.stderr, flush=True)
        return False
    return True


def run_isolate(cfg: dict, fd: int, warnings: list[str], retirement: Retirement) -> None:
    """Serve `fd` with a fresh interpreter, again after every recycle, until stopped
    or out of room; the first READY carries `warnings`. Unless the PoP stopped it,
    `fd` is closed when it ends, so that the PoP sees the isolate gone."""
    if serve_isolate(cfg, fd, warnings, retirement):
        os.close(fd)


def serve_isolate(cfg: dict, fd: int, warnings: list[str], retirement: Retirement) -> bool:
    """`run_isolate`'s loop: False when the PoP stopped the isolate."""
    first = True
    while check_room(cfg, fd, retirement):
        sandbox.wipe(isolate_scratch(cfg, fd))
        with STARTING:
            try:
                i = interp.create()
            except Exception as e:  # InterpreterError, MemoryError: nothing was sent on fd
                why = f"cannot create an interpreter ({type(e).__name__}: {e})"
                retirement.ask(fd, why)
                stopped(fd, why)
                return True
            interp.share(i, "_edgefn_precompiled", cfg["precompiled"])
            err = interp.run(i, prepare_code(cfg, fd))
        serving = err is None
        try:
            if serving:
                err = interp.run(i, serve_code(cfg, warnings))
                warnings = []
        finally:
            if err != "IsolateWedged":  # closing it would wait for its stuck thread forever
                interp.destroy(i)
        if err == "IsolateWedged":
            retirement.ask(fd, "a thread a function started could not be stopped; its "
                               "interpreter is left behind")
        if err in (None, "IsolateWedged"):  # recycled
            first = False
            continue
        if serving and err == "IsolateStop":  # the PoP closed the socket: stopped
            return False
        if err != "IsolateStop":
            print(f"edgefn isolate host: isolate on fd {fd} ended with {err}",
                  file=sys.stderr, flush=True)
        # The module imported before, or the loop itself failed: the host is at fault,
        # not the function's code. (A first import that fails is the deploy's error.)
        if serving or not first:
            retirement.ask(fd, f"an isolate ended with {err}")
        return True
    stopped(fd, "a fresh interpreter's share no longer fits under the host's memory cap")
    return True  # out of room


class IsolateThread:
    """An isolate's thread, started before any function code runs and waiting for
    `begin` (the PoP's ``grow``, or one of the first isolates)."""

    def __init__(self, cfg: dict, fd: int, retirement: Retirement) -> None:
        self.go = threading.Event()
        self.warnings: list[str] = []
        self.thread = threading.Thread(target=self._run, args=(cfg, fd, retirement),
                                       daemon=True)
        self.thread.start()
        _tell(fd, wire.json_frame(wire.THREAD, {"tid": self.thread.native_id}))

    def _run(self, cfg: dict, fd: int, retirement: Retirement) -> None:
        self.go.wait()
        run_isolate(cfg, fd, self.warnings, retirement)

    def begin(self, warnings: list[str]) -> None:
        """Start serving; the first READY carries `warnings`."""
        self.warnings = warnings
        self.go.set()


OOM_SCORE_ADJ = 1000  # the most: of every process, a host is killed first


def first_to_go() -> None:
    """Make this host the kernel's first choice when the machine runs out of memory
    (its `oom_score_adj`): a tenant's memory that no limit of its own counts (RLIMIT_AS
    is address space, per host: `pool.max` isolates of `memory_mb` each may add up to
    more than the machine has; kernel socket buffers count in no process) must cost a
    host, which the PoP replaces, never the PoP or the model worker. Raising one's own
    score needs no privilege; a /proc that cannot be written leaves it as it was."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(OOM_SCORE_ADJ))
    except OSError:
        pass


def limit_memory(memory_mb: int, isolates: int) -> None:
    """Cap the address space (`budget.cap`): what the host uses now, a share per
    isolate, and room for what recycled interpreters leave behind."""
    limit = budget.cap(budget.address_space(), memory_mb, isolates)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def enter_sandbox(cfg: dict) -> None:
    """Apply the sandbox (`sandbox.apply`), then hand the function the environment
    its manifest grants, and make its folder the working directory. A layer that
    fails ends the host (status 3) unless the PoP runs with --insecure-python."""
    box = cfg["sandbox"]
    reads = sandbox.read_paths(cfg["function_dir"], package_dirs())
    try:
        state = sandbox.apply(reads, box["scratch"], box["uid"], strict=not box["insecure"],
                              listable=IMPORT_ROOTS)
    except SandboxError as e:
        print(f"edgefn isolate host: {e}; refusing to run the function", file=sys.stderr,
              flush=True)
        os._exit(3)
    missing = {k: v for k, v in state.items() if v != "enforced"}
    if missing:
        print(f"edgefn isolate host: running without sandbox layers (--insecure-python): "
              f"{missing}", file=sys.stderr, flush=True)
    os.environ.update(dict(cfg["env"]))  # after the sandbox: the loader never sees them
    os.environ["TMPDIR"] = box["scratch"]
    os.chdir(cfg["function_dir"])


def read_config(arg: str) -> dict:
    """The config the PoP wrote to memfd ``fd:N`` (closed after reading)."""
    fd = int(arg.removeprefix("fd:"))
    with os.fdopen(fd, "rb") as f:
        f.seek(0)
        cfg: dict = json.loads(f.read())
    return cfg


def private_commands() -> io.TextIOWrapper:
    """The PoP's command pipe, moved off fd 0, which becomes /dev/null: a handler's
    `input()` reads EOF at once instead of waiting on (or eating) the PoP's commands."""
    commands = os.fdopen(os.dup(0), "r", closefd=True)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(os.devnull)  # noqa: SIM115 (the process's stdin for its lifetime)
    return commands


def main() -> None:
    cfg = read_config(sys.argv[1])
    commands = private_commands()
    fds: list[int] = cfg["fds"]
    started = 0
    warnings = []
    retirement = Retirement()
    cfg["kv"] = local_kv_env.open_env(cfg)  # before the sandbox hides the data dir
    first_to_go()  # before the sandbox hides /proc
    enter_sandbox(cfg)
    # compiled, not run: no function code runs before the isolate threads are named
    cfg["precompiled"] = precompiled.compile_modules()
    threads = [IsolateThread(cfg, fd, retirement) for fd in fds]  # before any function code
    if cfg.get("check_imports"):
        warnings = importcheck.warnings(cfg["function_dir"], cfg["module"], import_paths(cfg))

    def start_next() -> None:
        nonlocal started
        if started < len(fds):
            threads[started].begin(warnings if started == 0 else [])
            started += 1

    if cfg.get("memory_mb"):  # before any isolate starts: all of them live under the cap
        limit_memory(cfg["memory_mb"], len(fds))
    for _ in range(cfg["initial"]):
        start_next()
    for line in commands:  # EOF: the PoP is gone or retired us
        if line.strip() == "grow":
            start_next()
    os._exit(0)  # isolate threads may be blocked in user code; do not wait for them


if __name__ == "__main__":
    main()
