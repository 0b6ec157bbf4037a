"""A hostile Python function: ``GET /hostile?attack=NAME&arg=...`` tries one attack
from inside its isolate and answers what happened, as JSON: ``{"ok": true,
"result": ...}`` when the attack went through, else ``{"ok": false, "error":
"<exception type>", "errno": N, "message": "..."}``. The tests assert which."""

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile

from edgefn import Response

libc = ctypes.CDLL(None, use_errno=True)


def _libc_errno(result):
    """A libc call's -1 as the OSError it stands for; anything else is success."""
    if result == -1:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return result


def read(arg):
    with open(arg, "rb") as f:
        return f.read(200).decode(errors="replace")


def write(arg):
    with open(arg, "w") as f:
        f.write("overwritten by the hostile function")
    return "written"


def environ(arg):
    return dict(os.environ)


def proc_environ(arg):
    return read(f"/proc/{arg}/environ")


def run_subprocess(arg):
    return subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True).returncode


def posix_spawn(arg):
    return os.posix_spawn(sys.executable, [sys.executable, "-c", "pass"], {})


def libc_fork(arg):
    pid = _libc_errno(libc.fork())
    if pid == 0:
        os._exit(0)
    return pid


def libc_system(arg):
    """system() reports a shell it could not start as exit status 127."""
    status = _libc_errno(libc.system(b"exit 7"))
    if status == 127 << 8:
        raise ChildProcessError("system(): the shell could not be started (status 127)")
    return status


def kill(arg):
    os.kill(int(arg), signal.SIGKILL)
    return "sent"


def truncate(arg):
    with open(arg, "r+b") as f:
        f.truncate(0)
    return "truncated"


def tcp_connect(arg):
    s = socket.create_connection(("127.0.0.1", int(arg)), timeout=2)
    s.close()
    return "connected"


def udp_send(arg):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return s.sendto(b"leak", ("127.0.0.1", int(arg)))


def write_tmp(arg):
    with open(f"/tmp/{arg}", "w") as f:
        f.write("secret from the hostile function")
    return os.listdir("/tmp")


def write_own_code(arg):
    with open(os.path.join(os.getcwd(), "main.py"), "a") as f:
        f.write("\n# tampered\n")
    return "written"


def scratch(arg):
    """Write a file in the scratch dir; list what the dir held before."""
    d = tempfile.gettempdir()
    before = sorted(os.listdir(d))
    with open(os.path.join(d, arg), "w") as f:
        f.write("x" * 1000)
    return {"dir": d, "before": before}


def pop_output(arg):
    """Write a forged line to fds 1 and 2, then truncate fd 1: what they are."""
    os.write(2, b"2099-01-01 00:00:00 ERROR edgefn.pop: FORGED " + arg.encode() + b"\n")
    os.write(1, b"\x1b[2Jansi " + arg.encode() + b"\n")
    try:
        os.ftruncate(1, 0)
    except OSError as e:
        return f"ftruncate refused: {e.errno}"
    return "ftruncate worked"


def identity(arg):
    return {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
            "pid": os.getpid()}


ATTACKS = {f.__name__: f for f in (
    read, write, environ, proc_environ, run_subprocess, posix_spawn, libc_fork, libc_system, kill,
    truncate, tcp_connect, udp_send, write_tmp, write_own_code, scratch, identity, pop_output)}


def handle(request, env):
    attack = ATTACKS[request.query["attack"]]
    try:
        result = attack(request.query.get("arg", ""))
    except Exception as e:
        return Response(json.dumps({"ok": False, "error": type(e).__name__,
                                    "errno": getattr(e, "errno", None), "message": str(e)}))
    return Response(json.dumps({"ok": True, "result": result}))
