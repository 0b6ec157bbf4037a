"""The isolate host's sandbox: kernel mechanisms, layered, that confine a host
process before any user code runs in it (`apply`, called by `host.main`).

Layers, in the order they are applied (each one alone is a barrier):

- ``environment``: the PoP spawns the host with a scrubbed environment
  (`host_environment`): only what the host needs and what the manifest's ``env`` grants.
- ``mount_namespace`` (root): a private mount namespace whose root is a tmpfs
  holding read-only bind mounts, at their own absolute paths, of only what the
  host needs (`read_paths`), a few device nodes, this process's own ``/proc``
  entry, and a size-capped tmpfs ``/tmp`` as scratch space. The PoP's data dir,
  other functions and ``/etc`` are not there at all.
- ``network_namespace`` (root): an empty network namespace: no TCP, no UDP, no loopback.
- ``uid`` (root): setgroups([]), then an unprivileged uid/gid of its own (no capabilities).
- ``rlimits``: processes/threads, file size, open files, no core files.
- ``no_new_privs``: PR_SET_NO_NEW_PRIVS.
- ``landlock``: read-only on `read_paths`, writes only in the scratch dir, no TCP
  bind/connect, no signals and no abstract Unix sockets outside the host.
  Without root this is the filesystem layer.
- ``seccomp``: exec, process creation (clone without CLONE_THREAD), ptrace,
  mount, namespaces, modules, keyrings, bpf, io_uring, non-Unix sockets... fail
  with EPERM (clone3 with ENOSYS, so glibc falls back to clone for threads).

Landlock, seccomp and no_new_privs bind the calling thread and the threads it
starts later, so `apply` must run while the host has one thread.

`python -m runtime.executors.python.sandbox` applies every layer to a throwaway
process and prints, as JSON, which ones hold on this machine (`edgefn doctor`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import resource
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from edgefn_core.errors import SandboxError

LAYERS = ("environment", "mount_namespace", "network_namespace", "uid", "rlimits",
          "no_new_privs", "landlock", "seccomp")
ROOT_ONLY = ("mount_namespace", "network_namespace", "uid")

SCRATCH_MB = 64  # the size of the scratch tmpfs (root) / the largest file written (RLIMIT_FSIZE)
MAX_THREADS = 256  # RLIMIT_NPROC: threads of the host's own uid (isolates are threads)
MAX_FILES = 512  # RLIMIT_NOFILE
UID_BASE = 200_000  # hosts run as UID_BASE + n (root only): one uid per host
UID_RANGE = 50_000
# What a host keeps from the PoP's environment, besides what it is given.
KEEP_ENV = ("LANG", "LC_ALL", "LC_CTYPE", "TZ")
# ... and where the C codec is cached, or that it is off (`edgefn_core.fastcodec`): the
# host loads it from the PoP's cache before its sandbox, its guests after
KEEP_NATIVE_ENV = ("EDGEFN_NATIVE", "EDGEFN_NATIVE_CODEC", "EDGEFN_NATIVE_CACHE")
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
SYSTEM_PATHS = ("/usr", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/localtime")
# Layers (comma-separated) the probe reports missing without trying them: how an
# operator, or a test, sees what a machine lacking them does. It never weakens a
# host: a missing layer makes the PoP refuse Python functions (or, with
# --insecure-python, only say so).
SKIP_ENV = "EDGEFN_SANDBOX_SKIP"

libc = ctypes.CDLL(None, use_errno=True)


# -- environment (applied by the PoP at spawn) ------------------------------------------------
def host_environment(import_roots: Iterable[str],
                     parent: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The whole environment a host process starts with: locale settings from
    `parent`, and what the host needs (PYTHONPATH to edgefn's `import_roots`,
    malloc and bytecode settings, TMPDIR). Nothing else of the PoP's environment.
    The manifest's ``env`` is added by the host once sandboxed (`host.enter_sandbox`),
    so that the dynamic loader and the interpreter's startup never read it."""
    env = {k: parent[k] for k in KEEP_ENV + KEEP_NATIVE_ENV if k in parent}
    env.update({"PYTHONPATH": os.pathsep.join(import_roots), "MALLOC_ARENA_MAX": "2",
                "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1", "TMPDIR": "/tmp",
                "PATH": "/usr/bin:/bin"})
    return env


