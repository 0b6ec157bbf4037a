"""Versioned, content-addressed deploys persisted in the data dir.

Layout::

    DATA/versions/NAME/VERSION/...   the function's files, never modified
    DATA/functions/NAME.json         which version is current, and the history
    DATA/cache/*.cwasm               compiled machine code (runtime.executors)

A version is the first 16 hex digits of a hash over the package's paths and
contents, so deploying the same files twice is the same version. Records are
written to a temp file, fsynced and renamed: a crash leaves the old record or
the new one, never a torn one.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import time
from pathlib import Path

import msgspec

from edgefn_core.errors import DeployError, NotFound

MAX_PACKAGE_BYTES = 64 << 20
MAX_PACKAGE_FILES = 2000
SKIP_NAMES = frozenset({"__pycache__", "node_modules", "target"})

Files = dict[str, bytes]


class Event(msgspec.Struct):
    version: str
    at: float
    action: str  # "deploy" | "rollback"


class VersionInfo(msgspec.Struct):
    version: str
    created_at: float
    source: str = ""


class FunctionRecord(msgspec.Struct):
    name: str
    current: str
    versions: list[VersionInfo] = []  # oldest first
    history: list[Event] = []

    def previous(self) -> str | None:
        """The version created just before the current one, or None."""
        order = [v.version for v in self.versions]
        i = order.index(self.current) if self.current in order else 0
        return order[i - 1] if i > 0 else None


def version_of(files: Files) -> str:
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return h.hexdigest()[:16]


def pack_dir(directory: str | Path) -> Files:
    """Read a function folder (skipping dotfiles, __pycache__ and the like).

    Raises `DeployError` if it is not a folder or exceeds the package limits.
    """
    root = Path(directory)
    if not root.is_dir():
        raise DeployError(f"{directory}: not a directory")
    files: Files = {}
    total = 0
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(p.startswith(".") or p in SKIP_NAMES for p in rel.parts) or not path.is_file():
            continue
        data = path.read_bytes()
        total += len(data)
        if total > MAX_PACKAGE_BYTES or len(files) >= MAX_PACKAGE_FILES:
            raise DeployError(f"{directory}: package exceeds {MAX_PACKAGE_BYTES >> 20} MiB or "
                              f"{MAX_PACKAGE_FILES} files")
        files[rel.as_posix()] = data
    return files


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
    """Unpack a deploy package. Raises `DeployError` for anything but plain files
    with relative paths, or a package over the limits."""
    files: Files = {}
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as tar:
            for info in tar:
                if info.isdir():
                    continue
                name = info.name
                if not info.isfile() or name.startswith("/") or ".." in name.split("/"):
                    raise DeployError(f"package entry {name!r} is not a plain relative file")
                total += info.size
                if total > MAX_PACKAGE_BYTES or len(files) >= MAX_PACKAGE_FILES:
                    raise DeployError(f"package exceeds {MAX_PACKAGE_BYTES >> 20} MiB or "
                                      f"{MAX_PACKAGE_FILES} files")
                member = tar.extractfile(info)
                assert member is not None
                files[name.removeprefix("./")] = member.read()
    except (tarfile.TarError, EOFError, OSError) as e:
        raise DeployError(f"package is not a valid tar archive: {e}") from None
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

    def write_version(self, name: str, version: str, files: Files) -> bool:
        """Store a version's files; returns False if it was already stored."""
        final = self.version_dir(name, version)
        if final.is_dir():
            return False
        staging = self.versions_dir / name / f".staging-{version}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        for rel, data in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        os.replace(staging, final)
        return True

    def remove_version(self, name: str, version: str) -> None:
        shutil.rmtree(self.version_dir(name, version), ignore_errors=True)

    def record(self, name: str) -> FunctionRecord:
        """Raises `NotFound` if `name` is not deployed."""
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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
