"""Test helpers: a PoP on loopback in a background thread, function folders, HTTP."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import uvloop

from runtime import config
from runtime.admin.client import AdminClient
from runtime.app import running_pop
from runtime.pop import PoP

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "functions" / "examples"
HOST_MODULE = b"runtime.executors.python.host"  # what an isolate-host process runs


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Running:
    pop: PoP
    host: str
    port: int
    data: Path
    admin: AdminClient
    loop: asyncio.AbstractEventLoop | None = None  # the loop serving public requests

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            conn.request(method, path, body, headers or {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def get(self, path: str, **kw: Any) -> tuple[int, dict[str, str], bytes]:
        return self.request("GET", path, **kw)

    def deploy(self, directory: Path | str) -> dict[str, Any]:
        return self.admin.deploy(directory)

    def openai(self, timeout: float = 60.0) -> openai.OpenAI:
        """The official client on this PoP's ``/v1`` (no retries: a test sees each
        answer as it came); close it, or use it as a context manager."""
        return openai.OpenAI(base_url=f"http://{self.host}:{self.port}/v1", api_key="unused",
                             max_retries=0, timeout=timeout)

    def delivered(self) -> None:
        """Return once the PoP's loop has handed the events of every response sent so
        far to its observers (it does so in batches, right after sending)."""
        assert self.loop is not None

        async def flush() -> None:
            self.pop.observers.flush()

        asyncio.run_coroutine_threadsafe(flush(), self.loop).result(10)


@contextmanager
def pop_thread(data: Path, port: int = 0, ai: bool = False, ai_config: str | None = None,
               freeze_heap: bool = False, **overrides: Any) -> Iterator[Running]:
    """Run a real PoP (public + admin listeners) on loopback in a background thread;
    `overrides` are PopConfig fields (``"http.max_body_bytes": 1024``); `freeze_heap`
    as `running_pop`'s (off: the tests run hundreds of PoPs in one process)."""
    cfg = config.load(None, data=str(data), **{"public.port": port, "ai.enabled": ai,
                                               "ai.worker_config": ai_config, **overrides})
    started = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        stop = asyncio.Event()
        box["stop"] = stop
        box["loop"] = asyncio.get_running_loop()
        try:
            async with running_pop(cfg, freeze_heap) as (pop, public, _admin):
                box["pop"], box["addr"] = pop, public.address
                started.set()
                await stop.wait()
        except Exception as e:  # handed to the test thread below
            box["error"] = e
            started.set()

    thread = threading.Thread(target=uvloop.run, args=(main(),), daemon=True)
    thread.start()
    started.wait(180)
    if "error" in box:
        thread.join(5)
        raise box["error"]
    host, bound = box["addr"]
    try:
        yield Running(box["pop"], host, bound, data, AdminClient(data), box["loop"])
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(30)
        assert not thread.is_alive(), "PoP did not shut down"


def function_dir(root: Path, name: str, source: str | bytes, *, entry: str = "main.wat",
                 routes: list[str] | None = None, limits: str = "", extra: str = "") -> Path:
    """Write a function folder with a manifest and one WAT/WASM entry file."""
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / entry).write_text(source) if isinstance(source, str) else (d / entry).write_bytes(source)
    route_list = json.dumps(routes or [f"/{name}"])
    (d / "edgefn.toml").write_text(
        f'name = "{name}"\nruntime = "wasm"\nentry = "{entry}"\nroutes = {route_list}\n{extra}\n'
        f"[limits]\n{limits}\n")
    return d


# A reactor guest whose edgefn_handle body is BODY; it answers 200 "ok" if BODY falls through.
def reactor(body: str, prelude: str = "", memory: int = 1, imports: str = "") -> str:
    return f"""(module
  {imports}
  (memory (export "memory") {memory})
  (data (i32.const 16) "\\c8\\00\\00\\00\\00\\00\\00\\00\\02\\00\\00\\00ok")
  {prelude}
  (func (export "edgefn_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "edgefn_handle") (param $p i32) (param $n i32) (result i64)
    {body}
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 14))))
"""


def python_function(root: Path, name: str, source: str, *, limits: str = "",
                    pool: str = "min = 1\nmax = 1\nstandby = false", env: str = "",
                    extra: str = "") -> Path:
    """Write a Python function folder (main.py with `source`) routed at /NAME; `limits`,
    `pool` and `env` are the bodies of those manifest tables, `extra` top-level
    lines (``auth = "key"``) or tables of its own, written after them."""
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "main.py").write_text(source)
    (d / "edgefn.toml").write_text(
        f'name = "{name}"\nruntime = "python"\nentry = "main.py"\nroutes = ["/{name}"]\n'
        f"{extra}\n[limits]\n{limits}\n[pool]\n{pool}\n[env]\n{env}\n")
    return d


def host_pids(name: str, parent: int | None = None) -> set[int]:
    """The running (not zombie) isolate-host processes of Python function `name` whose
    parent is `parent` (default: this process, which runs `pop_thread`'s PoPs)."""
    parent = os.getpid() if parent is None else parent
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state == "Z" or int(ppid) != parent or argv[1:4] != [b"-P", b"-m", HOST_MODULE]:
            continue
        if argv[5:6] == [name.encode()]:  # python -P -m runtime.executors.python.host fd:N NAME
            found.add(int(entry.name))
    return found


def running(pid: int) -> bool:
    """Process `pid` exists and is not a zombie.

    A process that exits while its status is read makes the read fail with
    ESRCH (ProcessLookupError) rather than ENOENT: both mean it is gone.
    """
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


