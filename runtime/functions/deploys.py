"""Versioned, content-addressed deploys persisted in the data dir.

Layout::

    DATA/versions/NAME/VERSION/...        the function's files, never modified
    DATA/versions/NAME/VERSION.files      their SHA-256 hashes (JSON, path -> hex)
    DATA/functions/NAME.json              which version is current, and the history
    DATA/cache/*.cwasm                    compiled machine code (runtime.executors)

A version is the first 16 hex digits of a hash over the package's paths and
contents, so deploying the same files twice is the same version. A version's
files and folders are fsynced, then renamed into place (and that rename fsynced),
before any record names it; records are written to a temp file, fsynced and
renamed: a crash leaves the old record or the new one, never a torn one, and
never one naming a version whose files did not reach the disk.

Loading a version (`DeployStore.verify`) re-hashes its files: an edited, added or
removed file makes that version refused (`VersionTampered`, naming the file).

A package is checked before anything is written (`check_package`, and `from_tar`
while it reads, so a package of millions of entries stops at the limit): at most
`MAX_PACKAGE_ENTRIES` tar entries (directories included), `MAX_PACKAGE_FILES`
files, `MAX_PACKAGE_BYTES` unpacked, paths of at most `MAX_PATH_BYTES` UTF-8 bytes,
`MAX_NAME_BYTES` per name and `MAX_DEPTH` names deep; plain files only (no links,
devices, FIFOs or sparse files), relative, without ``..``, and no path both a file
and a folder. A write that fails removes what it wrote.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import tarfile
import time
import tomllib
from pathlib import Path

import msgspec

from edgefn_core.errors import DeployError, NotFound, VersionTampered
from runtime.functions.manifest import MANIFEST_NAME, NAME_PATTERN

MAX_PACKAGE_BYTES = 64 << 20
MAX_PACKAGE_FILES = 2000
MAX_PACKAGE_ENTRIES = 4000
MAX_PATH_BYTES = 256
MAX_NAME_BYTES = 128
MAX_DEPTH = 16
SKIP_NAMES = frozenset({"__pycache__", "node_modules", "target"})
SUMS_SUFFIX = ".files"
FUNCTION_NAME = re.compile(NAME_PATTERN)

Files = dict[str, bytes]


class Event(msgspec.Struct):
    version: str
    at: float
    action: str  # "deploy" | "rollback" | "canary" | "promote" | "canary_dropped"


class VersionInfo(msgspec.Struct):
    version: str
    created_at: float
    source: str = ""


class CanaryInfo(msgspec.Struct):
    """A version serving `percent` % of the requests beside the current one."""

    version: str
    percent: float


class FunctionRecord(msgspec.Struct):
    name: str
    current: str
    versions: list[VersionInfo] = []  # oldest first
    history: list[Event] = []
    canary: CanaryInfo | None = None

    def previous(self) -> str | None:
        """The version that served before the current one, or None. The history is a
        stack of what served: a deploy or promote pushes its version (a redeploy of
        older files too), a rollback pops back to its target, so rollbacks walk back
        one step each. A record without that history: the version created before
        the current one."""
        served: list[str] = []
        for e in self.history:
            if e.action in ("deploy", "promote"):
                if not served or served[-1] != e.version:
                    served.append(e.version)
            elif e.action == "rollback":
                if e.version in served:
                    del served[len(served) - served[::-1].index(e.version):]
                else:
                    served.append(e.version)
        if len(served) >= 2 and served[-1] == self.current:
            return served[-2]
        order = [v.version for v in self.versions]
        i = order.index(self.current) if self.current in order else 0
        return order[i - 1] if i > 0 else None


def version_of(files: Files) -> str:
    return _version_of_sums(sums_of(files))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sums_of(files: Files) -> dict[str, str]:
    """Each file's SHA-256, hex."""
    return {path: hashlib.sha256(data).hexdigest() for path, data in files.items()}


def _version_of_sums(sums: dict[str, str]) -> str:
    h = hashlib.sha256()
    for path in sorted(sums):
        h.update(path.encode() + b"\0" + bytes.fromhex(sums[path]))
    return h.hexdigest()[:16]


