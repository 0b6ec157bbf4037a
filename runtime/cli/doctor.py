"""`edgefn doctor`: which layers of the Python sandbox this machine enforces."""

from __future__ import annotations

import argparse
import json

from runtime.executors.python import policy

WHAT = {
    "environment": "host environment scrubbed (manifest `env` only)",
    "mount_namespace": "private root: only stdlib, venv, SDK, own folder (read-only)",
    "network_namespace": "empty network namespace (no TCP, UDP, loopback)",
    "uid": "unprivileged uid/gid of its own, no capabilities",
    "rlimits": "threads, file size, open files, no core files",
    "no_new_privs": "PR_SET_NO_NEW_PRIVS",
    "landlock": "Landlock: read-only paths, scratch writes, no TCP, signal/socket scoping",
    "seccomp": "seccomp: no exec, fork, ptrace, mount, modules, keyrings, inet sockets",
}


def doctor(args: argparse.Namespace) -> int:
    """Print each layer and its state (JSON with --json); exit status 0 either way,
    which the listing itself says: whether Python functions would be refused."""
    state = policy.probe()
    gone = policy.missing(state)
    if args.json:
        print(json.dumps({"python_sandbox": state, "complete": not gone}, indent=2))
        return 0
    print("Python function sandbox (each isolate host, applied before user code runs):")
    for layer, value in state.items():
        mark = "ok " if value == "enforced" else ("-- " if value.startswith("not") else "NO ")
        print(f"  {mark} {layer:<18} {value if value != 'enforced' else WHAT[layer]}")
    if gone:
        print("Python functions are refused unless the PoP runs with --insecure-python.")
    else:
        print("Every layer is enforced.")
    return 0