# -- what the host may read ------------------------------------------------------------------
def read_paths(function_dir: str, packages: Iterable[str]) -> list[str]:
    """Everything a host reads: the interpreter and its stdlib, the venv (its
    site-packages), edgefn's own `packages` (their folders, not the checkout
    around them), the function's folder, system libraries."""
    found = [sys.base_prefix, sys.prefix, *packages, function_dir, *SYSTEM_PATHS]
    return list(dict.fromkeys(p for p in found if os.path.lexists(p)))


# -- the mount and network namespaces (root) -------------------------------------------------
CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWIPC = 0x00020000, 0x40000000, 0x08000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
SYS_PIVOT_ROOT = 155


def _check(result: int, what: str) -> None:
    """Raises `SandboxError` naming `what` when a libc call returned -1."""
    if result == -1:
        e = ctypes.get_errno()
        raise SandboxError(f"{what}: {os.strerror(e)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    """mount(2). Raises `SandboxError`."""
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    _check(libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]),
           f"mount {source} on {target}")


def _bind(source: str, target: str, writable: bool = False) -> None:
    """Bind `source` (already under the old root) at `target`, read-only unless
    `writable`. Raises `SandboxError` (or OSError creating the mount point)."""
    if os.path.isdir(source):
        os.makedirs(target, 0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
        open(target, "a").close()
    _mount(source, target, None, MS_BIND | MS_REC)
    ro = 0 if writable else MS_RDONLY
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_NOSUID | ro)


def _place(old: str, new: str, path: str, writable: bool = False) -> None:
    """Make `path` of the old root (mounted at `old`) appear at the same path under
    `new`: a symlink is copied as a symlink, anything else bind-mounted."""
    target = new + path
    if os.path.islink(old + path):
        os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
        os.symlink(os.readlink(old + path), target)
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(old + path)))
        if not os.path.lexists(new + resolved) and os.path.lexists(old + resolved):
            _place(old, new, resolved, writable)
    else:
        _bind(old + path, target, writable)


def enter_private_root(reads: Iterable[str], uid: int) -> None:
    """Move this process into new mount and network namespaces whose root holds
    only `reads` (read-only), `DEVICES`, its own /proc entry and a private scratch
    tmpfs at /tmp owned by `uid`. Root only. Raises `SandboxError`."""
    try:
        os.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC)
    except OSError as e:
        raise SandboxError(f"unshare(mount, network): {e.strerror}") from None
    pid = os.getpid()
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # bubblewrap's way: a tmpfs on /tmp becomes the root, the old root moves under it
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    os.chdir("/tmp")
    os.mkdir("newroot", 0o755)
    os.mkdir("oldroot", 0o755)
    _mount("tmpfs", "newroot", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    _check(libc.syscall(SYS_PIVOT_ROOT, b".", b"oldroot"), "pivot_root")
    # first the scratch tmpfs: what `reads` has under /tmp is bound inside it (read-only)
    os.makedirs("/newroot/tmp", 0o755, exist_ok=True)
    _mount("tmpfs", "/newroot/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
           f"mode=0700,uid={uid},gid={uid},size={SCRATCH_MB}m")
    for path in reads:
        _place("/oldroot", "/newroot", path)
    for dev in DEVICES:
        _bind("/oldroot" + dev, "/newroot" + dev, writable=True)
    _bind(f"/oldroot/proc/{pid}", "/newroot/proc/self")
    _check(libc.umount2(b"/oldroot", MNT_DETACH), "umount old root")
    _mount(None, "/newroot", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir("/newroot")
    _check(libc.syscall(SYS_PIVOT_ROOT, b".", b"."), "pivot_root into the new root")
    _check(libc.umount2(b".", MNT_DETACH), "umount the staging root")
    os.chdir("/")


# -- uid, rlimits, no_new_privs --------------------------------------------------------------
def drop_uid(uid: int) -> None:
    """setgroups([]), then gid and uid `uid` (real, effective and saved): every
    capability is gone. Raises `SandboxError`."""
    try:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    except OSError as e:
        raise SandboxError(f"dropping to uid {uid}: {e.strerror}") from None


def limit_resources(threads: bool) -> None:
    """No core files, files up to `SCRATCH_MB`, `MAX_FILES` open files and (when
    `threads`: the host has a uid of its own) `MAX_THREADS` threads."""
    limits = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, SCRATCH_MB << 20),
              (resource.RLIMIT_NOFILE, MAX_FILES)]
    if threads:
        limits.append((resource.RLIMIT_NPROC, MAX_THREADS))
    for which, value in limits:
        _, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))


PR_SET_NO_NEW_PRIVS = 38


def no_new_privs() -> None:
    """No execve() of this thread or its children gains privileges (setuid bits,
    file capabilities); Landlock and seccomp need it. Raises `SandboxError`."""
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


# -- landlock ---------------------------------------------------------------------------------
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1, 2, 4, 8
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2
LANDLOCK_ABI = 6  # the oldest ABI with everything used here (network rules, scoping)


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The Landlock ABI this kernel offers; 0 when it has none."""
    abi = libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), CREATE_RULESET_VERSION)
    return max(abi, 0)