def check_path(name: str) -> str:
    """`name` without a leading ``./``. Raises `DeployError` unless it is a relative
    path of valid UTF-8 names within the length and depth limits, without ``..``,
    empty names, backslashes or control characters."""
    name = name.removeprefix("./")
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise DeployError(f"package entry {name!r} is not a plain relative path")
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        raise DeployError(f"package entry {name!r} is not valid UTF-8") from None
    if any(c < " " or c in "\\\x7f" for c in name):
        raise DeployError(f"package entry {name!r} has a backslash or control character")
    if size > MAX_PATH_BYTES:
        raise DeployError(f"package entry {name[:60]!r}... is {size} bytes long; the limit is "
                          f"{MAX_PATH_BYTES}")
    if len(parts) > MAX_DEPTH:
        raise DeployError(f"package entry {name[:60]!r} is {len(parts)} names deep; the limit "
                          f"is {MAX_DEPTH}")
    if any(len(p.encode()) > MAX_NAME_BYTES for p in parts):
        raise DeployError(f"package entry {name[:60]!r} has a name longer than "
                          f"{MAX_NAME_BYTES} bytes")
    return name


def check_package(files: Files) -> None:
    """Raises `DeployError` for a package over the limits, a bad path (`check_path`)
    or a path that is both a file and a folder (``a`` and ``a/b``)."""
    if len(files) > MAX_PACKAGE_FILES:
        raise DeployError(f"package has {len(files)} files; the limit is {MAX_PACKAGE_FILES}")
    total = sum(len(d) for d in files.values())
    if total > MAX_PACKAGE_BYTES:
        raise DeployError(f"package holds {total} bytes; the limit is {MAX_PACKAGE_BYTES} "
                          f"({MAX_PACKAGE_BYTES >> 20} MiB)")
    for name in files:
        if check_path(name) != name:
            raise DeployError(f"package entry {name!r} is not a plain relative path")
    folders = {"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)}
    for clash in sorted(folders & files.keys())[:1]:
        raise DeployError(f"package entry {clash!r} is both a file and a folder")


def pack_dir(directory: str | Path) -> Files:
    """Read a function folder (skipping dotfiles, __pycache__ and the like, but for
    the manifest's ``entry``: Cargo builds into ``target/``).

    Raises `DeployError` if it is not a folder, holds a symbolic link, or is not a
    valid package (`check_package`).
    """
    root = Path(directory)
    if not root.is_dir():
        raise DeployError(f"{directory}: not a directory")
    files: Files = {}
    total = 0
    entry = _entry_of(root)
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(p.startswith(".") or p in SKIP_NAMES for p in rel.parts) and \
                rel.as_posix() != entry:
            continue
        if path.is_symlink():  # what it points to (/etc/passwd) is not the function's
            raise DeployError(f"{directory}: {rel.as_posix()} is a symbolic link; a package "
                              "holds plain files and folders only (copy the file in)")
        if path.is_dir():
            continue
        if not path.is_file():  # a FIFO, a socket, a device: no file a function can hold
            raise DeployError(f"{directory}: {rel.as_posix()} is not a plain file (a FIFO, "
                              "socket or device); a package holds plain files and folders")
        if len(files) >= MAX_PACKAGE_FILES:
            raise DeployError(f"{directory}: package has more than {MAX_PACKAGE_FILES} files "
                              f"(the limit), at {rel.as_posix()}")
        data = path.read_bytes()
        total += len(data)
        if total > MAX_PACKAGE_BYTES:
            raise DeployError(f"{directory}: package holds more than {MAX_PACKAGE_BYTES >> 20} "
                              f"MiB (the limit) by {rel.as_posix()} ({len(data)} bytes)")
        files[rel.as_posix()] = data
    try:
        check_package(files)
    except DeployError as e:
        raise DeployError(f"{directory}: {e}") from None
    return files


def _entry_of(root: Path) -> str | None:
    """The ``entry`` `root`'s manifest names, as a relative POSIX path, or None (no
    manifest, or one the deploy refuses for itself)."""
    try:
        with (root / MANIFEST_NAME).open("rb") as f:
            entry = tomllib.load(f).get("entry")
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    return entry if isinstance(entry, str) else None


def to_tar(files: Files) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def from_tar(blob: bytes) -> Files:
    """Unpack a deploy package in memory. Blocking (run it off the event loop).

    Raises `DeployError` for anything but folders and plain files with valid paths
    (`check_path`), a name given twice, a package over the limits (checked entry by
    entry, before reading any data past them) or one that is not a tar archive.
    """
    files: Files = {}
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as tar:
            for count, info in enumerate(tar, 1):
                if count > MAX_PACKAGE_ENTRIES:
                    raise DeployError(f"package has more than {MAX_PACKAGE_ENTRIES} entries "
                                      "(files and folders)")
                name = check_path(info.name)
                if info.isdir():
                    continue
                if not info.isfile() or info.issparse():
                    raise DeployError(f"package entry {name!r} is not a plain file or folder "
                                      "(links, devices and sparse files are refused)")
                total += info.size
                if len(files) >= MAX_PACKAGE_FILES:
                    raise DeployError(f"package has more than {MAX_PACKAGE_FILES} files (the "
                                      f"limit), at {name!r}")
                if total > MAX_PACKAGE_BYTES:
                    raise DeployError(f"package holds more than {MAX_PACKAGE_BYTES} bytes "
                                      f"({MAX_PACKAGE_BYTES >> 20} MiB, the limit) by {name!r} "
                                      f"({info.size} bytes)")
                if name in files:
                    raise DeployError(f"package entry {name!r} appears twice")
                member = tar.extractfile(info)
                assert member is not None
                files[name] = member.read()
    except (tarfile.TarError, EOFError, OSError, ValueError) as e:
        raise DeployError(f"package is not a valid tar archive: {e}") from None
    check_package(files)
    return files


class DeployStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.functions_dir = self.root / "functions"
        self.versions_dir = self.root / "versions"
        for d in (self.functions_dir, self.versions_dir):
            d.mkdir(parents=True, exist_ok=True)

    def version_dir(self, name: str, version: str) -> Path:
        return self.versions_dir / name / version

    def sums_path(self, name: str, version: str) -> Path:
        return self.versions_dir / name / f"{version}{SUMS_SUFFIX}"

    def write_version(self, name: str, version: str, files: Files) -> bool:
        """Store a version's files and their hashes; returns False if that version was
        already stored intact (a stored copy that fails `verify` is replaced).

        Blocking. Raises `DeployError` if the files cannot be written (a name the file
        system refuses, a full disk); then nothing of this version is left behind.
        """
        final = self.version_dir(name, version)
        if final.is_dir():
            try:
                self.verify(name, version)
                return False
            except VersionTampered:
                self.remove_version(name, version)
        staging = self.versions_dir / name / f".staging-{version}-{os.getpid()}"
        try:
            shutil.rmtree(staging, ignore_errors=True)
            folders = {staging}
            for rel, data in files.items():
                path = staging / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                folders.add(path.parent)
                with open(path, "wb") as f:  # on disk before the record names this version
                    f.write(data)
                    os.fsync(f.fileno())
            for folder in folders:
                _fsync_dir(folder)
            _write_synced(self.sums_path(name, version),
                          msgspec.json.encode(dict(sorted(sums_of(files).items()))))
            os.replace(staging, final)
            _fsync_dir(final.parent)  # the rename too
        except OSError as e:
            shutil.rmtree(staging, ignore_errors=True)
            self.remove_version(name, version)
            raise DeployError(f"cannot store the package: {e}") from None
        return True

    def sweep(self) -> list[str]:
        """Remove what deploys killed mid-way left (blocking; run before this PoP
        deploys anything): `.staging-*` folders of processes no longer running, and
        version folders (with their sums) no record names, the files of a deploy that
        never reached its commit point. Returns the paths removed (logged). They
        piled up for good: a kill -9 during a 28 MB deploy left 4 of them."""
        removed = []
        for folder in sorted(p for p in self.versions_dir.iterdir() if p.is_dir()):
            try:
                known = {v.version for v in self.record(folder.name).versions}
            except NotFound:
                known = set()
            for entry in sorted(folder.iterdir()):
                if entry.name.startswith(".staging-"):
                    pid = entry.name.rpartition("-")[2]
                    if pid.isdigit() and _running(int(pid)):
                        continue  # another process of this PoP is writing it
                elif entry.is_dir() and entry.name not in known:
                    self.sums_path(folder.name, entry.name).unlink(missing_ok=True)
                else:
                    continue
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(str(entry))
            with contextlib.suppress(OSError):  # empty: a function never committed
                folder.rmdir()
        return removed

    def remove_version(self, name: str, version: str) -> None:
        """Remove a version's files and hashes, and its function's folder if empty."""
        shutil.rmtree(self.version_dir(name, version), ignore_errors=True)
        self.sums_path(name, version).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # other versions are stored there, or none was
            (self.versions_dir / name).rmdir()

    def verify(self, name: str, version: str) -> None:
        """Re-hash a stored version's files against the hashes it was deployed with.
        Blocking: reads every file.

        Raises `VersionTampered` naming the file edited, added, removed or not a
        plain file, or if the stored hashes no longer give `version`; `NotFound` if
        the version is not stored.
        """
        root = self.version_dir(name, version)
        if not root.is_dir():
            raise NotFound(f"{name} has no stored version {version!r}")
        where = "stored file"
        on_disk = _read_tree(root, where)
        try:
            expected = msgspec.json.decode(self.sums_path(name, version).read_bytes(),
                                           type=dict[str, str])
        except FileNotFoundError:  # stored before hashes were kept: check the whole
            if version_of(on_disk) != version:
                raise VersionTampered("the stored files no longer hash to their version "
                                      "(changed after the deploy)") from None
            return
        except (msgspec.DecodeError, msgspec.ValidationError, OSError) as e:
            raise VersionTampered(f"its list of file hashes is unreadable: {e}") from None
        _compare(expected, sums_of(on_disk), where)
        if _version_of_sums(expected) != version:
            raise VersionTampered(f"its list of file hashes ({name}/{version}{SUMS_SUFFIX}) "
                                  "was edited")

    def cached(self) -> frozenset[str]:
        """The names in the compiled-code cache (to undo a failed deploy's entries)."""
        try:
            return frozenset(os.listdir(self.root / "cache"))
        except FileNotFoundError:
            return frozenset()

    def uncache(self, before: frozenset[str]) -> None:
        """Remove compiled-code cache entries made since `before` (a failed deploy's),
        and the cache folder if that leaves it empty and it was not there before."""
        cache = self.root / "cache"
        for name in self.cached() - before:
            (cache / name).unlink(missing_ok=True)
        if not before:
            with contextlib.suppress(OSError):
                cache.rmdir()

    def record(self, name: str) -> FunctionRecord:
        """Raises `NotFound` if `name` is not deployed (or is no function name: one
        with a NUL was a 500, one with ``../`` named a file outside the folder)."""
        if FUNCTION_NAME.fullmatch(name) is None:
            raise NotFound(f"no function named {name!r} is deployed (not a function name)")
        try:
            return msgspec.json.decode((self.functions_dir / f"{name}.json").read_bytes(),
                                       type=FunctionRecord)
        except FileNotFoundError:
            raise NotFound(f"no function named {name!r} is deployed") from None

    def records(self) -> list[FunctionRecord]:
        return [self.record(p.stem) for p in sorted(self.functions_dir.glob("*.json"))]

    def save(self, record: FunctionRecord) -> None:
        path = self.functions_dir / f"{record.name}.json"
        tmp = path.with_suffix(".json.tmp")
        with open(tmp, "wb") as f:
            f.write(msgspec.json.format(msgspec.json.encode(record)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(self.functions_dir)

    def delete(self, name: str) -> None:
        """Raises `NotFound` if `name` is not deployed."""
        path = self.functions_dir / f"{name}.json"
        if not path.exists():
            raise NotFound(f"no function named {name!r} is deployed")
        path.unlink()
        _fsync_dir(self.functions_dir)
        shutil.rmtree(self.versions_dir / name, ignore_errors=True)


def new_record(name: str, version: str, source: str, action: str = "deploy") -> FunctionRecord:
    now = time.time()
    return FunctionRecord(name, version, [VersionInfo(version, now, source)],
                          [Event(version, now, action)])


def _read_tree(root: Path, where: str) -> Files:
    """Every file under `root`, by relative path. Raises `VersionTampered` for
    anything that is not a plain file or folder (a link, a FIFO)."""
    files: Files = {}
    for folder, dirs, names in os.walk(root):
        for entry in (*dirs, *names):
            path = Path(folder) / entry
            rel = path.relative_to(root).as_posix()
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                raise VersionTampered(f"{where} {rel!r} is not a plain file or folder")
            if entry in names:
                files[rel] = path.read_bytes()
    return files


def _compare(expected: dict[str, str], actual: dict[str, str], where: str) -> None:
    """Raises `VersionTampered` naming the first file added, removed or changed."""
    for rel in sorted(expected.keys() | actual.keys()):
        if rel not in actual:
            raise VersionTampered(f"{where} {rel!r} was removed after the deploy")
        if rel not in expected:
            raise VersionTampered(f"{where} {rel!r} was added after the deploy")
        if expected[rel] != actual[rel]:
            raise VersionTampered(f"{where} {rel!r} was changed after the deploy "
                                  f"(sha256 {actual[rel][:16]}..., deployed as "
                                  f"{expected[rel][:16]}...)")


def _write_synced(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