def listening(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (its socket inodes in /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `check` every 10 ms; fail the test with `what` past `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s")
        time.sleep(0.01)


def in_ci() -> bool:
    """Running under CI (`CI` set, as CI services and .ci/run do)."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def build_from_source(script: Path, out: Path, env: dict[str, str] | None = None) -> None:
    """Run a `build.sh` writing its module to `out`. A script exits 2 when a tool it
    needs is missing: the test is skipped then with the script's install hint, except
    under CI, where `make test` installs the toolchains and a missing one is a failure."""
    proc = subprocess.run(["bash", str(script)], env={**os.environ, **(env or {}), "OUT": str(out)},
                          capture_output=True, text=True, timeout=600)
    if proc.returncode == 2:
        said = proc.stderr.strip()
        why = (f"{script.parent.name}/{said}" if said.startswith(script.name)
               else f"{script}: {said}")
        if in_ci():
            pytest.fail(f"{why} (under CI `make test` installs the toolchains)")
        pytest.skip(why)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout}{proc.stderr}"


def wait_until_serving(proc: subprocess.Popen[str], timeout: float = 180) -> str:
    """The base URL (``http://host:port``) an `edgefn dev`/`serve` subprocess prints,
    once it has printed ``serving N function(s)``. Raises AssertionError with what it
    printed if it exits or does not get there in `timeout` seconds."""
    assert proc.stdout is not None
    url, seen, deadline = "", [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if m := re.search(r"listening on (http://\S+)", line):
            url = m.group(1)
        if line.startswith("serving "):
            return url
    raise AssertionError("edgefn did not start:\n" + "".join(seen))


@dataclass
class PopProcess:
    proc: subprocess.Popen[str]
    host: str
    port: int
    stderr: list[str]

    def rss(self) -> int:
        """The PoP's resident set size in bytes (VmRSS)."""
        return rss_of(self.proc.pid)


def rss_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@contextmanager
def pop_process(tmp_path: Path, pop_toml: str = "") -> Iterator[PopProcess]:
    """`edgefn serve --no-ai` with `pop_toml` as its config, once it serves. Killed after."""
    (tmp_path / "pop.toml").write_text(pop_toml)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "serve", "--config", str(tmp_path / "pop.toml"),
         "--no-ai", "--port", "0", "--data", str(tmp_path / "data")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stderr: list[str] = []
    assert proc.stdout is not None and proc.stderr is not None
    drain = threading.Thread(target=stderr.extend, args=(proc.stderr,), daemon=True)
    drain.start()  # a full pipe would block the PoP
    try:
        address = ""
        for line in proc.stdout:
            if line.startswith("edgefn PoP listening on http://"):
                address = line.split("http://", 1)[1].strip()
            if line.startswith("serving "):
                break
        assert address, "the PoP did not start:\n" + "".join(stderr)
        host, port = address.rsplit(":", 1)
        yield PopProcess(proc, host, int(port), stderr)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        drain.join(5)
        proc.stdout.close()
        proc.stderr.close()


class ScriptedHost:
    """`kv_get` and `call` for a guest SDK's buffer handling: each call answers the next
    of `answers` (bytes, or None: absent) by the host functions' convention (its
    length, copied to the guest's buffer if it fits; -1 if absent), so a value can
    grow or go between an SDK's first call and its retry. `caps`: the buffer sizes
    the guest passed, call by call."""

    def __init__(self, answers: list[bytes | None]) -> None:
        self.answers = list(answers)
        self.caps: list[int] = []

    def answer(self, m: Any, bp: int, cap: int) -> int:
        self.caps.append(cap)
        value = self.answers.pop(0)
        return -1 if value is None else int(m.give(value, bp, cap))

    def handle(self, fn: Any, path: bytes = b"/") -> Any:
        """`fn`'s `Response` to a GET of `path`. Raises `FunctionError`."""
        from runtime.net.message import Request, Response

        async def go() -> Response:
            r = Request(b"GET", path, b"", [], b"localhost", "1.1", True, "127.0.0.1:1")
            result = fn.handle(r, "/", {})
            return result if isinstance(result, Response) else await result
        return asyncio.run(go())


@contextmanager
def scripted_host(folder: Path, answers: list[bytes | None],
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, ScriptedHost]]:
    """The WASM function in `folder` (its manifest binds KV namespace "sdk"), loaded
    with its `kv_get` and `call` answered by a `ScriptedHost` of `answers`."""
    from runtime.bindings import Bindings, Stores
    from runtime.executors.wasm import host
    from runtime.executors.wasm.engine import WasmEngine
    from runtime.executors.wasm.function import WasmFunction
    from runtime.functions import manifest

    script = ScriptedHost(answers)
    real = host._impls

    def impls(b: Any, request: Any) -> dict[str, Callable[..., Any]]:
        def scripted(m: Any, _p: int, _n: int, _k: int, _l: int, bp: int, cap: int) -> int:
            return script.answer(m, bp, cap)
        return {**real(b, request), "kv_get": scripted, "call": scripted}

    monkeypatch.setattr(host, "_impls", impls)
    monkeypatch.setenv("EDGEFN_NATIVE_KV", "0")  # kv_get stays the (scripted) Python one
    m = manifest.load(folder)
    stores = Stores(folder / "data")
    engine = WasmEngine(None)
    try:
        fn = WasmFunction(engine, m, folder, Bindings.prepare(stores, m))
        fn.prewarm()
        yield fn, script
    finally:
        engine.close()
        stores.close()


def own_records(caplog: pytest.LogCaptureFixture, logger: str) -> list[logging.LogRecord]:
    """The records `logger` (or a child of it) logged on this test's thread: caplog's
    handler sits on the root logger, where the PoPs other tests left running log too
    (a count of every record failed once in a mixed run)."""
    me = threading.get_ident()
    return [r for r in caplog.records if r.thread == me and
            (r.name == logger or r.name.startswith(logger + "."))]
