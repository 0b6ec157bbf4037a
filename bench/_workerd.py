"""workerd (Cloudflare's runtime) as a comparison point for the benchmark.

``available()`` finds workerd in the bench cache, installing the npm package
``workerd`` there on first use; ``start(port)`` serves a hello-world ES-module
worker on 127.0.0.1:PORT with ``workerd serve``.

Cache: ``~/.cache/edgefn-bench/workerd`` (``npm install --prefix DIR workerd``).
"""

from __future__ import annotations

import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HOST = "127.0.0.1"
CACHE_DIR = Path.home() / ".cache" / "edgefn-bench" / "workerd"
NPM_TIMEOUT_S = 300.0
# workerd refuses a compatibilityDate later than its own build date; this one
# is old enough for any release in use, and start() clamps it anyway.
COMPATIBILITY_DATE = "2024-01-01"

WORKER_JS = """\
export default {
  async fetch(req) {
    return new Response("hello world\\n", {
      headers: { "content-type": "text/plain" },
    });
  },
};
"""

CONFIG_CAPNP = """\
using Workerd = import "/workerd/workerd.capnp";

const config :Workerd.Config = (
  services = [ (name = "main", worker = .helloWorker) ],
  sockets = [
    ( name = "http", address = "{host}:{port}", http = (), service = "main" ),
  ],
);

const helloWorker :Workerd.Worker = (
  modules = [ (name = "worker", esModule = embed "worker.js") ],
  compatibilityDate = "{date}",
);
"""


def _platform_package() -> str:
    """npm package holding the native binary for this machine."""
    arch = "arm64" if platform.machine() in ("aarch64", "arm64") else "64"
    return f"@cloudflare/workerd-linux-{arch}"


def _candidates(cache_dir: Path) -> list[Path]:
    """Places a workerd binary can be under an ``npm install --prefix`` dir."""
    modules = cache_dir / "node_modules"
    return [
        modules / _platform_package() / "bin" / "workerd",
        modules / ".bin" / "workerd",
    ]


def version(binary: str) -> str | None:
    """The binary's ``workerd --version`` (e.g. ``workerd 2026-11-17``), or None if it won't run."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _find(cache_dir: Path) -> str | None:
    """First candidate binary in ``cache_dir`` that runs, else None."""
    for path in _candidates(cache_dir):
        if path.is_file() and version(str(path)):
            return str(path)
    return None


def _npm_install(cache_dir: Path, timeout: float) -> str | None:
    """Install the npm package into ``cache_dir``; None on success, else why not."""
    npm = shutil.which("npm")
    if npm is None:
        return "npm not found"
    cache_dir.mkdir(parents=True, exist_ok=True)
    cmd = [npm, "install", "--prefix", str(cache_dir), "--no-audit", "--no-fund", "workerd"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"npm install timed out after {timeout:g}s"
    except OSError as exc:
        return f"npm install failed: {exc}"
    if out.returncode != 0:
        return f"npm install failed ({out.returncode}): {out.stderr.strip()[-2000:]}"
    return None


def available(cache_dir: Path = CACHE_DIR, timeout: float = NPM_TIMEOUT_S) -> str | None:
    """Path to a working workerd binary, installing it on first use; None if it can't be had.

    Never raises; when it returns None the reason is printed to stderr.
    """
    found = _find(cache_dir)
    if found:
        return found
    problem = _npm_install(cache_dir, timeout)
    found = None if problem else _find(cache_dir)
    if found is None:
        print(
            f"workerd unavailable: {problem or 'no runnable binary after install'}", file=sys.stderr
        )
    return found


def _compatibility_date(binary: str) -> str:
    """COMPATIBILITY_DATE, clamped to the binary's build date if that is older."""
    match = re.search(r"\d{4}-\d{2}-\d{2}", version(binary) or "")
    if match and match.group(0) < COMPATIBILITY_DATE:
        return match.group(0)
    return COMPATIBILITY_DATE


def write_config(directory: Path, port: int, date: str) -> Path:
    """Write config.capnp and worker.js into ``directory``; returns the config path."""
    (directory / "worker.js").write_text(WORKER_JS)
    config = directory / "config.capnp"
    config.write_text(
        CONFIG_CAPNP.replace("{host}", HOST).replace("{port}", str(port)).replace("{date}", date)
    )
    return config


def _accepts(port: int) -> bool:
    """True if 127.0.0.1:``port`` accepts a TCP connection."""
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait_until_listening(proc: subprocess.Popen, port: int, timeout: float) -> None:
    """Block until the port accepts; RuntimeError if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"workerd exited with status {proc.returncode}")
        if _accepts(port):
            return
        time.sleep(0.05)
    raise RuntimeError(f"workerd not accepting on {HOST}:{port} after {timeout:g}s")


def start(port: int, timeout: float = 20.0) -> subprocess.Popen:
    """Serve the hello worker with ``workerd serve`` on 127.0.0.1:``port``.

    Waits until the port accepts; the caller owns the process
    (``terminate()`` then ``wait()``). Raises RuntimeError if workerd is
    unavailable, the port is taken, or workerd exits / does not accept within
    ``timeout`` seconds (the message carries workerd's stderr).
    """
    binary = available()
    if binary is None:
        raise RuntimeError("workerd unavailable (see stderr); needs npm and the registry")
    if _accepts(port):
        raise RuntimeError(f"workerd: {HOST}:{port} is already in use")
    with (
        tempfile.TemporaryDirectory(prefix="edgefn-workerd-") as tmp,
        tempfile.TemporaryFile() as err,
    ):
        config = write_config(Path(tmp), port, _compatibility_date(binary))
        proc = subprocess.Popen(
            [binary, "serve", str(config)],
            cwd=tmp,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            _wait_until_listening(proc, port, timeout)
        except RuntimeError as exc:
            proc.kill()
            proc.wait()
            err.seek(0)
            stderr = err.read().decode(errors="replace").strip()
            raise RuntimeError(f"{exc}\n{stderr}") from None
    # workerd has parsed the config and embedded worker.js by the time it
    # listens, so removing the temp dir above is safe.
    return proc
