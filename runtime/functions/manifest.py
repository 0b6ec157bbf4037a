"""The function manifest, ``edgefn.toml``, and its validation.

Every error is a `ManifestError` naming the file, the field and what was
expected, e.g. ``hello/edgefn.toml: field `limits.cpu_ms`: expected `int` >= 1``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from msgspec import Meta, Struct, field

from edgefn_core import tomlconf
from edgefn_core.errors import ManifestError

MANIFEST_NAME = "edgefn.toml"
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
HOST_PATTERN = r"^[A-Za-z0-9*]([A-Za-z0-9.-]{0,252})?(:[0-9]{1,5})?$"
ENTRY_SUFFIXES = {"wasm": (".wasm", ".wat"), "python": (".py",)}
MAX_CPU_MS = 60_000
MAX_MEMORY_MB = 1024
MAX_WALL_MS = 300_000


class Route(Struct, forbid_unknown_fields=True, frozen=True, omit_defaults=True):
    """A path prefix, optionally only for one Host (``example.com``, ``*.example.com``)."""

    path: str
    host: str | None = None


class Limits(Struct, forbid_unknown_fields=True, frozen=True):
    cpu_ms: Annotated[int, Meta(ge=1, le=MAX_CPU_MS)] = 50
    memory_mb: Annotated[int, Meta(ge=1, le=MAX_MEMORY_MB)] = 64
    wall_ms: Annotated[int, Meta(ge=1, le=MAX_WALL_MS)] = 5_000
    max_response_mb: Annotated[int, Meta(ge=1, le=256)] = 16


class Pool(Struct, forbid_unknown_fields=True, frozen=True):
    """Python isolates: `min` start with the function, up to `max` under load; each
    is replaced by a fresh one after `recycle_after` requests; `standby` keeps a
    second, warm host process ready to take over if the first crashes."""

    min: Annotated[int, Meta(ge=1, le=32)] = 1
    max: Annotated[int, Meta(ge=1, le=32)] = 4
    recycle_after: Annotated[int, Meta(ge=1)] = 10_000
    standby: bool = True


class Bindings(Struct, forbid_unknown_fields=True, frozen=True):
    """Capabilities a function asks for; anything not declared here is denied.

    The schema is fixed now so manifests stay valid; the host APIs behind each
    kind arrive with kv/ (``kv``, ``vectors``) and gpu_worker/ (``ai``).
    """

    kv: list[Annotated[str, Meta(pattern=NAME_PATTERN)]] = []
    vectors: list[Annotated[str, Meta(pattern=NAME_PATTERN)]] = []
    ai: bool = False


class Manifest(Struct, forbid_unknown_fields=True, frozen=True):
    name: Annotated[str, Meta(pattern=NAME_PATTERN)]
    runtime: Literal["wasm", "python"]
    entry: str
    routes: Annotated[list[str | Route], Meta(min_length=1)]
    abi: Literal["auto", "reactor", "wasi"] = "auto"
    limits: Limits = field(default_factory=Limits)
    env: dict[Annotated[str, Meta(pattern=ENV_NAME_PATTERN)], str] = {}
    bindings: Bindings = field(default_factory=Bindings)
    handler: Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = "handle"
    pool: Pool = field(default_factory=Pool)

    def route_list(self) -> list[Route]:
        return [Route(r) if isinstance(r, str) else r for r in self.routes]


def load(directory: str | Path) -> Manifest:
    """Read and validate ``DIR/edgefn.toml``.

    Raises `ManifestError` (naming the file and the field) if the file is
    missing, is not valid TOML, does not match the schema, or names an entry
    file that does not exist.
    """
    path = Path(directory) / MANIFEST_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ManifestError(str(path),
                            "no such file: every function folder needs an edgefn.toml") from None
    except OSError as e:
        raise ManifestError(str(path), f"cannot read: {e.strerror}") from e
    manifest = parse(raw, str(path))
    _check_entry(manifest, Path(directory), str(path))
    return manifest


def parse(raw: bytes, file: str) -> Manifest:
    """Decode and validate manifest bytes; `file` is only used in messages.

    Raises `ManifestError`.
    """
    manifest = tomlconf.decode(raw, Manifest, file, ManifestError)
    _check_semantics(manifest, file)
    return manifest


def _check_semantics(m: Manifest, file: str) -> None:
    suffixes = ENTRY_SUFFIXES[m.runtime]
    if not m.entry.endswith(suffixes):
        wanted = " or ".join(f"`{s}`" for s in suffixes)
        raise ManifestError(file, f"expected a {wanted} file for runtime `{m.runtime}`", "entry")
    if m.runtime == "python" and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*\.py$", m.entry):
        raise ManifestError(file, "expected a module file at the top of the function folder, "
                            f"named like a Python module, got {m.entry!r}", "entry")
    if m.pool.min > m.pool.max:
        raise ManifestError(file, f"expected `pool.min` <= `pool.max`, got {m.pool.min} > "
                            f"{m.pool.max}", "pool.min")
    if Path(m.entry).is_absolute() or ".." in Path(m.entry).parts:
        raise ManifestError(file, "expected a path inside the function folder", "entry")
    seen: set[Route] = set()
    for i, route in enumerate(m.route_list()):
        where = f"routes[{i}]"
        if not route.path.startswith("/") or any(c in route.path for c in "?# \t\r\n"):
            raise ManifestError(file,
                                f"expected a path prefix starting with `/`, got {route.path!r}",
                                where)
        if route.host is not None and not re.match(HOST_PATTERN, route.host):
            raise ManifestError(file, f"expected a host name, got {route.host!r}", f"{where}.host")
        if route in seen:
            raise ManifestError(file, f"duplicate route {route.path!r}", where)
        seen.add(route)


def _check_entry(m: Manifest, directory: Path, file: str) -> None:
    entry = directory / m.entry
    if not entry.is_file():
        raise ManifestError(file, f"entry file {m.entry!r} does not exist in {directory}", "entry")