def fs_access(abi: int) -> int:
    """Every filesystem right Landlock `abi` handles."""
    every = (1 << 13) - 1
    return every | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0) | (
        FS_IOCTL_DEV if abi >= 5 else 0)


def landlock(reads: Iterable[str], writes: Iterable[str], devices: Iterable[str],
             listable: Iterable[str] = ()) -> None:
    """Restrict this thread (and threads it starts later) to reading `reads`,
    listing (not reading) `listable` (import roots: Python lists a sys.path entry
    to find modules in it), reading and writing `devices`, anything but executing
    in `writes`; no TCP
    bind/connect; no signals or abstract Unix sockets outside. Needs no_new_privs.
    Raises `SandboxError` when the kernel lacks Landlock ABI `LANDLOCK_ABI`."""
    abi = landlock_abi()
    if abi < LANDLOCK_ABI:
        raise SandboxError(f"Landlock ABI {abi} (needs {LANDLOCK_ABI}: network rules and "
                           "scoping)")
    handled = fs_access(abi)
    attr = RulesetAttr(handled, NET_BIND_TCP | NET_CONNECT_TCP,
                       SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL)
    fd = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
                      0)
    _check(fd, "landlock_create_ruleset")
    try:
        read = FS_READ_FILE | FS_READ_DIR
        write = handled & ~FS_EXECUTE
        for paths, access in ((reads, read), (listable, FS_READ_DIR),
                              (devices, read | FS_WRITE_FILE | FS_IOCTL_DEV), (writes, write)):
            for path in paths:
                _allow(fd, path, access & handled)
        _check(libc.syscall(SYS_RESTRICT_SELF, fd, 0), "landlock_restrict_self")
    finally:
        os.close(fd)


def _allow(ruleset: int, path: str, access: int) -> None:
    """Add a rule granting `access` beneath `path`. Raises `SandboxError`."""
    try:
        target = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as e:
        raise SandboxError(f"landlock: cannot open {path}: {e.strerror}") from None
    try:
        if not os.path.isdir(path):  # files take file rights only
            access &= FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV | FS_EXECUTE
        rule = PathBeneath(access, target)
        _check(libc.syscall(SYS_ADD_RULE, ruleset, RULE_PATH_BENEATH, ctypes.byref(rule), 0),
               f"landlock_add_rule {path}")
    finally:
        os.close(target)


# -- seccomp ----------------------------------------------------------------------------------
DENIED = (
    "execve", "execveat", "fork", "vfork", "ptrace", "process_vm_readv", "process_vm_writev",
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "init_module",
    "finit_module", "delete_module", "kexec_load", "kexec_file_load", "keyctl", "add_key",
    "request_key", "bpf", "perf_event_open", "reboot", "swapon", "swapoff", "acct",
    "open_by_handle_at", "name_to_handle_at", "userfaultfd", "fsopen", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr", "iopl", "ioperm", "settimeofday",
    "clock_settime", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "pidfd_getfd", "process_madvise", "kcmp", "quotactl", "syslog", "personality",
    # memory RLIMIT_AS does not count: a memfd written and never mapped, a System V
    # segment detached (2 GB held by a function capped at 64 MB, 64 MiB a memfd), a
    # message queue's messages
    "memfd_create", "memfd_secret", "shmget", "msgget", "mq_open",
)
CLONE_THREAD = 0x00010000


