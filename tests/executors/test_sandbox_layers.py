"""Each layer of the isolate-host sandbox (`runtime.executors.python.sandbox`) alone,
applied to a throwaway child process that then tries what the layer must stop
(and what it must still allow). Real kernel, no mocks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from runtime.executors.python import host, sandbox

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="this layer applies when the PoP runs as root")

PRELUDE = """
import json, os, socket, sys, threading
from runtime.executors.python import sandbox
out = {}
def attempt(name, f):
    try:
        out[name] = ["ok", f()]
    except Exception as e:
        out[name] = [type(e).__name__, getattr(e, "errno", None)]
def thread_runs():
    seen = []
    t = threading.Thread(target=lambda: seen.append(1))
    t.start(); t.join()
    return seen == [1]
"""


def in_child(body: str, tmp_path: Path, **env: str) -> dict[str, Any]:
    """Run PRELUDE + `body` (which fills `out`) in a child Python; its `out`."""
    script = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(Path.cwd()), **env})
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


@pytest.fixture
def listener() -> Any:
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def test_landlock_alone(tmp_path: Path, listener: int) -> None:
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(f"\0edgefn-test-{os.getpid()}")
    abstract.listen()
    (tmp_path / "scratch").mkdir()
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "f").write_text("readable")
    out = in_child(f"""
        import runtime.executors.python.host
        sandbox.no_new_privs()
        reads = [sys.base_prefix, sys.prefix, os.path.dirname(sandbox.__file__), {str(tmp_path / "ro")!r}]
        sandbox.landlock(reads, [{str(tmp_path / "scratch")!r}], ["/dev/null"])
        attempt("passwd", lambda: open("/etc/passwd").read())
        attempt("read_allowed", lambda: open({str(tmp_path / "ro" / "f")!r}).read())
        attempt("write_scratch", lambda: open({str(tmp_path / "scratch" / "w")!r}, "w").write("x"))
        attempt("write_ro", lambda: open({str(tmp_path / "ro" / "g")!r}, "w").write("x"))
        attempt("tcp", lambda: socket.create_connection(("127.0.0.1", {listener}), 2).close())
        attempt("signal_parent", lambda: os.kill(os.getppid(), 0))
        attempt("abstract_unix", lambda: socket.socket(socket.AF_UNIX).connect(
            "\\0edgefn-test-{os.getpid()}"))
        attempt("thread", thread_runs)
    """, tmp_path)
    abstract.close()
    assert out["passwd"] == ["PermissionError", 13]
    assert out["read_allowed"] == ["ok", "readable"]
    assert out["write_scratch"] == ["ok", 1]
    assert out["write_ro"] == ["PermissionError", 13]
    assert out["tcp"] == ["PermissionError", 13]  # Landlock's TCP connect rule
    assert out["signal_parent"] == ["PermissionError", 1]  # signal scoping
    assert out["abstract_unix"] == ["PermissionError", 1]  # abstract Unix socket scoping
    assert out["thread"] == ["ok", True]


def test_seccomp_alone(tmp_path: Path, listener: int) -> None:
    out = in_child(f"""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        sandbox.no_new_privs()
        sandbox.seccomp()
        attempt("fork", lambda: os.fork())
        attempt("libc_fork", lambda: (libc.fork(), ctypes.get_errno()))
        attempt("exec", lambda: os.execv(sys.executable, [sys.executable, "-c", "pass"]))
        attempt("unshare", lambda: os.unshare(0x20000))
        attempt("ptrace", lambda: (libc.ptrace(16, os.getppid(), 0, 0), ctypes.get_errno()))
        attempt("tcp", lambda: socket.create_connection(("127.0.0.1", {listener}), 2).close())
        attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
        attempt("unix", lambda: [s.close() for s in socket.socketpair()] and None)
        attempt("thread", thread_runs)
        attempt("read", lambda: len(open("/etc/hostname").read()) >= 0)
        attempt("memfd", lambda: os.memfd_create("x"))
        attempt("shmget", lambda: (libc.shmget(0, 1 << 20, 0o1600), ctypes.get_errno()))
        attempt("msgget", lambda: (libc.msgget(0, 0o1600), ctypes.get_errno()))
        attempt("mmap", lambda: len(__import__("mmap").mmap(-1, 1 << 20)))
    """, tmp_path)
    assert out["fork"] == ["PermissionError", 1]
    assert out["libc_fork"] == ["ok", [-1, 1]]  # EPERM
    assert out["exec"] == ["PermissionError", 1]
    assert out["unshare"] == ["PermissionError", 1]
    assert out["ptrace"] == ["ok", [-1, 1]]  # PTRACE_ATTACH to the parent: EPERM
    assert out["tcp"] == ["PermissionError", 1]
    assert out["udp"] == ["PermissionError", 1]
    assert out["unix"] == ["ok", None]
    assert out["thread"] == ["ok", True]  # clone with CLONE_THREAD, after clone3's ENOSYS
    assert out["read"] == ["ok", True]  # seccomp leaves files to the other layers
    # memory RLIMIT_AS does not count is refused (IPC_PRIVATE segments and queues);
    # mapped memory, which it counts, is not
    assert out["memfd"] == ["PermissionError", 1]
    assert out["shmget"] == ["ok", [-1, 1]] and out["msgget"] == ["ok", [-1, 1]]
    assert out["mmap"] == ["ok", 1 << 20]


def test_an_x32_system_call_kills_the_process_not_the_thread(tmp_path: Path) -> None:
    """The default "bad architecture" action killed only the calling thread: the
    isolate's request hung to its wall limit, its watchdog thread dead."""
    script = textwrap.dedent("""
        import ctypes, threading, time
        from runtime.executors.python import sandbox
        sandbox.no_new_privs()
        sandbox.seccomp()
        t = threading.Thread(target=lambda: ctypes.CDLL(None).syscall(0x40000000 | 39))
        t.start(); t.join()
        time.sleep(1)
        print("survived")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(Path.cwd())})
    assert proc.returncode == -31 and "survived" not in proc.stdout, proc  # SIGSYS


@needs_root
def test_mount_and_network_namespaces_alone(tmp_path: Path, listener: int) -> None:
    fn = tmp_path / "fn"
    fn.mkdir()
    (fn / "main.py").write_text("code")
    (tmp_path / "secret").write_text("secret")
    out = in_child(f"""
        import runtime.executors.python.host as h
        sandbox.enter_private_root(sandbox.read_paths({str(fn)!r}, h.package_dirs()), 4242)
        attempt("passwd", lambda: open("/etc/passwd").read())
        attempt("sibling", lambda: open({str(tmp_path / "secret")!r}).read())
        attempt("own_code", lambda: open({str(fn / "main.py")!r}).read())
        attempt("write_code", lambda: open({str(fn / "main.py")!r}, "a").write("x"))
        attempt("tmp", lambda: (os.listdir("/tmp"), os.stat("/tmp").st_uid))
        attempt("tcp", lambda: socket.create_connection(("127.0.0.1", {listener}), 2).close())
        attempt("proc", lambda: open("/proc/self/statm").read() != "")
        attempt("others_proc", lambda: os.listdir("/proc"))
        attempt("dev_null", lambda: open("/dev/null", "w").write("x"))
        attempt("write_root", lambda: open("/planted", "w"))
        attempt("write_tmp", lambda: open("/tmp/mine", "w").write("x"))
    """, tmp_path)
    assert out["passwd"] == ["FileNotFoundError", 2]
    assert out["sibling"] == ["FileNotFoundError", 2]
    assert out["own_code"] == ["ok", "code"]
    assert out["write_code"] == ["OSError", 30]  # EROFS
    # the private tmpfs holds only the mount points of read paths under /tmp
    assert out["tmp"][0] == "ok" and out["tmp"][1][1] == 4242
    under_tmp = {Path(p).relative_to("/tmp").parts[0]
                 for p in sandbox.read_paths(str(fn), host.package_dirs())
                 if Path(p).is_relative_to("/tmp")}  # a checkout in /tmp too, say
    assert sorted(out["tmp"][1][0]) == sorted(under_tmp)
    assert out["tcp"][0] == "OSError" and out["tcp"][1] == 101  # ENETUNREACH: no interfaces up
    assert out["proc"] == ["ok", True]
    assert out["others_proc"] == ["ok", ["self"]]
    assert out["dev_null"] == ["ok", 1]
    assert out["write_root"] == ["OSError", 30]  # EROFS: the new root is read-only
    assert out["write_tmp"] == ["ok", 1]  # the scratch tmpfs


@needs_root
def test_uid_alone(tmp_path: Path) -> None:
    out = in_child("""
        sandbox.drop_uid(4243)
        attempt("ids", lambda: (os.getresuid(), os.getresgid(), os.getgroups()))
        attempt("signal_parent", lambda: os.kill(os.getppid(), 0))
        attempt("regain_root", lambda: os.setuid(0))
        attempt("shadow", lambda: open("/etc/shadow").read())
    """, tmp_path)
    assert out["ids"] == ["ok", [[4243] * 3, [4243] * 3, []]]
    assert out["signal_parent"] == ["PermissionError", 1]
    assert out["regain_root"] == ["PermissionError", 1]
    assert out["shadow"] == ["PermissionError", 13]


def test_rlimits_alone(tmp_path: Path) -> None:
    big = tmp_path / "big"
    out = in_child(f"""
        import resource
        sandbox.limit_resources(threads=True)
        def write_past_the_cap():
            with open({str(big)!r}, "wb") as f:
                f.write(b"x" * ((sandbox.SCRATCH_MB << 20) + 1))
        attempt("fsize", write_past_the_cap)
        attempt("limits", lambda: [resource.getrlimit(r)[0] for r in (
            resource.RLIMIT_CORE, resource.RLIMIT_NOFILE, resource.RLIMIT_NPROC)])
    """, tmp_path)
    assert out["fsize"] == ["OSError", 27]  # EFBIG (Python ignores SIGXFSZ)
    assert big.stat().st_size == sandbox.SCRATCH_MB << 20
    assert out["limits"] == ["ok", [0, sandbox.MAX_FILES, sandbox.MAX_THREADS]]


def test_no_new_privs_alone(tmp_path: Path) -> None:
    out = in_child("""
        import ctypes
        libc = ctypes.CDLL(None)
        before = libc.prctl(39, 0, 0, 0, 0)  # PR_GET_NO_NEW_PRIVS
        sandbox.no_new_privs()
        out["nnp"] = [before, libc.prctl(39, 0, 0, 0, 0)]
    """, tmp_path)
    assert out["nnp"] == [0, 1]


def test_host_environment_keeps_nothing_of_the_pop() -> None:
    parent = {"LANG": "C.UTF-8", "AWS_SECRET_ACCESS_KEY": "x", "LD_PRELOAD": "/evil.so",
              "PYTHONPATH": "/elsewhere", "HOME": "/root"}
    env = sandbox.host_environment(["/a", "/b"], parent)
    assert env["LANG"] == "C.UTF-8" and env["PYTHONPATH"] == "/a:/b"
    assert not {"AWS_SECRET_ACCESS_KEY", "LD_PRELOAD", "HOME"} & set(env)
    assert set(env) == {"LANG", "PYTHONPATH", "MALLOC_ARENA_MAX", "PYTHONDONTWRITEBYTECODE",
                        "PYTHONNOUSERSITE", "TMPDIR", "PATH"}


def test_host_environment_keeps_the_native_switches_and_cache() -> None:
    """The host loads the C codec (`edgefn_core.fastcodec`) as the PoP would: from
    its cache, or not at all."""
    parent = {"EDGEFN_NATIVE_CODEC": "0", "EDGEFN_NATIVE": "1", "EDGEFN_NATIVE_CACHE": "/c",
              "CC": "/evil-cc"}
    env = sandbox.host_environment(["/a"], parent)
    assert {k: env.get(k) for k in parent} == {**parent, "CC": None}


def test_apply_refuses_a_process_with_threads(tmp_path: Path) -> None:
    out = in_child("""
        import time
        threading.Thread(target=time.sleep, args=(2,), daemon=True).start()
        attempt("apply", lambda: sandbox.apply([], "/tmp", 4244))
    """, tmp_path)
    assert out["apply"] == ["SandboxError", None]