def seccomp() -> None:
    """Load a filter that makes `DENIED` calls, clone without CLONE_THREAD and
    sockets other than AF_UNIX fail with EPERM (clone3: ENOSYS). Needs
    no_new_privs. Raises `SandboxError` when libseccomp cannot be loaded."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError) as e:
        raise SandboxError(f"libseccomp is not available: {e}") from None
    f = sc.SyscallFilter(defaction=sc.ALLOW)
    # another ABI's call (x32's, on x86-64) kills the process: the default killed only
    # the thread, which left the isolate's request hanging until its wall limit
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    eperm = sc.ERRNO(errno.EPERM)
    for name in DENIED:
        f.add_rule(eperm, name)
    f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    f.add_rule(eperm, "socket", sc.Arg(0, sc.NE, socket.AF_UNIX))
    f.load()


# -- all of it --------------------------------------------------------------------------------
def single_threaded() -> bool:
    return len(os.listdir("/proc/self/task")) == 1


def apply(reads: list[str], scratch: str, uid: int, strict: bool = True,
          listable: Iterable[str] = (), skip: Iterable[str] = ()) -> dict[str, str]:
    """Apply every layer this machine has to this process, in order; returns each
    layer's state ("enforced", or why not). Call it while the process has one thread.
    `scratch` is the one writable dir (as root, a private tmpfs at /tmp replaces it);
    `listable`: dirs whose entries may be listed, not read (see `landlock`); the
    layers in `skip` are reported missing without being tried (`SKIP_ENV`).

    With `strict`, raises `SandboxError` at the first layer that cannot be applied
    (the ``ROOT_ONLY`` layers are skipped, not failed, when not running as root).
    """
    if not single_threaded():
        raise SandboxError("the sandbox must be applied before the host starts threads")
    import pyseccomp  # noqa: F401  (it looks for a temp dir on import: before Landlock)

    root = os.geteuid() == 0
    state = {"environment": "enforced"}
    devices = [d for d in DEVICES if os.path.exists(d)]

    def layer(name: str, step: object, *args: object) -> None:
        if name in skip:
            state[name] = f"missing: skipped ({SKIP_ENV})"
            return
        try:
            step(*args)  # type: ignore[operator]
        except (SandboxError, OSError) as e:
            if strict:
                raise SandboxError(f"sandbox layer {name}: {e}") from None
            state[name] = f"missing: {e}"
        else:
            state[name] = "enforced"

    if root:
        layer("mount_namespace", enter_private_root, reads, uid)
        state["network_namespace"] = state["mount_namespace"]
        if state["mount_namespace"] == "enforced":
            devices, scratch = list(DEVICES), "/tmp"  # the private tmpfs
        layer("uid", drop_uid, uid)
    else:
        for name in ROOT_ONLY:
            state[name] = "not applicable: the PoP does not run as root (Landlock and seccomp " \
                          "confine files and sockets)"
    layer("rlimits", limit_resources, root)
    layer("no_new_privs", no_new_privs)
    layer("landlock", landlock, [*reads, "/proc/self"], [scratch], devices, listable)
    layer("seccomp", seccomp)
    return state


def scratch_dir(root: bool) -> str:
    """The host's scratch dir before the sandbox: /tmp (a private tmpfs once the
    mount namespace is in place) as root, else a fresh private dir under the temp dir."""
    return "/tmp" if root else tempfile.mkdtemp(prefix="edgefn-scratch-")


def wipe(directory: str) -> None:
    """Empty `directory` (create it if missing); what cannot be removed is left."""
    os.makedirs(directory, 0o700, exist_ok=True)
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


# -- the probe (`edgefn doctor`) ---------------------------------------------------------------
def probe_main(scratch: str) -> None:
    """Apply every layer to this (throwaway) process, then try what some of them
    should stop, and print {layer: state} as JSON."""
    here = str(Path(__file__).resolve().parent)
    skip = os.environ.get(SKIP_ENV, "").split(",")
    state = apply(read_paths(here, [here]), scratch, UID_BASE + UID_RANGE - 1, strict=False,
                  listable=[os.path.dirname(here)], skip=skip)
    for name, broken in _leaks().items():
        if state.get(name) == "enforced" and broken:
            state[name] = f"missing: {broken}"
    print(json.dumps(state), flush=True)
    os._exit(0)


def _leaks() -> dict[str, str]:
    """What got through layers that said they were in place ("" when nothing did)."""
    found = {"uid": "still root" if os.getuid() == 0 else ""}
    try:
        if os.fork() == 0:
            os._exit(0)
        found["seccomp"] = "fork() succeeded"
    except OSError:
        found["seccomp"] = ""
    try:
        open("/etc/passwd", "rb").close()
        found["mount_namespace"] = "/etc/passwd is readable"
    except OSError:
        found["mount_namespace"] = ""
    return found


if __name__ == "__main__":
    probe_main(sys.argv[1] if len(sys.argv) > 1 else scratch_dir(os.geteuid() == 0))
